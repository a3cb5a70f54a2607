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
use ddl_loader::elastic::{self, Layout};
use ddl_loader::placement;
use ddl_loader::progress::EpochProgress;
use ddl_loader::sampler::{Sampler, Tail};

use super::checkpoints::{bytes_to_u64s, u64s_to_bytes};
use super::remainder::Remainder;
use super::run::Run;
use crate::checkpoint::Checkpoint;
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

    /// What the epoch of `ck` (read from `path`) had served at its step over the whole job:
    /// its record of it (the bitmap) checked against what the layout that wrote it must have
    /// served, or recomputed when it has none; `None` at an epoch's start and for an older
    /// checkpoint without a record, which continues on its own layout only (`new_layout`:
    /// this run's differs). A record that does not match is refused, naming the checkpoint.
    pub(super) fn served_at(
        &self,
        ck: &Checkpoint,
        path: &Path,
        new_layout: bool,
    ) -> Result<Option<EpochProgress>> {
        let bad = |m: String| TrainError::Checkpoint {
            path: path.to_path_buf(),
            message: m,
        };
        let m = &ck.meta;
        if m.step == 0 {
            return Ok(None);
        }
        let shards = self.train_shards()?;
        let layout = self.layout_of(ck);
        let this_rule = m.placement == Some(placement::RULE);
        let Some(recorded) = m.progress.clone() else {
            return match layout.filter(|_| this_rule) {
                Some(l) => Ok(Some(elastic::served(
                    &shards,
                    &l,
                    m.epoch,
                    m.step as usize,
                )?)),
                None if new_layout => Err(bad(format!(
                    "written mid-epoch (epoch {}, step {}) without a record of the records its \
                     epoch served (an older ddl): resume it on its own layout ({} rank(s) x {} \
                     replica(s)), or from the checkpoint at the start of epoch {}",
                    m.epoch, m.step, m.ranks, m.replicas, m.epoch
                ))),
                None => Ok(None),
            };
        };
        recorded.check().map_err(|e| bad(e.to_string()))?;
        let records: u64 = shards.iter().sum();
        if (recorded.epoch, recorded.records) != (m.epoch, records) {
            return Err(bad(format!(
                "its record of the records served is of epoch {} over {} records, the \
                 checkpoint is at epoch {} of a train split of {records}",
                recorded.epoch, recorded.records, m.epoch
            )));
        }
        let want = match layout {
            Some(l) if this_rule => Some(self.recompute(ck, &shards, &l, &recorded, path)?),
            _ => None,
        };
        if let Some(want) = want.filter(|w| w.words() != recorded.words()) {
            let differ = (0..records).filter(|&i| want.is_served(i) != recorded.is_served(i));
            return Err(bad(format!(
                "its record of the records epoch {} served ({} records) is not what its layout \
                 ({} rank(s) x {} replica(s) on {} node(s), batch {}) served in the first {} \
                 steps ({} records; {} differ): the file was altered or written by a faulty run; \
                 resume from an earlier checkpoint",
                m.epoch,
                recorded.served(),
                m.ranks,
                m.replicas,
                m.nodes.unwrap_or(1),
                self.cfg.batch,
                m.step,
                want.served(),
                differ.count()
            )));
        }
        if !this_rule && !recorded.resumed {
            // An older ddl's rule: each of its steps served a global batch of new records.
            let batch = (m.ranks * m.replicas * self.cfg.batch) as u64;
            if recorded.served() != m.step * batch {
                return Err(bad(format!(
                    "its record of epoch {} has {} records served, its {} steps of {batch} \
                     served {}: the file was altered; resume from an earlier checkpoint",
                    m.epoch,
                    recorded.served(),
                    m.step,
                    m.step * batch
                )));
            }
        }
        Ok(Some(recorded))
    }

    /// What the layout `l` that wrote `ck` served of its epoch by its step: from the epoch's
    /// start, or in a remainder, from what the epoch had served when the remainder began.
    fn recompute(
        &self,
        ck: &Checkpoint,
        shards: &[u64],
        l: &Layout,
        recorded: &EpochProgress,
        path: &Path,
    ) -> Result<EpochProgress> {
        let (epoch, step) = (ck.meta.epoch, ck.meta.step as usize);
        if !recorded.resumed {
            return Ok(elastic::served(shards, l, epoch, step)?);
        }
        let Some(before) = ck.meta.progress_before.as_ref() else {
            return Err(TrainError::Checkpoint {
                path: path.to_path_buf(),
                message: format!(
                    "epoch {epoch} was resumed on another layout, but the checkpoint does not \
                     say what the epoch had served then: resume from an earlier checkpoint"
                ),
            });
        };
        // The remainder's last steps are the epoch's: its step at the epoch's step `step`.
        let whole = elastic::epoch_steps(shards, l, epoch, None)?;
        let rest = elastic::epoch_steps(shards, l, epoch, Some(before))?;
        let at = (step + rest)
            .checked_sub(whole)
            .ok_or_else(|| TrainError::Checkpoint {
                path: path.to_path_buf(),
                message: format!("step {step} is before the remainder of epoch {epoch} began"),
            })?;
        Ok(elastic::served_after(before, l, at)?)
    }

    /// The layout that wrote `ck`, as its record's recomputation needs it; `None` for a
    /// checkpoint that predates its node count.
    fn layout_of(&self, ck: &Checkpoint) -> Option<Layout> {
        let nodes = ck.meta.nodes.filter(|&n| n > 0 && ck.meta.ranks % n == 0)?;
        Some(Layout {
            nodes,
            ranks_in_node: ck.meta.ranks / nodes,
            replicas: ck.meta.replicas,
            batch_per_replica: self.cfg.batch,
            tail: Tail::Drop,
            seed: self.cfg.seed,
            exchange: if nodes > 1 { self.cfg.exchange } else { 0.0 },
        })
    }

    /// The records of each train shard, in split order.
    fn train_shards(&self) -> Result<Vec<u64>> {
        let info = self.plan.manifest.split(&self.cfg.data, "train")?;
        Ok(info.shards.iter().map(|s| s.records).collect())
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
