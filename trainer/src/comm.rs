//! The collective operations the trainer needs across ranks: the gradient allreduce (through
//! ddl-comm's [`Allreducer`], any algorithm), the allgather, reduce-scatter and `max`
//! allreduce of a head split over the replicas (ddl-comm's [`Sharded`]) and ddl-comm's
//! control-plane collectives of bytes ([`ddl_comm::collective`]) over the same transport,
//! which counts the bytes this rank sends ([`Counted`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ddl_comm::{
    collective, Algorithm, Allreducer, Choice, CostModel, Counted, Parts, Reduce, ShardAlgorithm,
    Sharded, Topology, Transport,
};

use crate::error::Result;
use crate::table::Comm;

/// The communicator of a training job's ranks: its gradient allreduce, the head's sharded
/// collectives and the control plane, over one transport that counts the bytes sent.
pub struct Communicator {
    transport: Arc<dyn Transport>,
    allreducer: Allreducer,
    sharded: Sharded,
    sent: Arc<AtomicU64>,
}

impl Communicator {
    /// Wraps `transport`, reducing gradients with `algorithm` and running allgathers and
    /// reduce-scatters with `sharded` (`auto` consults `model` with `topology`).
    pub fn new(
        transport: Arc<dyn Transport>,
        algorithm: Algorithm,
        sharded: ShardAlgorithm,
        topology: Topology,
        model: CostModel,
    ) -> Result<Communicator> {
        let counted = Counted::new(transport);
        let sent = counted.counter();
        let transport: Arc<dyn Transport> = Arc::new(counted);
        let allreducer =
            Allreducer::with_model(transport.clone(), algorithm, topology, model.clone())?;
        let sharded = Sharded::new(transport.clone(), sharded, topology, model)?;
        Ok(Communicator {
            transport,
            allreducer,
            sharded,
            sent,
        })
    }

    /// Whether `auto` tunes itself on the first calls of each buffer size
    /// ([`Allreducer::tunes`]).
    pub fn tunes(&self) -> bool {
        self.allreducer.tunes()
    }

    /// The allreduce's online tuning choices made since the last call, each once
    /// ([`Allreducer::take_tuned`]).
    pub fn take_tuned(&self) -> Vec<Choice> {
        self.allreducer.take_tuned()
    }

    /// The cost model with what the online tuning measured ([`Allreducer::tuned_model`]).
    pub fn tuned_model(&self) -> CostModel {
        self.allreducer.tuned_model()
    }

    /// Bytes this rank has sent to the others so far, in messages (see [`Counted`]).
    pub fn bytes_sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
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

    /// Tells the other ranks that this rank failed with `e`
    /// ([`Transport::announce_failure`]), unless `e` is a stop that every rank makes
    /// together (a stop signal).
    pub fn announce_failure(&self, e: &crate::error::TrainError) {
        announce_failure(&*self.transport, e);
    }
}

/// [`Communicator::announce_failure`] over `transport`.
pub(crate) fn announce_failure(transport: &dyn Transport, e: &crate::error::TrainError) {
    if !matches!(e, crate::error::TrainError::Preempted { .. }) {
        transport.announce_failure(&e.to_string());
    }
}

impl Comm for Communicator {
    fn allreduce_sum(&self, buf: &mut [f32]) -> Result<()> {
        Communicator::allreduce_sum(self, buf)
    }

    fn allreduce_max(&self, buf: &mut [f32]) -> Result<()> {
        Ok(self.sharded.allreduce_max(buf)?)
    }

    fn all_gather(&self, buf: &mut [f32], parts: &Parts) -> Result<()> {
        Ok(self.sharded.all_gather(buf, parts)?)
    }

    fn reduce_scatter(&self, buf: &mut [f32], parts: &Parts) -> Result<()> {
        Ok(self.sharded.reduce_scatter(buf, parts, Reduce::Sum)?)
    }
}
