//! What the allgather and reduce-scatter share: which of the two a call is, how a
//! reduce-scatter combines the parts, and the ring's neighbours.

use crate::allreduce::element::add_into;

/// How the parts of a reduce-scatter are combined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduce {
    /// Summed, in f32.
    Sum,
    /// The largest value (a NaN is ignored unless every value is NaN, as `f32::max` does).
    Max,
}

impl Reduce {
    /// `acc[i] = acc[i] op x[i]`.
    pub(crate) fn combine(self, acc: &mut [f32], x: &[f32]) {
        match self {
            Reduce::Sum => add_into(acc, x),
            Reduce::Max => {
                for (a, b) in acc.iter_mut().zip(x) {
                    *a = a.max(*b);
                }
            }
        }
    }
}

/// Which of the two collectives (for the cost model).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardedOp {
    /// [`Sharded::all_gather`](super::Sharded::all_gather).
    AllGather,
    /// [`Sharded::reduce_scatter`](super::Sharded::reduce_scatter).
    ReduceScatter,
}

/// The left and right neighbours of rank `me` on a ring of `p`.
pub(crate) fn ring_neighbours(me: usize, p: usize) -> (usize, usize) {
    ((me + p - 1) % p, (me + 1) % p)
}
