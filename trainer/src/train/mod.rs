//! The training driver of one rank: configuration checks, data, the data-parallel table,
//! the schedule, evaluation, checkpoints, metrics.
//!
//! [`train`] takes any [`Transport`] (MPI between processes, or ddl-comm's in-process thread
//! transport in tests), so the same code runs under `mpirun`/`srun` and inside one test
//! process with several simulated ranks.

use std::collections::HashSet;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ddl_comm::{CostModel, Topology, Transport};
use ddl_loader::pipeline::{Augment, BadRecord, OnBadRecord, Output, Pipeline, PipelineConfig};
use ddl_loader::sampler::{Sampler, SamplerConfig, Tail};

use crate::checkpoint::{self};
use crate::comm::Communicator;
use crate::config::Setting;
use crate::config::{comm_order, Overlap, TrainConfig};
use crate::console::eprint_line;
use crate::device;
use crate::error::{Result, TrainError};
use crate::metrics::{MetricsWriter, StepRecord};
use crate::schedule::Schedule;
use crate::signal::StopSignal;
use crate::table::{BatchIter, EvalSums, Table};
use crate::trace_records::RecordTrace;

mod checkpoints;
mod data;
pub mod dir_lock;
mod elastic;
mod epoch_record;
mod eval_at;
mod head;
mod rank_setup;
mod remainder;
mod run;
mod run_plan;
mod stop_budget;
mod synthetic;
mod tuning;
mod weights_io;

use checkpoints::{bytes_to_u64s, u64s_to_bytes};
use data::open_data;
use epoch_record::{epoch_line, EpochAcc};
use eval_at::EvalAt;
use rank_setup::{check_replica_counts, table_config};
pub use run::TrainSummary;
use run::{BadRecordUse, Position, Run};
use run_plan::plan;
use stop_budget::StopBudget;

pub use crate::job::RankInfo;

/// Why a record is bad, without the shard and record its message starts with.
fn bad_reason(bad: &BadRecord) -> &str {
    let prefix = format!("{}: record {}: ", bad.file.display(), bad.record);
    bad.reason.strip_prefix(&prefix).unwrap_or(&bad.reason)
}

/// The communication order a run uses, with the reason where it is not the one asked for.
fn order_line(cfg: &TrainConfig, overlap: Overlap, ranks: usize) -> String {
    match comm_order(cfg.comm_order, overlap, ranks, cfg.precision) {
        (order, Some(why)) => format!("{order} ({why})"),
        (order, None) => order.to_string(),
    }
}

/// Trains on this rank. Collective: every rank of `transport` must call it with the same
/// configuration. `topology` describes the physical layout for the allreduce cost model.
///
/// # Examples
///
/// One epoch of resnet_small on a small packed dataset, on one rank with one CPU replica,
/// then the weights read back from the checkpoint it wrote at the end:
///
/// ```
/// use std::sync::Arc;
/// use ddl_comm::{thread_group, Topology, Transport};
/// use ddl_trainer::{checkpoint, model::ModelKind, train, RankInfo, TrainConfig};
///
/// let tmp = ddl_testkit::scratch("train-example");
/// let (images, shards) = (tmp.path().join("imagenet"), tmp.path().join("shards"));
/// for (class, wnid) in ["n01440764", "n01443537"].iter().enumerate() {
///     let dir = images.join("train").join(wnid);
///     std::fs::create_dir_all(&dir)?;
///     for i in 0..4 {
///         let jpeg = ddl_testkit::jpeg(40, 40, class * 10 + i);
///         std::fs::write(dir.join(format!("{i}.JPEG")), jpeg)?;
///     }
/// }
/// let pack = ddl_loader::pack::PackOptions::new(&images, &shards);
/// ddl_loader::pack::pack(&pack, &ddl_loader::pack::NoProgress)?;
///
/// let cfg = TrainConfig {
///     data: shards,
///     model: ModelKind::ResnetSmall,
///     epochs: 1,
///     image_size: 32,
///     batch: 4,
///     devices: "cpu:1".parse()?,
///     checkpoint_dir: Some(tmp.path().join("ckpt")),
///     ..TrainConfig::default()
/// };
/// let one_rank: Arc<dyn Transport> = Arc::new(thread_group(1).pop().unwrap());
/// let summary = train(&cfg, one_rank, Topology::new(1, 1), RankInfo::single())?;
/// assert_eq!(summary.global_steps, 2); // 8 images, batch 4
///
/// let found = checkpoint::newest_valid(&tmp.path().join("ckpt"))?;
/// let (_, ckpt) = found.checkpoint.expect("a checkpoint at the end of the epoch");
/// assert_eq!((ckpt.meta.model.as_str(), ckpt.meta.global_step), ("resnet_small", 2));
/// assert_eq!(ckpt.meta.classes, 2);
/// let weights: usize = ckpt.data.iter().map(Vec::len).sum();
/// assert!(weights > 10_000, "{weights} values");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn train(
    cfg: &TrainConfig,
    transport: Arc<dyn Transport>,
    topology: Topology,
    info: RankInfo,
) -> Result<TrainSummary> {
    let notices = transport.clone();
    // A failure before the run's parts exist is told here ([`Run::go`] tells the later ones).
    train_rank(cfg, transport, topology, info)
        .inspect_err(|e| crate::comm::announce_failure(&*notices, e))
}

/// [`train`] without telling the other ranks of a failure.
fn train_rank(
    cfg: &TrainConfig,
    transport: Arc<dyn Transport>,
    topology: Topology,
    info: RankInfo,
) -> Result<TrainSummary> {
    transport.set_timeout(Duration::from_secs(cfg.comm_timeout_s.max(1)));
    if cfg.synthetic_data {
        return synthetic::train(cfg, transport, topology, info);
    }
    let rank = transport.rank();
    let world = transport.size();
    let plan = plan(cfg, rank, world, info)?;
    let comm = collective(cfg, transport.clone(), topology)?;
    let replicas = plan.devices.len();
    check_replica_counts(&comm, replicas)?;
    device::configure_backend(&plan.devices, cfg.deterministic);
    let global_replicas = replicas * world;

    let data = open_data(cfg, &plan, replicas, &transport)?;
    if cfg.exchange > 0.0 && plan.residency.nodes < 2 && rank == 0 && cfg.verbose {
        eprint_line(&format!(
            "note: {} {} exchanges nothing: the job has one node, which holds every record",
            Setting::Exchange,
            cfg.exchange
        ));
    }
    let (train_set, sampler, val_set, placement, exchange) = (
        data.train,
        data.sampler,
        data.val,
        data.placement,
        data.exchange,
    );
    let steps_per_epoch = sampler.steps_per_epoch() as u64;

    let global_batch = global_replicas * cfg.batch;
    let mut schedule = Schedule::new(
        cfg.base_lr,
        global_batch,
        steps_per_epoch,
        cfg.epochs,
        cfg.warmup_epochs,
        plan.decay.clone(),
    );
    if let Some(lr) = cfg.lr {
        schedule.peak = lr;
    }
    let table_cfg = table_config(
        cfg,
        plan.devices.clone(),
        plan.manifest.num_classes() as i64,
        &info,
        (rank, world),
    );
    let overlap = table_cfg.overlap;
    let table = Table::new(table_cfg)?;
    let bar = (rank == 0 && cfg.verbose && std::io::stderr().is_terminal())
        .then(|| progress_bar(steps_per_epoch));
    let budget = cfg
        .kill_timing
        .clone()
        .filter(|_| cfg.checkpoint_dir.is_some())
        .map(|t| {
            // A checkpoint holds the weights and the momentum, 4 bytes each.
            let values: i64 = table
                .layout()
                .model_params()
                .map(|p| p.shape.iter().product::<i64>())
                .sum();
            StopBudget::new(t, values as u64 * 8)
        });
    let run = Run {
        cfg,
        plan,
        comm,
        table,
        schedule,
        train_set,
        sampler,
        val_set,
        exchange,
        remainder: None,
        metrics: None,
        trace: None,
        summary: TrainSummary::default(),
        bar,
        bad_seen: HashSet::new(),
        bad_unpublished: Vec::new(),
        last_checkpoint: None,
        budget,
        last_eval: None,
        batches_tracked_base: Default::default(),
    };
    if rank == 0 && cfg.verbose {
        let records = data::records_line(cfg, &placement, steps_per_epoch, global_batch);
        run.print_start(world, &records, overlap);
    }
    run.go()
}

/// The collectives of the run over `transport`, with the cost model `auto` chooses by (the
/// `cost_model` file, or the formulas).
fn collective(
    cfg: &TrainConfig,
    transport: Arc<dyn Transport>,
    topology: Topology,
) -> Result<Communicator> {
    let model = match &cfg.cost_model {
        Some(path) => CostModel::load(path)
            .map_err(|e| TrainError::config(Setting::CostModel, e.to_string()))?,
        None => CostModel::default(),
    };
    Communicator::new(
        transport,
        cfg.allreduce.clone(),
        cfg.gather.clone(),
        topology,
        model,
    )
}

/// The progress bar of an epoch of `steps` steps (rank 0, on a terminal).
fn progress_bar(steps: u64) -> indicatif::ProgressBar {
    let b = indicatif::ProgressBar::new(steps);
    b.set_style(
        indicatif::ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    b
}

impl Run<'_> {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn is_root(&self) -> bool {
        self.rank() == 0
    }

    /// The run's opening line: the model, the layout, the data (`records`: the train records
    /// and how the nodes hold them), the schedule and the communication, and what the scheduler
    /// leaves a stop.
    fn print_start(&self, world: usize, records: &str, overlap: Overlap) {
        let (cfg, plan) = (self.cfg, &self.plan);
        let replicas = plan.devices.len();
        let global_replicas = replicas * world;
        let devs: Vec<String> = plan.devices.iter().map(|d| format!("{d:?}")).collect();
        ddl_cli::outln!(
            "ddl-train: {} on {} rank(s) x {} replica(s) [{}], {} classes{}, {}, \
             global batch {}, peak lr {:.4}, {} steps/epoch, allreduce {}, overlap {}, comm order {}, {} bucket(s){}{}",
            cfg.model,
            world,
            replicas,
            devs.join(","),
            plan.manifest.num_classes(),
            if cfg.head_parallel {
                format!(" (head split over {global_replicas} replicas, gather {})", cfg.gather)
            } else {
                String::new()
            },
            records,
            global_replicas * cfg.batch,
            self.schedule.peak,
            self.schedule.steps_per_epoch,
            if self.comm.tunes() {
                "auto (tuned on the first steps)".to_string()
            } else {
                cfg.allreduce.to_string()
            },
            overlap.name(),
            order_line(cfg, overlap, world),
            self.table.layout().buckets.len(),
            if self.table.yields_to_comm() {
                "; the CPU replicas outnumber the cores and yield them to the communication"
            } else {
                ""
            },
            cfg.kill_timing
                .as_ref()
                .map_or(String::new(), |t| format!("; {}", t.said)),
        );
    }

    fn go(mut self) -> Result<TrainSummary> {
        let done = self.train_all();
        if let Err(e) = &done {
            // Before the run's parts go: one that waits for the other ranks as it is dropped
            // (the record exchange's transfer) then ends at once.
            self.comm.announce_failure(e);
        }
        done
    }

    /// The run from its start to its end: [`Run::go`] without the failure notice.
    fn train_all(&mut self) -> Result<TrainSummary> {
        // Held until the run ends: no other run may use the directory meanwhile.
        let dir_lock = self.claim_checkpoint_dir()?;
        let mut pos = self.start(dir_lock.as_ref().is_some_and(|l| l.created))?;
        let steps_per_epoch = self.schedule.steps_per_epoch;
        let epochs = u64::from(self.cfg.epochs);
        let max_steps = self.cfg.max_steps.unwrap_or(u64::MAX);
        let mut stopped = pos.global >= max_steps;
        while pos.epoch < epochs && !stopped {
            let epoch_start = Instant::now();
            let acc = self.train_epoch(&mut pos, max_steps)?;
            let epoch_s = epoch_start.elapsed();
            if pos.step < steps_per_epoch {
                // Stopped by `max_steps` inside the epoch.
                break;
            }
            self.end_epoch(pos, &acc, epoch_s)?;
            pos = Position {
                epoch: pos.epoch + 1,
                step: 0,
                global: pos.global,
            };
            self.save_checkpoint(pos.epoch, 0, pos.global)?;
            stopped = pos.global >= max_steps;
            if !stopped && pos.epoch < epochs {
                // A signal that arrived during evaluation.
                if let Some(signal) = self.agreed_stop()? {
                    return Err(self.preempt(signal, pos.epoch, 0, pos.global)?);
                }
            }
        }
        self.finish(pos)
    }

    /// Where the run starts (a checkpoint's position with `resume`, else the beginning), with
    /// its weights in place (`init_from`), its metrics file open and, with
    /// `check_replicas`, the replicas compared. `created`: this run created the checkpoint
    /// directory.
    fn start(&mut self, created: bool) -> Result<Position> {
        let (mut epoch, mut step, mut global) = (0u64, 0u64, 0u64);
        // The ranks of the checkpoint resumed from.
        let mut resumed = None;
        if self.cfg.resume {
            if let Some((e, s, g, ranks)) = self.resume(created)? {
                (epoch, step, global) = (e, s, g);
                resumed = Some(ranks);
            }
        }
        // A run continued from its checkpoint has its weights already.
        if let Some(path) = self.cfg.init_from.clone().filter(|_| resumed.is_none()) {
            self.init_from(&path)?;
        }
        if let Some(path) = &self.cfg.metrics {
            if self.is_root() {
                self.metrics = Some(MetricsWriter::open(
                    path,
                    self.summary.resumed_from.is_some(),
                )?);
            }
        }
        if let Some(path) = &self.cfg.trace_records {
            let (rank, ranks) = (self.rank(), self.comm.size());
            let resumed = resumed.map(|before| (global, before));
            self.trace = Some(RecordTrace::open(path, rank, ranks, resumed)?);
        }
        if self.cfg.check_replicas {
            self.check_replicas()?;
        }
        Ok(Position {
            epoch,
            step,
            global,
        })
    }

    /// Trains from `pos` to the end of its epoch, or to global step `max_steps`, and moves
    /// `pos` there: the epoch's loss and accuracy.
    fn train_epoch(&mut self, pos: &mut Position, max_steps: u64) -> Result<EpochAcc> {
        let (epoch, mut step, mut global) = (pos.epoch, pos.step, pos.global);
        let steps_per_epoch = self.schedule.steps_per_epoch;
        let epochs = u64::from(self.cfg.epochs);
        let (train_set, sampler, first) = match self.remainder.as_ref().filter(|r| r.epoch == epoch)
        {
            Some(r) => (r.train_set.clone(), r.sampler.clone(), r.sampler_step(step)),
            None => {
                if let Some(exchange) = &mut self.exchange {
                    self.train_set = exchange.epoch(epoch)?;
                }
                (self.train_set.clone(), self.sampler.clone(), step as usize)
            }
        };
        // A shard changed under the job would SIGBUS a reader mid-epoch: catch it here.
        train_set.check_unchanged()?;
        let pipeline = Pipeline::start(
            train_set,
            sampler,
            self.pipeline_config(
                Augment::Train,
                self.cfg.train_size(epoch),
                self.cfg.on_bad_record,
            ),
            epoch,
            first,
        )?;
        let mut sources: Vec<BatchIter> = (0..self.table.replicas())
            .map(|r| Box::new(pipeline.replica(r)) as BatchIter)
            .collect();
        if let Some(trace) = &mut self.trace {
            // The pipeline counts its sampler's steps: `first` is the one trained next.
            sources = trace.watch(sources, global.wrapping_sub(first as u64));
        }
        self.table.attach(sources)?;
        if let Some(b) = &self.bar {
            b.set_prefix(format!("epoch {epoch}"));
            b.set_position(step);
        }
        let mut acc = EpochAcc::default();
        let mut bad_seen = 0;
        while step < steps_per_epoch {
            if global >= max_steps {
                break;
            }
            let lr = self.schedule.lr(global);
            let sent = self.comm.bytes_sent();
            let stats = self.table.step(lr, &self.comm)?;
            let sent = self.comm.bytes_sent() - sent;
            if !stats.loss.is_finite() {
                return Err(TrainError::NonFinite { step: global });
            }
            step += 1;
            global += 1;
            self.summary.steps_run += 1;
            if let Some(trace) = &mut self.trace {
                trace.trained(global)?;
            }
            bad_seen = self.collect_bad_records(&pipeline, bad_seen, BadRecordUse::Train);
            tuning::report(
                &self.comm,
                global,
                self.is_root() && self.cfg.verbose,
                self.metrics.as_mut(),
                self.cfg.save_cost_model.as_deref(),
            )?;
            acc.add(&stats);
            if let Some(m) = &mut self.metrics {
                let at = (global, epoch, lr);
                m.write(&StepRecord::new(at, &stats, self.comm.size(), sent))?;
            }
            if let Some(b) = &self.bar {
                b.set_position(step);
                b.set_message(format!("loss {:.4} lr {:.4}", stats.loss, lr));
            }
            let every = self.cfg.checkpoint_every > 0 && global % self.cfg.checkpoint_every == 0;
            let last = global >= max_steps && step < steps_per_epoch;
            if (every || last) && step < steps_per_epoch {
                // The trace's lines on disk first: a run resumed from it continues them.
                self.flush_trace()?;
                self.save_checkpoint(epoch, step, global)?;
            }
            let run_ends = global >= max_steps || (step == steps_per_epoch && epoch + 1 == epochs);
            if !run_ends {
                if let Some(signal) = self.agreed_stop()? {
                    // At an epoch's last step the checkpoint sits at its end: a resumed
                    // run evaluates the epoch and goes on.
                    return Err(self.preempt(signal, epoch, step, global)?);
                }
            }
        }
        drop(pipeline);
        if step == steps_per_epoch {
            self.remainder = None;
        }
        self.flush_trace()?;
        (pos.step, pos.global) = (step, global);
        Ok(acc)
    }

    /// Writes the record trace's lines so far to its file.
    fn flush_trace(&mut self) -> Result<()> {
        self.trace.as_mut().map_or(Ok(()), RecordTrace::flush)
    }

    /// The end of a whole epoch at `pos`: evaluation, the replica check, the epoch's record
    /// (printed, written to the metrics) and its bad records.
    fn end_epoch(&mut self, pos: Position, acc: &EpochAcc, epoch_s: Duration) -> Result<()> {
        let (epoch, global) = (pos.epoch, pos.global);
        let val = self.evaluate(epoch)?;
        if self.cfg.check_replicas {
            self.check_replicas()?;
        }
        let record = self.epoch_record(epoch, acc, epoch_s, val)?;
        if record.val_top1.is_some() {
            self.last_eval = Some(EvalAt {
                step: global,
                top1: record.val_top1,
                top5: record.val_top5,
            });
        }
        self.summary.bad_records_train += record.bad_records;
        self.summary.bad_records_eval += record.val_bad_records.unwrap_or(0);
        if record.bad_records + record.val_bad_records.unwrap_or(0) > 0 {
            self.publish_bad_records()?;
        }
        if self.is_root() {
            if let Some(b) = &self.bar {
                b.finish_and_clear();
            }
            if self.cfg.verbose {
                ddl_cli::outln!("{}", epoch_line(&record));
            }
            if let Some(m) = &mut self.metrics {
                m.write(&record)?;
            }
        }
        self.summary.epochs.push(record);
        Ok(())
    }

    /// The end of the run at `pos`: the last bad records published, the replicas flushed and
    /// checksummed, the weights dumped and exported as asked.
    fn finish(&mut self, pos: Position) -> Result<TrainSummary> {
        let (epoch, global) = (pos.epoch, pos.global);
        self.summary.global_steps = global;
        // Those of a last epoch cut short by `max_steps`.
        self.publish_bad_records()?;
        self.table.flush(&self.comm)?;
        let sums = self.table.checksums()?;
        self.summary.param_checksum = sums[0];
        if let Some(path) = &self.cfg.dump_weights {
            self.dump_weights(path)?;
        }
        if let Some(path) = &self.cfg.export {
            self.export(path, epoch, global)?;
        }
        Ok(std::mem::take(&mut self.summary))
    }

    /// Whether any rank received a stop signal, or rank 0 sees the job's time limit too near
    /// for a stop after its SIGTERM ([`StopBudget`]): every rank calls it after the same step,
    /// so all stop together (the signal may have reached only some of them).
    fn agreed_stop(&mut self) -> Result<Option<StopSignal>> {
        const ORDER: [StopSignal; 3] = [StopSignal::Term, StopSignal::Int, StopSignal::TimeLimit];
        let mut votes = [0f32; ORDER.len()];
        let root = self.is_root();
        let mut near = false;
        if let Some(budget) = &mut self.budget {
            let now = Instant::now();
            budget.check(now);
            near = root && budget.time_limit_near(now);
            if let Some(warning) = budget.warning().filter(|_| root) {
                eprint_line(&format!("ddl-train: warning: {warning}"));
            }
        }
        let wanted = self
            .cfg
            .stop
            .requested()
            .or(near.then_some(StopSignal::TimeLimit));
        for (vote, signal) in votes.iter_mut().zip(ORDER) {
            *vote = f32::from(u8::from(wanted == Some(signal)));
        }
        self.comm.allreduce_sum(&mut votes)?;
        Ok(ORDER
            .into_iter()
            .zip(votes)
            .find(|&(_, v)| v > 0.0)
            .map(|(s, _)| s))
    }

    /// Stops the run after `global` steps, positioned at (`epoch`, `step`): writes the
    /// checkpoint (unless this step's is already written) and returns the error that says
    /// where to resume.
    fn preempt(
        &mut self,
        signal: StopSignal,
        epoch: u64,
        step: u64,
        global: u64,
    ) -> Result<TrainError> {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
        self.publish_bad_records()?;
        self.flush_trace()?;
        let checkpoint = match self.cfg.checkpoint_dir.clone() {
            Some(dir) => {
                if self.last_checkpoint != Some(global) {
                    self.save_checkpoint(epoch, step, global)?;
                }
                Some(dir.join(checkpoint::file_name(global)))
            }
            None => None,
        };
        // No rank leaves (and no launcher tears the job down) before rank 0's file is complete.
        self.comm.barrier()?;
        Ok(TrainError::Preempted {
            signal,
            global_step: global,
            epoch,
            step,
            checkpoint,
        })
    }

    /// Takes note of the bad records `pipeline` met after the first `seen` (each distinct one
    /// once per rank) for the next [`Run::publish_bad_records`]; returns the new count seen.
    fn collect_bad_records(
        &mut self,
        pipeline: &Pipeline,
        seen: usize,
        usage: BadRecordUse,
    ) -> usize {
        let new = pipeline.bad_records_since(seen);
        let seen = seen + new.len();
        for bad in new {
            if self.bad_seen.insert((bad.file.clone(), bad.record)) {
                self.bad_unpublished.push((usage, bad));
            }
        }
        seen
    }

    /// Collective: gathers every rank's newly met bad records on rank 0, which prints each
    /// record not printed before (once per run, whichever ranks met it) and keeps it for the
    /// end-of-run summary.
    fn publish_bad_records(&mut self) -> Result<()> {
        let mine: Vec<(bool, String, usize, String)> = self
            .bad_unpublished
            .drain(..)
            .map(|(usage, b)| {
                let reason = bad_reason(&b).to_string();
                (
                    usage == BadRecordUse::Eval,
                    b.file.display().to_string(),
                    b.record,
                    reason,
                )
            })
            .collect();
        let bytes = serde_json::to_vec(&mine).unwrap_or_default();
        let Some(all) = self.comm.gather_bytes(bytes)? else {
            return Ok(());
        };
        for part in all {
            let records: Vec<(bool, String, usize, String)> =
                serde_json::from_slice(&part).unwrap_or_default();
            for (eval, file, record, reason) in records {
                let file = PathBuf::from(file);
                if self
                    .summary
                    .bad_records
                    .iter()
                    .any(|b| b.file == file && b.record == record)
                {
                    continue;
                }
                if self.cfg.verbose {
                    let obr = Setting::OnBadRecord;
                    let action = match (eval, self.cfg.on_bad_record) {
                        (true, _) => "left out of the evaluation".to_string(),
                        (false, OnBadRecord::Replace) => {
                            format!("replaced by the next good record of the epoch ({obr} replace)")
                        }
                        (false, OnBadRecord::Skip) => format!("left out of its batch ({obr} skip)"),
                        (false, OnBadRecord::Fail) => format!("the run fails ({obr} fail)"),
                    };
                    eprint_line(&format!(
                        "ddl-train: bad record: shard {} record {record}: {reason}; {action}. \
                         `ddl-pack --verify {}` lists every damaged record",
                        file.display(),
                        self.cfg.data.display(),
                    ));
                }
                self.summary.bad_records.push(BadRecord {
                    file,
                    record,
                    reason,
                });
            }
        }
        Ok(())
    }

    /// The loader's settings for images of `image_size` (the epoch's train size, or
    /// `image_size` in evaluation) with the run's augmentation and normalisation.
    fn pipeline_config(
        &self,
        augment: Augment,
        image_size: u32,
        on_bad_record: OnBadRecord,
    ) -> PipelineConfig {
        let gpu = self.plan.devices.iter().any(|d| d.is_cuda());
        PipelineConfig {
            image_size,
            // On GPUs ship bytes and normalise on the device; on the CPU the loader normalises.
            output: if gpu { Output::U8Nhwc } else { Output::F32Nchw },
            augment,
            train: self.cfg.train_augment(),
            mean: self.cfg.mean,
            std: self.cfg.std,
            workers: self.cfg.workers,
            prefetch: self.cfg.prefetch,
            seed: self.cfg.seed,
            on_bad_record,
        }
    }

    /// Evaluates replica 0 on this rank's part of the node's val records, then sums over ranks.
    /// A bad val record is never scored through a stand-in: it is left out and counted
    /// (`on_bad_record` fail fails instead).
    fn evaluate(&mut self, epoch: u64) -> Result<Option<EvalSums>> {
        if !self.cfg.eval || !self.plan.manifest.splits.contains_key("val") {
            return Ok(None);
        }
        self.table.flush(&self.comm)?;
        let _span = ddl_trace::span_args("eval", "train", &[("epoch", epoch as i64)]);
        let mut sums = EvalSums::default();
        if let Some(val) = self.val_set.clone() {
            val.check_unchanged()?;
            let node_records = val.len();
            let (ranks, me, batch) = (
                self.plan.ranks_in_node,
                self.plan.rank_in_node,
                self.cfg.batch,
            );
            let sampler = Sampler::try_new(
                node_records,
                node_records,
                SamplerConfig {
                    seed: self.cfg.seed,
                    ranks_in_node: ranks,
                    rank_in_node: me,
                    replicas: 1,
                    batch_per_replica: batch,
                    tail: Tail::Pad,
                    shuffle: false,
                },
            )?;
            let resize = self.cfg.eval_resize_px();
            let on_bad = match self.cfg.on_bad_record {
                OnBadRecord::Fail => OnBadRecord::Fail,
                OnBadRecord::Replace | OnBadRecord::Skip => OnBadRecord::Skip,
            };
            let pipeline = Pipeline::start(
                val.clone(),
                sampler,
                self.pipeline_config(Augment::Eval { resize }, self.cfg.image_size, on_bad),
                epoch,
                0,
            )?;
            // Positions past the node's records are padding (wrapped around): leave them out.
            let valid = Box::new(move |b: &ddl_loader::pipeline::Batch| {
                let first = (b.step * ranks + me) * batch;
                node_records.saturating_sub(first).min(batch)
            });
            sums = self
                .table
                .evaluate(Box::new(pipeline.replica(0)), valid, &self.comm)?;
            self.collect_bad_records(&pipeline, 0, BadRecordUse::Eval);
        } else if self.cfg.head_parallel {
            // Every replica of the job scores its classes for the others' images.
            sums =
                self.table
                    .evaluate(Box::new(std::iter::empty()), Box::new(|_| 0), &self.comm)?;
        }
        let mut buf = [
            sums.loss as f32,
            sums.top1 as f32,
            sums.top5 as f32,
            sums.count as f32,
            sums.skipped as f32,
        ];
        self.comm.allreduce_sum(&mut buf)?;
        Ok(Some(EvalSums {
            loss: f64::from(buf[0]),
            top1: f64::from(buf[1]),
            top5: f64::from(buf[2]),
            count: f64::from(buf[3]),
            skipped: f64::from(buf[4]),
        }))
    }

    /// Compares parameter checksums of all replicas of all ranks; fails loudly on a mismatch.
    fn check_replicas(&mut self) -> Result<()> {
        self.table.flush(&self.comm)?;
        let local = self.table.checksums()?;
        let all = self.comm.allgather_bytes(u64s_to_bytes(
            &local.iter().map(|&c| u64::from(c)).collect::<Vec<_>>(),
        ))?;
        let all: Vec<Vec<u64>> = all.iter().map(|b| bytes_to_u64s(b)).collect();
        let reference = all[0][0];
        for (r, sums) in all.iter().enumerate() {
            for (i, &c) in sums.iter().enumerate() {
                if c != reference {
                    return Err(TrainError::ReplicaMismatch(format!(
                        "rank {r} replica {i} has parameter checksum {c:08x}, rank 0 replica 0 has {reference:08x}"
                    )));
                }
            }
        }
        Ok(())
    }
}
