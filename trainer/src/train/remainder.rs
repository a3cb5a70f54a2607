//! The rest of an epoch resumed on another layout ([`Remainder`]); `elastic.rs` deals it.

use std::sync::Arc;

use ddl_loader::dataset::Dataset;
use ddl_loader::progress::EpochProgress;
use ddl_loader::sampler::Sampler;

/// The rest of an epoch resumed on another layout.
pub(super) struct Remainder {
    /// The epoch.
    pub epoch: u64,
    /// The run's step (within the epoch) at which the remainder's first batch is trained.
    pub first_step: u64,
    /// Remainder steps left out at its start: those beyond the new layout's steps per epoch.
    pub skip: usize,
    /// This node's part of the records not served yet.
    pub train_set: Arc<Dataset>,
    /// How this rank's replicas take them.
    pub sampler: Sampler,
    /// What the epoch served before the resume.
    pub before: EpochProgress,
}
