//! The collective operations the trainer needs across ranks: the gradient allreduce (through
//! ddl-comm's [`Allreducer`], any algorithm) and ddl-comm's control-plane collectives of bytes
//! ([`ddl_comm::collective`]) over the same transport.

use std::sync::Arc;

use ddl_comm::{collective, Algorithm, Allreducer, CostModel, Topology, Transport};

use crate::error::Result;

/// Collectives over the ranks of a training job.
pub struct Collective {
    transport: Arc<dyn Transport>,
    allreducer: Allreducer,
}

impl Collective {
    /// Wraps `transport`, reducing gradients with `algorithm` (`Auto` consults `model` with
    /// `topology`).
    pub fn new(
        transport: Arc<dyn Transport>,
        algorithm: Algorithm,
        topology: Topology,
        model: CostModel,
    ) -> Result<Collective> {
        let allreducer = Allreducer::with_model(transport.clone(), algorithm, topology, model)?;
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

    /// Rank 0's `data` on every rank (bit-exact). Other ranks' argument is ignored.
    pub fn broadcast_bytes(&self, data: Vec<u8>) -> Result<Vec<u8>> {
        Ok(collective::broadcast_bytes(&*self.transport, data)?)
    }

    /// Every rank's `data`, in rank order, on rank 0 (`None` on the others).
    pub fn gather_bytes(&self, data: Vec<u8>) -> Result<Option<Vec<Vec<u8>>>> {
        Ok(collective::gather_bytes(&*self.transport, data)?)
    }

    /// Every rank's `data` on every rank, in rank order.
    pub fn allgather_bytes(&self, data: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        Ok(collective::allgather_bytes(&*self.transport, data)?)
    }

    /// Blocks until every rank arrives.
    pub fn barrier(&self) -> Result<()> {
        self.transport.barrier()?;
        Ok(())
    }
}
