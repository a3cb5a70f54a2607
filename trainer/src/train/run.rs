//! A rank's run ([`Run`]): everything its steps, evaluations and checkpoints read and
//! change; the files beside it implement its parts. And what a finished run reports.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use ddl_loader::dataset::Dataset;
use ddl_loader::pipeline::BadRecord;
use ddl_loader::sampler::Sampler;

use super::eval_at::EvalAt;
use super::remainder::Remainder;
use super::run_plan::Plan;
use super::stop_budget::StopBudget;
use crate::comm::Communicator;
use crate::config::TrainConfig;
use crate::metrics::{EpochRecord, MetricsWriter};
use crate::schedule::Schedule;
use crate::table::Table;
use crate::trace_records::RecordTrace;

/// What a finished run reports.
#[derive(Clone, Debug, Default)]
pub struct TrainSummary {
    /// Global steps completed (including those before a resume).
    pub global_steps: u64,
    /// Steps run by this invocation.
    pub steps_run: u64,
    /// Epoch records of this invocation.
    pub epochs: Vec<EpochRecord>,
    /// Checkpoint this run resumed from.
    pub resumed_from: Option<PathBuf>,
    /// Warnings (damaged checkpoints skipped, ...).
    pub warnings: Vec<String>,
    /// Bad records met in training (all ranks; each time one was met).
    pub bad_records_train: u64,
    /// Val records left out as bad (all ranks, all evaluations).
    pub bad_records_eval: u64,
    /// The distinct bad records of all ranks (on rank 0; empty on the others).
    pub bad_records: Vec<BadRecord>,
    /// crc32c of replica 0's parameters at the end.
    pub param_checksum: u32,
}

pub(super) struct Run<'a> {
    pub(super) cfg: &'a TrainConfig,
    pub(super) plan: Plan,
    pub(super) comm: Communicator,
    pub(super) table: Table,
    pub(super) schedule: Schedule,
    pub(super) train_set: Arc<Dataset>,
    pub(super) sampler: Sampler,
    pub(super) val_set: Option<Arc<Dataset>>,
    /// The exchange of train records between the nodes, which gives each epoch's `train_set`.
    pub(super) exchange: Option<ddl_exchange::Exchange>,
    /// The rest of an epoch resumed on another layout, until that epoch ends.
    pub(super) remainder: Option<Remainder>,
    pub(super) metrics: Option<MetricsWriter>,
    /// The record trace of this rank (`trace_records`).
    pub(super) trace: Option<RecordTrace>,
    pub(super) summary: TrainSummary,
    pub(super) bar: Option<indicatif::ProgressBar>,
    /// Bad records this rank has met (shard file, record).
    pub(super) bad_seen: HashSet<(PathBuf, usize)>,
    /// Those of them rank 0 has not printed yet.
    pub(super) bad_unpublished: Vec<(BadRecordUse, BadRecord)>,
    /// Global step of the last checkpoint written.
    pub(super) last_checkpoint: Option<u64>,
    /// Whether a stop fits the scheduler's grace (with a checkpoint directory, under one).
    pub(super) budget: Option<StopBudget>,
    /// The last evaluation's accuracies and the step of the weights it measured.
    pub(super) last_eval: Option<EvalAt>,
    /// `num_batches_tracked` of each BatchNorm in the `init_from` file (empty from scratch):
    /// an export adds the global step to it.
    pub(super) batches_tracked_base: std::collections::BTreeMap<String, i64>,
}

/// Where a run is: the epoch, the step within it and the global step.
#[derive(Clone, Copy, Debug)]
pub(super) struct Position {
    pub(super) epoch: u64,
    pub(super) step: u64,
    pub(super) global: u64,
}

/// Where a bad record was met.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum BadRecordUse {
    Train,
    Eval,
}
