//! The collective operations the trainer needs across ranks: the gradient allreduce (through
//! ddl-comm's [`Allreducer`], any algorithm) and a few exact control-plane operations
//! (broadcast and gather of bytes from/to rank 0) built on the [`Transport`]'s send/recv.

use std::sync::Arc;

use ddl_comm::{Algorithm, Allreducer, CommError, Topology, Transport};

use crate::error::{Result, TrainError};

/// Tag of the trainer's control-plane messages (distinct from the allreduce tags).
const CONTROL_TAG: u32 = 32000;
/// Largest single message of the control plane.
const MAX_MESSAGE: usize = 1 << 28;

/// Collectives over the ranks of a training job.
pub struct Collective {
    transport: Arc<dyn Transport>,
    allreducer: Allreducer,
}

impl Collective {
    /// Wraps `transport`, reducing gradients with `algorithm` (`Auto` consults the cost model
    /// with `topology`).
    pub fn new(
        transport: Arc<dyn Transport>,
        algorithm: Algorithm,
        topology: Topology,
    ) -> Result<Collective> {
        let allreducer = Allreducer::new(transport.clone(), algorithm, topology)?;
        Ok(Collective {
            transport,
            allreducer,
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.transport.rank()
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.transport.size()
    }

    /// Sums `buf` over all ranks in place (not averaged).
    pub fn allreduce_sum(&self, buf: &mut [f32]) -> Result<()> {
        if self.size() > 1 && !buf.is_empty() {
            self.allreducer.allreduce_f32(buf, false)?;
        }
        Ok(())
    }

    fn send_all(&self, to: usize, data: &[u8]) -> Result<()> {
        self.transport
            .send(to, CONTROL_TAG, &(data.len() as u64).to_le_bytes())?;
        for chunk in data.chunks(MAX_MESSAGE) {
            self.transport.send(to, CONTROL_TAG, chunk)?;
        }
        Ok(())
    }

    fn recv_all(&self, from: usize) -> Result<Vec<u8>> {
        let mut len = [0u8; 8];
        self.transport.recv(from, CONTROL_TAG, &mut len)?;
        let mut data = vec![0u8; u64::from_le_bytes(len) as usize];
        for chunk in data.chunks_mut(MAX_MESSAGE) {
            self.transport.recv(from, CONTROL_TAG, chunk)?;
        }
        Ok(data)
    }

    /// Rank 0's `data` on every rank (bit-exact). Other ranks' argument is ignored.
    pub fn broadcast_bytes(&self, data: Vec<u8>) -> Result<Vec<u8>> {
        if self.size() == 1 {
            return Ok(data);
        }
        if self.rank() == 0 {
            for r in 1..self.size() {
                self.send_all(r, &data)?;
            }
            Ok(data)
        } else {
            self.recv_all(0)
        }
    }

    /// Every rank's `data`, in rank order, on rank 0 (`None` on the others).
    pub fn gather_bytes(&self, data: Vec<u8>) -> Result<Option<Vec<Vec<u8>>>> {
        if self.rank() == 0 {
            let mut out = vec![data];
            for r in 1..self.size() {
                out.push(self.recv_all(r)?);
            }
            Ok(Some(out))
        } else {
            self.send_all(0, &data)?;
            Ok(None)
        }
    }

    /// Every rank's `data` on every rank, in rank order.
    pub fn allgather_bytes(&self, data: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        // Rank 0 packs the parts as (u64 length, bytes)* and broadcasts the package.
        let packed = match self.gather_bytes(data)? {
            Some(parts) => {
                let mut out = Vec::new();
                for p in parts {
                    out.extend_from_slice(&(p.len() as u64).to_le_bytes());
                    out.extend_from_slice(&p);
                }
                out
            }
            None => Vec::new(),
        };
        let packed = self.broadcast_bytes(packed)?;
        let mut parts = Vec::with_capacity(self.size());
        let mut pos = 0;
        while pos + 8 <= packed.len() {
            let len =
                u64::from_le_bytes(packed[pos..pos + 8].try_into().unwrap_or_default()) as usize;
            let end = (pos + 8).saturating_add(len).min(packed.len());
            parts.push(packed[pos + 8..end].to_vec());
            pos = end;
        }
        if parts.len() != self.size() {
            return Err(TrainError::Comm(CommError::InvalidArgument(format!(
                "allgather: rank 0 sent {} parts for {} ranks",
                parts.len(),
                self.size()
            ))));
        }
        Ok(parts)
    }

    /// Blocks until every rank arrives.
    pub fn barrier(&self) -> Result<()> {
        self.transport.barrier()?;
        Ok(())
    }
}
