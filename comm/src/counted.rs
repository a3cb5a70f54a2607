//! A transport that counts the bytes its rank sends: the traffic a job's collectives put on the
//! network, measured where it leaves the rank, to hold against what `ddl-plan` predicts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::error::{CommError, Result};
use crate::transport::{Op, Transport};

/// `inner` with a count of the bytes this rank sends through it and through every group split
/// from it (the hierarchical allreduce's groups included). What moves without messages is not
/// counted: the shared-memory algorithms (`shm`, the node stage of `hierarchical`) and
/// MPI_Allreduce (`mpi`), whose bytes MPI moves itself.
pub struct Counted {
    inner: Arc<dyn Transport>,
    sent: Arc<AtomicU64>,
}

impl Counted {
    /// Counts what this rank sends through `inner`, from zero.
    pub fn new(inner: Arc<dyn Transport>) -> Counted {
        Counted {
            inner,
            sent: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Bytes sent so far.
    pub fn bytes_sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// The counter itself, to read after the transport has been handed on.
    pub fn counter(&self) -> Arc<AtomicU64> {
        self.sent.clone()
    }

    fn add(&self, bytes: usize) {
        self.sent.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

impl Transport for Counted {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn send(&self, to: usize, tag: u32, data: &[u8]) -> Result<()> {
        self.inner.send(to, tag, data)?;
        self.add(data.len());
        Ok(())
    }
    fn recv(&self, from: usize, tag: u32, buf: &mut [u8]) -> Result<()> {
        self.inner.recv(from, tag, buf)
    }
    fn exchange(&self, ops: &mut [Op<'_>]) -> Result<()> {
        let sent: usize = ops
            .iter()
            .map(|op| match op {
                Op::Send { data, .. } => data.len(),
                Op::Recv { .. } | Op::RecvUpTo { .. } => 0,
            })
            .sum();
        self.inner.exchange(ops)?;
        self.add(sent);
        Ok(())
    }
    fn split(&self, color: usize, key: usize) -> Result<Box<dyn Transport>> {
        Ok(Box::new(Counted {
            inner: Arc::from(self.inner.split(color, key)?),
            sent: self.sent.clone(),
        }))
    }
    fn barrier(&self) -> Result<()> {
        self.inner.barrier()
    }
    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }
    fn set_timeout(&self, timeout: Duration) {
        self.inner.set_timeout(timeout)
    }
    fn has_native_allreduce(&self) -> bool {
        self.inner.has_native_allreduce()
    }
    fn native_allreduce_f32(&self, buf: &mut [f32]) -> Result<()> {
        self.inner.native_allreduce_f32(buf)
    }
    fn native_allgather_u64(&self, word: u64, all: &mut [u64]) -> Result<()> {
        self.inner.native_allgather_u64(word, all)
    }
    fn announce_failure(&self, reason: &str) {
        self.inner.announce_failure(reason)
    }
    fn failure(&self, op: &'static str) -> Option<CommError> {
        self.inner.failure(op)
    }
}
