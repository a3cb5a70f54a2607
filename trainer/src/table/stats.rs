//! What a table reports (per step, per evaluation) and the replica state it saves.

use std::time::Duration;

/// Per-step measurements of one rank.
#[derive(Clone, Debug, Default)]
pub struct StepStats {
    /// Mean training loss over the rank's replicas (unscaled).
    pub loss: f64,
    /// Images processed by the rank.
    pub images: usize,
    /// Mean time replicas were blocked on their loader queue.
    pub data_wait: Duration,
    /// Mean time the replicas' forward pass waited for the previous step's buckets to be
    /// reduced (`priority` order; zero under `fifo`, whose step waits for all of them at its
    /// end).
    pub forward_wait: Duration,
    /// Mean forward + backward time.
    pub compute: Duration,
    /// Time the communication thread spent in allreduce calls (under `priority`, the
    /// previous step's rest and the negotiations included).
    pub allreduce: Duration,
    /// Wall time of the step.
    pub wall: Duration,
    /// Whether the update was skipped (fp16 overflow).
    pub skipped: bool,
    /// Records the loader skipped as unreadable in these batches.
    pub bad_records: usize,
}

/// Sums of one evaluation pass of replica 0.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EvalSums {
    /// Sum of the cross-entropy losses.
    pub loss: f64,
    /// Correct top-1 predictions.
    pub top1: f64,
    /// Correct top-5 predictions.
    pub top5: f64,
    /// Images evaluated.
    pub count: f64,
    /// Records left out as bad (never scored through a stand-in).
    pub skipped: f64,
}

/// Host copy of everything a replica holds, for checkpoints.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplicaState {
    /// Parameters in [`Layout::params`] order.
    ///
    /// [`Layout::params`]: super::buckets::Layout::params
    pub params: Vec<Vec<f32>>,
    /// Momentum buffers, same order.
    pub momentum: Vec<Vec<f32>>,
    /// BatchNorm buffers in [`Layout::buffers`] order.
    ///
    /// [`Layout::buffers`]: super::buckets::Layout::buffers
    pub buffers: Vec<Vec<f32>>,
    /// Under `head_parallel`: this replica's slice of every head parameter
    /// ([`Layout::left_out`] order; every replica's, as the slices differ).
    ///
    /// [`Layout::left_out`]: super::buckets::Layout::left_out
    pub head: Vec<Vec<f32>>,
    /// The momentum of the slice, same order.
    pub head_momentum: Vec<Vec<f32>>,
}
