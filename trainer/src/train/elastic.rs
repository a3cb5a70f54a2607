//! Exact elastic resume: a checkpoint written mid-epoch keeps the set of records the epoch
//! has served over the whole job ([`EpochProgress`], independent of the layout). A run
//! resumed from it on another number of nodes, ranks or replicas deals the records not yet
//! served over its own nodes ([`elastic::remainder`]) and serves them, each once (the Drop
//! tail's rule aside), in the rest of the epoch: a [`Remainder`]. Each node reads its part
//! from the shard directory (a lost node's shards included); the epochs after it are the new
//! layout's own.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use ddl_loader::dataset::{Dataset, OpenOptions, Residency};
use ddl_loader::elastic;
use ddl_loader::progress::EpochProgress;
use ddl_loader::sampler::Sampler;

use super::checkpoints::{bytes_to_u64s, u64s_to_bytes};
use super::remainder::Remainder;
use super::run::Run;
use crate::config::TrainConfig;
use crate::error::{Result, TrainError};

impl Remainder {
    /// The remainder of `before`'s epoch for node `residency.node` of this run, whose full
    /// epochs take `steps_per_epoch` steps and whose sampler is `sampler`'s; `None` when no
    /// full step is left to take (the epoch then ends where it is).
    pub(super) fn new(
        cfg: &TrainConfig,
        residency: Residency,
        sampler: &Sampler,
        before: EpochProgress,
        steps_per_epoch: u64,
    ) -> Result<Option<Remainder>> {
        // The sampler's seed is the run's: the records are dealt from it.
        let Some(part) = elastic::remainder(
            &cfg.data,
            "train",
            &before,
            residency,
            sampler.config().clone(),
            &OpenOptions::default(),
        )?
        else {
            return Ok(None);
        };
        let steps = part.sampler.steps_per_epoch() as u64;
        Ok(Some(Remainder {
            epoch: before.epoch,
            first_step: steps_per_epoch.saturating_sub(steps),
            skip: steps.saturating_sub(steps_per_epoch) as usize,
            train_set: Arc::new(part.dataset),
            sampler: part.sampler,
            before,
        }))
    }

    /// The remainder's sampler step at the run's step `step` of the epoch.
    pub(super) fn sampler_step(&self, step: u64) -> usize {
        (step - self.first_step) as usize + self.skip
    }

    /// Records the remainder has not served and never will (the Drop tail, and the steps a
    /// shorter epoch of the new layout leaves out).
    pub(super) fn left_out(&self, nodes: usize) -> u64 {
        let left = self.before.records - self.before.served();
        let per_node = self.sampler.steps_per_epoch() - self.skip;
        left.saturating_sub((per_node * self.sampler_streams_batch() * nodes) as u64)
    }

    fn sampler_streams_batch(&self) -> usize {
        let c = self.sampler.config();
        c.ranks_in_node * c.replicas * c.batch_per_replica
    }
}

/// Global ids of the records `sampler` gives this rank's replicas over `steps` of `epoch`.
pub(super) fn served_ids(
    dataset: &Dataset,
    sampler: &Sampler,
    epoch: u64,
    steps: Range<usize>,
) -> Vec<u64> {
    let mut ids = Vec::new();
    let mut batch = Vec::new();
    for step in steps {
        for replica in 0..sampler.config().replicas {
            sampler.batch_into(epoch, step, replica, &mut batch);
            ids.extend(batch.iter().map(|&i| dataset.global_id(i)));
        }
    }
    ids
}

impl Run<'_> {
    /// The records `epoch` has served over the whole job up to its step `step`, on rank 0
    /// (`None` on the others, and at an epoch's start or end). Collective.
    pub(super) fn progress(&self, epoch: u64, step: u64) -> Result<Option<EpochProgress>> {
        if step == 0 || step >= self.schedule.steps_per_epoch {
            return Ok(None);
        }
        let remainder = self.remainder.as_ref().filter(|r| r.epoch == epoch);
        let mine = match remainder {
            Some(r) => served_ids(
                &r.train_set,
                &r.sampler,
                epoch,
                r.skip..r.sampler_step(step),
            ),
            None => served_ids(&self.train_set, &self.sampler, epoch, 0..step as usize),
        };
        let Some(all) = self.comm.gather_bytes(u64s_to_bytes(&mine))? else {
            return Ok(None);
        };
        let records = self.plan.manifest.split(&self.cfg.data, "train")?.records;
        let mut progress = match remainder {
            Some(r) => r.before.clone(),
            None => EpochProgress::new(epoch, records),
        };
        progress.resumed = remainder.is_some();
        for ids in &all {
            progress.mark_all(bytes_to_u64s(ids))?;
        }
        Ok(Some(progress))
    }

    /// Continues `progress`'s epoch (read from the checkpoint `path`) on this run's layout:
    /// the records not served yet dealt over its nodes. The step to continue at.
    pub(super) fn resume_elsewhere(&mut self, progress: EpochProgress, path: &Path) -> Result<u64> {
        let bad = |m: String| TrainError::Checkpoint {
            path: path.to_path_buf(),
            message: m,
        };
        progress.check().map_err(|e| bad(e.to_string()))?;
        let records = self.plan.manifest.split(&self.cfg.data, "train")?.records;
        if progress.records != records {
            return Err(bad(format!(
                "its progress covers {} records, the train split has {records}",
                progress.records
            )));
        }
        let steps = self.schedule.steps_per_epoch;
        let (epoch, served) = (progress.epoch, progress.served());
        let nodes = self.plan.residency.nodes;
        let remainder = Remainder::new(
            self.cfg,
            self.plan.residency,
            &self.sampler,
            progress,
            steps,
        )?;
        let step = remainder.as_ref().map_or(steps, |r| r.first_step);
        if self.is_root() && self.cfg.verbose {
            let left_out = remainder
                .as_ref()
                .map_or(records - served, |r| r.left_out(nodes));
            ddl_cli::outln!(
                "resume: epoch {epoch} had served {served} of {records} records; the other {} \
                 are dealt over {nodes} node(s) and served in its last {} steps ({left_out} \
                 left out by the last incomplete step)",
                records - served,
                steps - step,
            );
        }
        self.remainder = remainder;
        Ok(step)
    }
}
