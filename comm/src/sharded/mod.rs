//! The collectives of a buffer shared out among the ranks ([`Parts`]): allgather (every part to
//! every rank) and reduce-scatter (each part summed, or maxed, over the ranks, onto its rank),
//! and from the two an allreduce with `max`. They carry what a classifier head split by class
//! over the ranks exchanges each step (the features, the softmax's per-sample maximum, the
//! gradient of the features), where the allreduce carries gradients.
//!
//! Each collective is a small trait with one file ([`allgather`], [`reduce_scatter`]) holding
//! it and its ring; [`node_memory`] implements both over a node's shared memory. [`Sharded`] is the
//! entry point: one per transport, it picks the algorithm per call ([`ShardAlgorithm`]; `auto`
//! asks the [`CostModel`]) and keeps the scratch buffers and the shared region.

mod allgather;
mod cost;
pub mod node_memory;
mod ops;
mod reduce_scatter;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::Mutex;

use crate::cost::CostModel;
use crate::error::{CommError, Result};
pub use crate::parts::Parts;
use crate::topology::Topology;
use crate::transport::Transport;
use allgather::{Allgather, RingAllgather};
use node_memory::ShmSharded;
pub use ops::{Reduce, ShardedOp};
use reduce_scatter::{ReduceScatter, RingReduceScatter};

/// An algorithm of the allgather and reduce-scatter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShardAlgorithm {
    /// The ring: `p - 1` steps, each rank sending one part per step.
    Ring,
    /// Node shared memory in chunks of `chunk_bytes` (all ranks on one node only).
    Shm {
        /// Chunk of the buffer per round, in bytes.
        chunk_bytes: usize,
    },
    /// Chosen per call by the cost model.
    Auto,
}

impl ShardAlgorithm {
    /// Names accepted by `FromStr`.
    pub const NAMES: [&'static str; 3] = ["ring", "shm", "auto"];

    /// The shared-memory algorithm with its default chunk.
    pub const SHM: ShardAlgorithm = ShardAlgorithm::Shm {
        chunk_bytes: node_memory::ShmSharded::DEFAULT_CHUNK_BYTES,
    };
}

impl fmt::Display for ShardAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShardAlgorithm::Ring => f.write_str("ring"),
            ShardAlgorithm::Shm { chunk_bytes } if *self != ShardAlgorithm::SHM => {
                write!(f, "shm:{chunk_bytes}")
            }
            ShardAlgorithm::Shm { .. } => f.write_str("shm"),
            ShardAlgorithm::Auto => f.write_str("auto"),
        }
    }
}

impl FromStr for ShardAlgorithm {
    type Err = CommError;

    /// Parses `ring`, `auto` and `shm[:CHUNK_BYTES]`.
    fn from_str(s: &str) -> Result<Self> {
        let mut it = s.trim().splitn(2, ':');
        match (
            it.next().unwrap_or("").to_ascii_lowercase().as_str(),
            it.next(),
        ) {
            ("ring", None) => Ok(ShardAlgorithm::Ring),
            ("auto", None) => Ok(ShardAlgorithm::Auto),
            ("shm", None) => Ok(ShardAlgorithm::SHM),
            ("shm", Some(c)) => match c.parse::<usize>() {
                Ok(chunk_bytes) if chunk_bytes >= 4 => Ok(ShardAlgorithm::Shm { chunk_bytes }),
                _ => Err(CommError::InvalidArgument(format!(
                    "shm: chunk bytes {c:?} is not an integer of at least 4"
                ))),
            },
            _ => Err(CommError::InvalidArgument(format!(
                "unknown allgather/reduce-scatter algorithm {s:?} (expected one of {})",
                ShardAlgorithm::NAMES.join(", ")
            ))),
        }
    }
}

/// Reusable state: the ring's scratch and the shared region once probed.
#[derive(Default)]
struct Scratch {
    ring: RingReduceScatter,
    /// `None` before the first shared-memory call, then whether the region exists.
    shm: Option<Option<ShmSharded>>,
}

/// Allgather and reduce-scatter over one transport; calls are serialised.
///
/// Construction is local, but every rank must build its `Sharded` with the same algorithm,
/// topology and cost model, and make the same calls in the same order with the same parts.
/// Every element is combined by one rank in a fixed order and copied, so the results do not
/// depend on timing and an allgather leaves every rank bitwise the same buffer.
pub struct Sharded {
    transport: Arc<dyn Transport>,
    algorithm: ShardAlgorithm,
    topology: Topology,
    model: CostModel,
    scratch: Mutex<Scratch>,
}

impl fmt::Debug for Sharded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sharded")
            .field("rank", &self.transport.rank())
            .field("size", &self.transport.size())
            .field("algorithm", &self.algorithm)
            .finish()
    }
}

impl Sharded {
    /// The collectives over `transport` with `algorithm`; `auto` chooses with `model` for the
    /// layout `topology`. Fails for `shm` across nodes or a topology of another size.
    pub fn new(
        transport: Arc<dyn Transport>,
        algorithm: ShardAlgorithm,
        topology: Topology,
        model: CostModel,
    ) -> Result<Sharded> {
        topology.check_ranks(transport.size())?;
        if matches!(algorithm, ShardAlgorithm::Shm { .. }) && topology.nodes > 1 {
            return Err(CommError::Unsupported(format!(
                "shm allgather/reduce-scatter needs every rank on one node; the topology has {} nodes",
                topology.nodes
            )));
        }
        Ok(Sharded {
            transport,
            algorithm,
            topology,
            model,
            scratch: Mutex::new(Scratch::default()),
        })
    }

    /// The configured algorithm.
    pub fn algorithm(&self) -> &ShardAlgorithm {
        &self.algorithm
    }

    /// The algorithm a call of `op` on `bytes` of f32 runs: `auto` resolved by the cost model
    /// (`shm` only where the ranks share one node's memory, which the first call finds out).
    pub fn resolve(&self, op: ShardedOp, bytes: usize) -> ShardAlgorithm {
        match &self.algorithm {
            ShardAlgorithm::Auto => {
                let guard = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
                let shared = !matches!(guard.shm, Some(None)) && self.topology.nodes == 1;
                self.model.choose_sharded(op, bytes, self.topology, shared)
            }
            other => other.clone(),
        }
    }

    /// Fills every other rank's part of `buf` with that rank's part; this rank's part is its
    /// input. `parts` cuts `buf` among the ranks (the same on every rank).
    pub fn all_gather(&self, buf: &mut [f32], parts: &Parts) -> Result<()> {
        let t = &*self.transport;
        parts.check("allgather", buf.len(), t.size())?;
        if t.size() == 1 || buf.is_empty() {
            return Ok(());
        }
        let algorithm = self.resolve(ShardedOp::AllGather, 4 * buf.len());
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        match self.shared(&mut scratch, &algorithm)? {
            Some(shm) => shm.all_gather(t, buf, parts),
            None => RingAllgather.all_gather(t, buf, parts),
        }
    }

    /// Leaves in this rank's part of `buf` that part combined with `op` over all ranks; the
    /// other parts are left undefined. `parts` cuts `buf` among the ranks (the same on every
    /// rank).
    pub fn reduce_scatter(&self, buf: &mut [f32], parts: &Parts, op: Reduce) -> Result<()> {
        let t = &*self.transport;
        parts.check("reduce-scatter", buf.len(), t.size())?;
        if t.size() == 1 || buf.is_empty() {
            return Ok(());
        }
        let algorithm = self.resolve(ShardedOp::ReduceScatter, 4 * buf.len());
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        match self.shared(&mut scratch, &algorithm)? {
            Some(shm) => shm.reduce_scatter(t, buf, parts, op),
            None => scratch.ring.reduce_scatter(t, buf, parts, op),
        }
    }

    /// The element-wise maximum of `buf` over all ranks, in place, bitwise the same on every
    /// rank: a reduce-scatter with [`Reduce::Max`] over even parts, then an allgather.
    pub fn allreduce_max(&self, buf: &mut [f32]) -> Result<()> {
        let parts = Parts::even(buf.len(), self.transport.size());
        self.reduce_scatter(buf, &parts, Reduce::Max)?;
        self.all_gather(buf, &parts)
    }

    /// The shared region when `algorithm` is `shm` (probed, collectively, on first use):
    /// `None` for the ring, or for `auto` where the ranks do not share memory.
    fn shared<'a>(
        &self,
        scratch: &'a mut Scratch,
        algorithm: &ShardAlgorithm,
    ) -> Result<Option<&'a mut ShmSharded>> {
        let ShardAlgorithm::Shm { chunk_bytes } = *algorithm else {
            return Ok(None);
        };
        if scratch.shm.is_none() {
            scratch.shm = Some(ShmSharded::create(&*self.transport, chunk_bytes)?);
        }
        match scratch.shm.as_mut().and_then(Option::as_mut) {
            Some(shm) => Ok(Some(shm)),
            None if self.algorithm == ShardAlgorithm::Auto => Ok(None),
            None => Err(CommError::Unsupported(
                "the shm allgather/reduce-scatter needs every rank on one node, with a writable /dev/shm".into(),
            )),
        }
    }
}
