//! What a table is given to work with: the collectives across ranks ([`Comm`]) and the
//! batch sources of its replicas.

use ddl_comm::Parts;
use ddl_loader::pipeline::Batch;

use crate::error::Result;

/// The collectives a table needs across the ranks, run on the thread that calls
/// [`Table::step`] and [`Table::evaluate`] (the communication thread). Every rank makes the
/// same calls in the same order.
///
/// [`Table::step`]: super::Table::step
/// [`Table::evaluate`]: super::Table::evaluate
pub trait Comm {
    /// Sums `buf` over the ranks, in place.
    fn allreduce_sum(&self, buf: &mut [f32]) -> Result<()>;
    /// The element-wise maximum of `buf` over the ranks, in place.
    fn allreduce_max(&self, buf: &mut [f32]) -> Result<()>;
    /// Every rank's part of `buf` to every rank.
    fn all_gather(&self, buf: &mut [f32], parts: &Parts) -> Result<()>;
    /// This rank's part of `buf` summed over the ranks (the other parts left undefined).
    fn reduce_scatter(&self, buf: &mut [f32], parts: &Parts) -> Result<()>;
}

/// A source of batches for one replica (the loader's per-replica queue).
pub type BatchIter = Box<dyn Iterator<Item = ddl_loader::Result<Batch>> + Send>;

/// How many leading images of an evaluation batch count (the rest is padding).
pub type ValidCount = Box<dyn Fn(&Batch) -> usize + Send>;
