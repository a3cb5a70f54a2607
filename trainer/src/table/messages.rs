//! What the communication thread and the replica threads tell each other: commands, replies
//! and the state they share for the bucketed tree sum.

use std::sync::Arc;
use std::time::Duration;

use tch::Tensor;

use crate::device::Event;
use crate::error::TrainError;

use super::comm::{BatchIter, ValidCount};
use super::head::request::Request;
use super::stats::{EvalSums, ReplicaState};

pub(crate) enum Cmd {
    Data(BatchIter),
    Synthetic,
    Step(StepCmd),
    Eval(BatchIter, ValidCount),
    GetState {
        full: bool,
    },
    SetState(Box<ReplicaState>),
    Checksum,
    /// Apply the updates still pending from the last step (`priority` order).
    Flush,
    Stop,
}

/// One training step.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StepCmd {
    pub(crate) lr: f64,
    /// Bucket sequence number before this step's first bucket.
    pub(crate) seq: u64,
    /// The fp16 loss scale (1 otherwise).
    pub(crate) loss_scale: f64,
    /// What the summed gradient is multiplied by: 1 / (replicas of the job x loss scale).
    pub(crate) inv: f64,
}

/// What a replica reports at the end of its part of a step.
pub(crate) struct ReplicaStep {
    pub(crate) loss: f64,
    pub(crate) images: usize,
    pub(crate) data_wait: Duration,
    /// Time the forward pass waited for the previous step's reduced buckets (`priority`).
    pub(crate) forward_wait: Duration,
    pub(crate) compute: Duration,
    pub(crate) bad: usize,
    /// Whether the update was skipped (fp16 overflow).
    pub(crate) skipped: bool,
}

pub(crate) enum Msg {
    /// Bucket k's node sum is in its host buffer once the event completes.
    Ready(usize, Event),
    /// A head exchange to run across the ranks (`head_parallel`).
    Head(Request),
    /// A replica's backward is done: every bucket of the step is handed over.
    StepDone(ReplicaStep),
    Eval(EvalSums),
    State(Box<ReplicaState>),
    Checksum(u32),
    /// The pending updates are applied.
    Flushed,
    Failed(usize, TrainError),
}

/// Host memory of one bucket, which the allreduce across ranks runs on: pinned for GPU
/// replicas, so that the copies to and from it run on the device's own.
pub(crate) struct HostBucket(Tensor);

impl HostBucket {
    pub(crate) fn new(t: Tensor) -> HostBucket {
        assert!(
            t.is_contiguous() && t.kind() == tch::Kind::Float && t.device() == tch::Device::Cpu
        );
        HostBucket(t)
    }

    pub(crate) fn tensor(&self) -> &Tensor {
        &self.0
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [f32] {
        // SAFETY: a contiguous f32 CPU tensor (checked in `new`) owned by `self`, borrowed
        // mutably: the slice covers exactly its elements. Device copies touch it only while
        // the protocol of [`Shared`] keeps the host off it.
        unsafe { std::slice::from_raw_parts_mut(self.0.data_ptr() as *mut f32, self.0.numel()) }
    }
}

/// Where the reduction of one bucket stands.
#[derive(Clone)]
pub(crate) struct Reduced {
    /// The bucket sequence number of its last reduction across ranks (a step's first bucket
    /// is its `seq + 1`, its k-th `seq + k + 1`).
    pub(crate) seq: u64,
    /// Whether the step it belongs to is skipped (fp16 overflow).
    pub(crate) skip: bool,
    /// With one rank: after replica 0 scaled the bucket, which the others copy.
    pub(crate) event: Arc<Event>,
}
