//! A run's checkpoints: claiming (and locking) the directory, saving (gathered to rank 0), resuming (rank 0
//! reads and broadcasts) and dumping the final weights.

use std::path::{Path, PathBuf};

use crate::checkpoint::{self, Checkpoint, CheckpointMeta, TensorEntry};
use crate::config::Setting;
use crate::console::eprint_line;
use crate::error::{Result, TrainError};
use crate::run_flags::{self, LayoutCheck};
use crate::table::ReplicaState;

use super::dir_lock::{self, DirLock};
use super::eval_at::EvalAt;
use super::run::Run;

/// Encodes u64 values as bytes (for the control plane).
pub(super) fn u64s_to_bytes(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub(super) fn bytes_to_u64s(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
        .collect()
}

pub(super) fn f32s_to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub(super) fn bytes_to_f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Serialises the BatchNorm buffers of every local replica.
fn encode_buffers(states: &[ReplicaState]) -> Vec<u8> {
    let flat: Vec<f32> = states
        .iter()
        .flat_map(|s| s.buffers.iter().flatten().copied())
        .collect();
    f32s_to_bytes(&flat)
}

impl Run<'_> {
    /// Takes the checkpoint directory for this run: rank 0 locks it before looking into it
    /// ([`dir_lock`]; held while the returned lock lives), and a new run must not write into
    /// a directory holding another run's checkpoints: it would mix with them, and pruning
    /// (which keeps the highest steps) would delete its own. Without `resume`, rank 0
    /// refuses such a directory, or with `restart` moves the files into a dated
    /// subdirectory; every rank gets the verdict.
    pub(crate) fn claim_checkpoint_dir(&mut self) -> Result<Option<DirLock>> {
        let Some(dir) = self.cfg.checkpoint_dir.clone() else {
            return Ok(None);
        };
        let mut lock = None;
        let mut verdict = Ok(());
        if self.is_root() {
            verdict = dir_lock::lock(&dir).and_then(|l| {
                lock = Some(l);
                if self.cfg.resume {
                    Ok(())
                } else {
                    self.unoccupied(&dir)
                }
            });
        }
        let message = verdict.as_ref().err().map(ToString::to_string);
        let message = self
            .comm
            .broadcast_bytes(message.unwrap_or_default().into_bytes())?;
        match verdict {
            Err(e) => Err(e),
            Ok(()) if message.is_empty() => Ok(lock),
            Ok(()) => Err(TrainError::FromRoot(
                String::from_utf8_lossy(&message).into_owned(),
            )),
        }
    }

    /// `Ok` when `dir` holds no checkpoint of another run, or (`restart`) once they are
    /// moved aside.
    fn unoccupied(&self, dir: &Path) -> Result<()> {
        let found = checkpoint::occupants(dir)?;
        if found.is_empty() {
            return Ok(());
        }
        if !self.cfg.restart {
            return Err(TrainError::CheckpointDirInUse {
                dir: dir.to_path_buf(),
                count: found.len(),
                newest: found
                    .last()
                    .and_then(|p| p.file_name())
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            });
        }
        let (aside, n) = checkpoint::move_aside(dir)?;
        if self.cfg.verbose {
            ddl_cli::outln!(
                "restart: moved {n} checkpoint file(s) of the previous run into {}",
                aside.display()
            );
        }
        Ok(())
    }

    /// Writes a checkpoint positioned at (`epoch`, `step`) after `global` steps. Collective:
    /// rank 0 gathers every rank's BatchNorm buffers and writes one file. Older checkpoints
    /// beyond `keep_checkpoints` are pruned before the write (to make room on a full disk)
    /// and after it.
    pub(crate) fn save_checkpoint(&mut self, epoch: u64, step: u64, global: u64) -> Result<()> {
        let Some(dir) = self.cfg.checkpoint_dir.clone() else {
            return Ok(());
        };
        self.last_checkpoint = Some(global);
        let started = std::time::Instant::now();
        let _span = ddl_trace::span_args(
            "checkpoint",
            "train",
            &[("epoch", epoch as i64), ("step", global as i64)],
        );
        let progress = self.progress(epoch, step)?;
        let progress_before = progress
            .as_ref()
            .filter(|p| p.resumed)
            .and(self.remainder.as_ref())
            .map(|r| r.before.clone());
        let (states, whole) = self.whole()?;
        let gathered = self.comm.gather_bytes(encode_buffers(&states))?;
        let (Some(gathered), Some(full)) = (gathered, whole) else {
            return Ok(());
        };
        let layout = self.table.layout();
        let mut tensors = Vec::new();
        let mut data = Vec::new();
        for (p, values) in layout.model_params().zip(full.params) {
            tensors.push(TensorEntry {
                name: format!("param/{}", p.name),
                shape: p.shape.clone(),
            });
            data.push(values);
        }
        for (p, values) in layout.model_params().zip(full.momentum) {
            tensors.push(TensorEntry {
                name: format!("momentum/{}", p.name),
                shape: p.shape.clone(),
            });
            data.push(values);
        }
        let replicas = self.table.replicas();
        for (rank, bytes) in gathered.iter().enumerate() {
            let values = bytes_to_f32s(bytes);
            let mut pos = 0;
            for r in 0..replicas {
                for (name, shape) in &layout.buffers {
                    let n = shape.iter().product::<i64>() as usize;
                    let end = (pos + n).min(values.len());
                    tensors.push(TensorEntry {
                        name: format!("buffer/{rank}/{r}/{name}"),
                        shape: shape.clone(),
                    });
                    data.push(values[pos..end].to_vec());
                    pos = end;
                }
            }
        }
        let (loss_scale, good_steps) = self.table.loss_scale();
        let evaluated = self.last_eval.filter(|e| e.step == global);
        let ck = Checkpoint {
            meta: CheckpointMeta {
                model: self.cfg.model.name().to_string(),
                classes: self.plan.manifest.num_classes() as i64,
                epoch,
                step,
                global_step: global,
                ranks: self.comm.size(),
                replicas,
                loss_scale,
                good_steps,
                flags: serde_json::to_value(self.cfg).unwrap_or_default(),
                nodes: Some(self.plan.residency.nodes),
                head_split: self.table.head_split().map(|s| s.counts()),
                data_fingerprint: Some(self.plan.data_fingerprint),
                class_names: Some(self.class_names()),
                val_top1: evaluated.and_then(|e| e.top1),
                val_top5: evaluated.and_then(|e| e.top5),
                batches_tracked_base: self.batches_tracked_base.clone(),
                progress,
                progress_before,
                placement: Some(ddl_loader::placement::RULE),
                tensors,
            },
            data,
        };
        checkpoint::prune(&dir, self.cfg.keep_checkpoints, global)?;
        let hold = crate::signal::hold_for_checkpoint();
        let written = ck.write(&dir);
        hold.release(written.as_deref().map_err(|e| e.to_string()));
        written?;
        if let Some(budget) = &mut self.budget {
            budget.wrote(started.elapsed());
        }
        checkpoint::prune(&dir, self.cfg.keep_checkpoints, global)?;
        Ok(())
    }

    /// Loads the newest valid checkpoint (rank 0 reads it and broadcasts its bytes, so only
    /// rank 0 needs to see the checkpoint directory). Returns (epoch, step, global step, the
    /// ranks of the run that wrote it). `created`: the directory did not exist before this run
    /// (a mistyped path, most likely).
    pub(crate) fn resume(&mut self, created: bool) -> Result<Option<(u64, u64, u64, usize)>> {
        let Some(dir) = self.cfg.checkpoint_dir.clone() else {
            return Ok(None);
        };
        let Some((bytes, from)) = self.fetch_checkpoint(&dir, created)? else {
            return Ok(None);
        };
        let path = from.clone().unwrap_or_else(|| dir.clone());
        let ck = Checkpoint::from_bytes(&bytes, &path)?;
        let new_layout = self.check_resumable(&ck, &path)?;
        let served = self.served_at(&ck, &path, new_layout)?;
        self.load_checkpoint(&ck, &path)?;
        let mut step = ck.meta.step;
        if let Some(progress) = served {
            // An older rule placed the epoch's records otherwise: its rest is dealt anew.
            let older = ck.meta.placement != Some(ddl_loader::placement::RULE);
            if new_layout || progress.resumed || older {
                step = self.resume_elsewhere(progress, &path)?;
            }
        }
        if self.is_root() && self.cfg.verbose {
            ddl_cli::outln!(
                "resume: {} (epoch {}, step {}, global step {})",
                path.display(),
                ck.meta.epoch,
                ck.meta.step,
                ck.meta.global_step
            );
        }
        self.summary.resumed_from = from.or(Some(path));
        Ok(Some((
            ck.meta.epoch,
            step,
            ck.meta.global_step,
            ck.meta.ranks,
        )))
    }

    /// The bytes of the newest valid checkpoint in `dir` on every rank, with its path on rank
    /// 0; `None` (said on rank 0) when there is none.
    fn fetch_checkpoint(
        &mut self,
        dir: &Path,
        created: bool,
    ) -> Result<Option<(Vec<u8>, Option<PathBuf>)>> {
        let mut bytes = Vec::new();
        let mut from = None;
        let mut refusal = None;
        if self.is_root() {
            let checkpoint::Found {
                checkpoint: found,
                warnings,
            } = checkpoint::newest_valid(dir)?;
            for w in &warnings {
                eprint_line(&format!("warning: {w}"));
            }
            match found {
                Some((path, ck)) => {
                    bytes = ck.to_bytes()?;
                    from = Some(path);
                }
                // Checkpoints there, none intact: starting over would pass for a resume (and
                // prune them later).
                None if !warnings.is_empty() => {
                    refusal = Some(TrainError::NoIntactCheckpoint {
                        dir: dir.to_path_buf(),
                        damaged: warnings.len(),
                    })
                }
                None => {}
            }
            self.summary.warnings.extend(warnings);
        }
        let message = refusal.as_ref().map(ToString::to_string);
        let message = self
            .comm
            .broadcast_bytes(message.unwrap_or_default().into_bytes())?;
        if let Some(e) = refusal {
            return Err(e);
        }
        if !message.is_empty() {
            return Err(TrainError::FromRoot(
                String::from_utf8_lossy(&message).into_owned(),
            ));
        }
        let bytes = self.comm.broadcast_bytes(bytes)?;
        if bytes.is_empty() {
            // On stderr even when not `verbose`: a mistyped directory must not pass for a resume.
            if self.is_root() {
                let why = if created {
                    "did not exist (this run creates it)"
                } else {
                    "holds no checkpoint"
                };
                eprint_line(&format!(
                    "resume: {} {why}: starting from scratch",
                    dir.display()
                ));
            }
            return Ok(None);
        }
        Ok(Some((bytes, from)))
    }

    /// Refuses a checkpoint of another model, class count, dataset, layout or trajectory
    /// (naming each difference); warns of the differences that only change rounding. Whether
    /// the run continues on another layout (`allow_new_layout`).
    fn check_resumable(&mut self, ck: &Checkpoint, path: &Path) -> Result<bool> {
        let bad = |m: String| TrainError::Checkpoint {
            path: path.to_path_buf(),
            message: m,
        };
        if ck.meta.model != self.cfg.model.name() {
            return Err(bad(format!(
                "written for model {}, this run trains {}",
                ck.meta.model, self.cfg.model
            )));
        }
        if ck.meta.classes != self.plan.manifest.num_classes() as i64 {
            return Err(bad(format!(
                "has {} classes, the data has {}",
                ck.meta.classes,
                self.plan.manifest.num_classes()
            )));
        }
        let comparison = run_flags::compare(
            &ck.meta.flags,
            self.cfg,
            LayoutCheck {
                ranks: (ck.meta.ranks, self.comm.size()),
                replicas: (ck.meta.replicas, self.table.replicas()),
                nodes: (ck.meta.nodes, self.plan.residency.nodes),
                data: (ck.meta.data_fingerprint, self.plan.data_fingerprint),
            },
        );
        let mut refused = comparison.refused;
        let mut warnings = comparison.warnings;
        let split = self.table.head_split().map(|s| s.counts());
        if let Some(r) = split_refusal(&comparison.layout, ck.meta.head_split.as_deref(), split) {
            refused.push(r);
        } else if !comparison.layout.is_empty() {
            let layout = comparison.layout.join(", ");
            if self.cfg.allow_new_layout {
                warnings.push(format!(
                    "resuming on another layout ({layout}): BatchNorm statistics are taken from \
                     matching replicas modulo the old counts and the global batch may differ; the \
                     run will not be bitwise identical"
                ));
            } else {
                refused.push(format!(
                    "{layout}: another data-parallel layout (pass {} to continue \
                     on this one anyway, not bitwise identical)",
                    Setting::AllowNewLayout
                ));
            }
        }
        if !refused.is_empty() {
            return Err(TrainError::ResumeMismatch {
                path: path.to_path_buf(),
                differences: refused,
            });
        }
        for w in warnings {
            if self.is_root() && self.cfg.verbose {
                eprint_line(&format!("warning: {w}"));
            }
            self.summary.warnings.push(w);
        }
        Ok(!comparison.layout.is_empty())
    }

    /// Sets every replica's parameters, momentum and buffers, the loss scale and what an export
    /// and the metrics carry on from the checkpoint `ck` (read from `path`).
    fn load_checkpoint(&mut self, ck: &Checkpoint, path: &Path) -> Result<()> {
        let bad = |m: String| TrainError::Checkpoint {
            path: path.to_path_buf(),
            message: m,
        };
        let layout = self.table.layout().clone();
        let params = ck
            .tensors(layout.model_params().map(|p| format!("param/{}", p.name)))
            .map_err(bad)?;
        let momentum = ck
            .tensors(
                layout
                    .model_params()
                    .map(|p| format!("momentum/{}", p.name)),
            )
            .map_err(bad)?;
        let rank = self.rank();
        self.set_whole(&params, &momentum, &|r| {
            let (cr, ci) = (rank % ck.meta.ranks.max(1), r % ck.meta.replicas.max(1));
            ck.tensors(
                layout
                    .buffers
                    .iter()
                    .map(|(n, _)| format!("buffer/{cr}/{ci}/{n}")),
            )
            .map_err(bad)
        })?;
        self.table
            .set_loss_scale(ck.meta.loss_scale, ck.meta.good_steps);
        self.batches_tracked_base = ck.meta.batches_tracked_base.clone();
        if ck.meta.val_top1.is_some() {
            self.last_eval = Some(EvalAt {
                step: ck.meta.global_step,
                top1: ck.meta.val_top1,
                top5: ck.meta.val_top5,
            });
        }
        Ok(())
    }

    /// Writes replica 0's parameters and buffers as raw little-endian f32 to `path` and an
    /// index to `path.json`: `{"dtype": "f32", "tensors": [{"name", "shape", "offset"}]}` with
    /// offsets in elements.
    /// Collective under `head_parallel` (rank 0 gathers the head's slices).
    pub(crate) fn dump_weights(&mut self, path: &Path) -> Result<()> {
        let (_, whole) = self.whole()?;
        let Some(whole) = whole.filter(|_| self.is_root()) else {
            return Ok(());
        };
        let layout = self.table.layout();
        let mut raw = Vec::new();
        let mut index = Vec::new();
        let mut offset = 0usize;
        let named = layout
            .model_params()
            .map(|p| (&p.name, &p.shape))
            .zip(whole.params.iter())
            .chain(
                layout
                    .buffers
                    .iter()
                    .map(|(n, s)| (n, s))
                    .zip(whole.buffers.iter()),
            );
        for ((name, shape), values) in named {
            index.push(serde_json::json!({"name": name, "shape": shape, "offset": offset}));
            raw.extend(values.iter().flat_map(|x| x.to_le_bytes()));
            offset += values.len();
        }
        std::fs::write(path, &raw).map_err(|e| TrainError::io(path, e))?;
        let json = serde_json::json!({"dtype": "f32", "byte_order": "little", "numel": offset, "tensors": index});
        let idx = PathBuf::from(format!("{}.json", path.display()));
        std::fs::write(&idx, serde_json::to_vec_pretty(&json).unwrap_or_default())
            .map_err(|e| TrainError::io(&idx, e))
    }
}

/// Why a checkpoint whose head is split (`checkpoint`) or a run whose head is (`run`) cannot
/// continue on another layout (`layout`: its differences): each replica's slice is the
/// checkpoint's layout's.
fn split_refusal(
    layout: &[String],
    checkpoint: Option<&[usize]>,
    run: Option<Vec<usize>>,
) -> Option<String> {
    if layout.is_empty() || (checkpoint.is_none() && run.is_none()) {
        return None;
    }
    Some(format!(
        "{}: the head is split over {} in the checkpoint and would be over {} in this run; a \
         run with {} resumes on its checkpoint's layout only",
        layout.join(", "),
        split_name(checkpoint),
        split_name(run.as_deref()),
        Setting::HeadParallel
    ))
}

/// How a checkpoint's or a run's head is split: "4 replicas (classes 3, 3, 2, 2)", or not.
fn split_name(split: Option<&[usize]>) -> String {
    match split {
        Some(counts) => {
            let c: Vec<String> = counts.iter().map(ToString::to_string).collect();
            format!("{} replicas (classes {})", counts.len(), c.join(", "))
        }
        None => "no replicas (data-parallel head)".into(),
    }
}
