//! The training driver of one rank: configuration checks, data, the data-parallel table,
//! the schedule, evaluation, checkpoints, metrics.
//!
//! [`train`] takes any [`Transport`] (MPI between processes, or ddl-comm's in-process thread
//! transport in tests), so the same code runs under `mpirun`/`srun` and inside one test
//! process with several simulated ranks.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ddl_comm::{Algorithm, Topology, Transport};
use ddl_loader::dataset::{Dataset, OpenOptions, Residency};
use ddl_loader::manifest::Manifest;
use ddl_loader::pipeline::{Augment, OnBadRecord, Output, Pipeline, PipelineConfig};
use ddl_loader::sampler::{Sampler, SamplerConfig, Tail};
use serde::Serialize;
use tch::Device;

use crate::checkpoint::{self, Checkpoint, CheckpointMeta, TensorEntry};
use crate::collective::Collective;
use crate::device::parse_devices;
use crate::error::{Result, TrainError};
use crate::metrics::{EpochRecord, MetricsWriter, StepRecord};
use crate::model::ModelKind;
use crate::optim::SgdConfig;
use crate::schedule::{Decay, DecayKind, Schedule};
use crate::table::{BatchIter, EvalSums, Overlap, Precision, ReplicaState, Table, TableConfig};

/// How the ranks of a node share the dataset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ResidencyMode {
    /// The ranks of a node share that node's shards (MPI shared-memory split).
    Node,
    /// Every rank is its own node (to emulate several nodes on one machine).
    Rank,
}

impl std::str::FromStr for ResidencyMode {
    type Err = TrainError;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "node" => Ok(ResidencyMode::Node),
            "rank" => Ok(ResidencyMode::Rank),
            _ => Err(TrainError::config(
                "--residency",
                format!("{s:?} is not node or rank"),
            )),
        }
    }
}

/// Everything a training run is configured with (the `ddl-train` flags).
#[derive(Clone, Debug, Serialize)]
pub struct TrainConfig {
    /// Directory with `manifest.json` and the shards (`--data`).
    pub data: PathBuf,
    /// Network (`--model`).
    pub model: String,
    /// Epochs to train (`--epochs`).
    pub epochs: u32,
    /// Images per replica per step (`--batch`).
    pub batch: usize,
    /// Local devices (`--devices`).
    pub devices: String,
    /// Input side in pixels (`--image-size`).
    pub image_size: u32,
    /// Decode threads per rank (`--workers`).
    pub workers: usize,
    /// Ready batches queued per replica (`--prefetch`).
    pub prefetch: usize,
    /// Seed of weights, sampling and augmentation (`--seed`).
    pub seed: u64,
    /// Base learning rate per 256 images (`--base-lr`).
    pub base_lr: f64,
    /// Peak learning rate, overriding the linear scaling rule (`--lr`).
    pub lr: Option<f64>,
    /// SGD momentum (`--momentum`).
    pub momentum: f64,
    /// Nesterov momentum (`--nesterov`).
    pub nesterov: bool,
    /// Weight decay of conv/linear weights (`--weight-decay`).
    pub weight_decay: f64,
    /// Warmup epochs, fractional allowed (`--warmup-epochs`).
    pub warmup_epochs: f64,
    /// `step` or `cosine` (`--schedule`).
    pub schedule: String,
    /// Step-decay epochs (`--milestones`).
    pub milestones: Vec<u32>,
    /// Step-decay factor (`--gamma`).
    pub gamma: f64,
    /// Label smoothing (`--label-smoothing`).
    pub label_smoothing: f64,
    /// `fp32`, `bf16` or `fp16` (`--precision`).
    pub precision: String,
    /// JSON-lines metrics file written by rank 0 (`--metrics`).
    pub metrics: Option<PathBuf>,
    /// Checkpoint directory (`--checkpoint-dir`).
    pub checkpoint_dir: Option<PathBuf>,
    /// Checkpoint every N global steps, 0 = only at epoch ends (`--checkpoint-every`).
    pub checkpoint_every: u64,
    /// Checkpoints kept (`--keep-checkpoints`).
    pub keep_checkpoints: usize,
    /// Continue from the newest valid checkpoint (`--resume`).
    pub resume: bool,
    /// Stop after this many global steps (`--max-steps`).
    pub max_steps: Option<u64>,
    /// Allreduce algorithm (`--allreduce`).
    pub allreduce: String,
    /// Write final replica-0 weights here (`--dump-weights`).
    pub dump_weights: Option<PathBuf>,
    /// Compare replica checksums every epoch (`--check-replicas`).
    pub check_replicas: bool,
    /// `node` or `rank` (`--residency`).
    pub residency: String,
    /// What the gradient allreduce overlaps with (`--overlap backward|pipeline|off|auto`);
    /// `None` = auto ([`auto_overlap`]).
    pub overlap: Option<Overlap>,
    /// Gradient bucket size in MiB (`--bucket-mb`).
    pub bucket_mb: f64,
    /// Keep images, activations and convolution weights channels-last (NHWC strides,
    /// `--channels-last`), the layout tensor cores prefer.
    pub channels_last: bool,
    /// Evaluate on the val split after every epoch (`--no-eval` turns it off).
    pub eval: bool,
    /// Shorter side before the center crop in evaluation; 0 = image size x 8/7 (`--eval-resize`).
    pub eval_resize: u32,
    /// Pre-fault the node's shards (`--populate`).
    pub populate: bool,
    /// mlock the node's shards (`--mlock`).
    pub lock: bool,
    /// Copy the node's shards here first, e.g. /dev/shm/ddl (`--stage`).
    pub stage: Option<PathBuf>,
    /// Timeout of one communication operation in seconds (`--comm-timeout`).
    pub comm_timeout_s: u64,
    /// Print per-epoch lines (rank 0).
    pub verbose: bool,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            data: PathBuf::new(),
            model: "resnet50".into(),
            epochs: 90,
            batch: 32,
            devices: "auto".into(),
            image_size: 224,
            workers: 2,
            prefetch: 4,
            seed: 0,
            base_lr: 0.1,
            lr: None,
            momentum: 0.9,
            nesterov: false,
            weight_decay: 1e-4,
            warmup_epochs: 5.0,
            schedule: "step".into(),
            milestones: vec![30, 60, 80],
            gamma: 0.1,
            label_smoothing: 0.0,
            precision: "fp32".into(),
            metrics: None,
            checkpoint_dir: None,
            checkpoint_every: 0,
            keep_checkpoints: 3,
            resume: false,
            max_steps: None,
            allreduce: "auto".into(),
            dump_weights: None,
            check_replicas: false,
            residency: "node".into(),
            overlap: None,
            bucket_mb: 25.0,
            channels_last: false,
            eval: true,
            eval_resize: 0,
            populate: false,
            lock: false,
            stage: None,
            comm_timeout_s: 600,
            verbose: true,
        }
    }
}

/// Where this process sits in the job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankInfo {
    /// Node index (MPI shared-memory split).
    pub node: usize,
    /// Number of nodes.
    pub nodes: usize,
    /// Rank within the node.
    pub rank_in_node: usize,
    /// Ranks on this node (assumed equal on every node).
    pub ranks_in_node: usize,
}

impl RankInfo {
    /// A single process: one node, one rank.
    pub fn single() -> RankInfo {
        RankInfo {
            node: 0,
            nodes: 1,
            rank_in_node: 0,
            ranks_in_node: 1,
        }
    }
}

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
    /// crc32c of replica 0's parameters at the end.
    pub param_checksum: u32,
}

/// Validated, derived settings.
struct Plan {
    model: ModelKind,
    precision: Precision,
    decay: Decay,
    algorithm: Algorithm,
    residency: Residency,
    ranks_in_node: usize,
    rank_in_node: usize,
    devices: Vec<Device>,
    manifest: Manifest,
}

/// Checks the configuration before anything expensive happens; every error names its flag.
/// `--overlap auto`: backward when the replicas are GPUs (the communication thread has cores
/// of its own) or the ranks span more than one node (the allreduce crosses a network and is
/// worth hiding); off for CPU replicas on one node, where the allreduce is a shared-memory
/// copy and the communication thread would only take cores from the replicas. Measured in
/// BENCHMARKS.md (resnet18, 2 ranks x 1 CPU replica: 1 Gbit/s between two nodes, backward
/// 1.19x the images/s of off; shared memory, 0.96x).
pub fn auto_overlap(gpus: bool, nodes: usize) -> Overlap {
    if gpus || nodes > 1 {
        Overlap::Backward
    } else {
        Overlap::Off
    }
}

fn plan(cfg: &TrainConfig, rank: usize, world: usize, info: RankInfo) -> Result<Plan> {
    let model: ModelKind = cfg.model.parse()?;
    let precision: Precision = cfg.precision.parse()?;
    let decay = match cfg.schedule.parse::<DecayKind>()? {
        DecayKind::Step => {
            if cfg.milestones.windows(2).any(|w| w[0] >= w[1]) {
                return Err(TrainError::config(
                    "--milestones",
                    "epochs must be strictly increasing",
                ));
            }
            Decay::Step {
                milestones: cfg.milestones.clone(),
                gamma: cfg.gamma,
            }
        }
        DecayKind::Cosine => Decay::Cosine,
    };
    let algorithm: Algorithm = cfg
        .allreduce
        .parse()
        .map_err(|e: ddl_comm::CommError| TrainError::config("--allreduce", e.to_string()))?;
    let mode: ResidencyMode = cfg.residency.parse()?;
    if cfg.batch == 0 {
        return Err(TrainError::config("--batch", "must be at least 1"));
    }
    if cfg.epochs == 0 {
        return Err(TrainError::config("--epochs", "must be at least 1"));
    }
    if cfg.workers == 0 {
        return Err(TrainError::config("--workers", "must be at least 1"));
    }
    if cfg.prefetch == 0 {
        return Err(TrainError::config("--prefetch", "must be at least 1"));
    }
    if cfg.image_size < 16 {
        return Err(TrainError::config(
            "--image-size",
            format!("{} is below 16 pixels", cfg.image_size),
        ));
    }
    if !(0.0..1.0).contains(&cfg.label_smoothing) {
        return Err(TrainError::config("--label-smoothing", "must be in [0, 1)"));
    }
    if cfg.warmup_epochs < 0.0 || !cfg.warmup_epochs.is_finite() {
        return Err(TrainError::config("--warmup-epochs", "must be >= 0"));
    }
    if cfg.bucket_mb.is_nan() || cfg.bucket_mb <= 0.0 {
        return Err(TrainError::config("--bucket-mb", "must be positive"));
    }
    if cfg.keep_checkpoints == 0 {
        return Err(TrainError::config(
            "--keep-checkpoints",
            "must be at least 1",
        ));
    }
    if cfg.resume && cfg.checkpoint_dir.is_none() {
        return Err(TrainError::config("--resume", "needs --checkpoint-dir"));
    }
    if !cfg.data.is_dir() {
        return Err(TrainError::config(
            "--data",
            format!("{} is not a directory", cfg.data.display()),
        ));
    }
    if !cfg.data.join(ddl_loader::manifest::MANIFEST_FILE).is_file() {
        return Err(TrainError::config(
            "--data",
            format!(
                "{} has no {} (pack it with ddl-pack)",
                cfg.data.display(),
                ddl_loader::manifest::MANIFEST_FILE
            ),
        ));
    }
    let manifest =
        Manifest::load(&cfg.data).map_err(|e| TrainError::config("--data", e.to_string()))?;
    if manifest.num_classes() < 2 {
        return Err(TrainError::config(
            "--data",
            "the manifest lists fewer than 2 classes",
        ));
    }
    let train_shards = manifest
        .splits
        .get("train")
        .map(|s| s.shards.len())
        .unwrap_or(0);
    if train_shards == 0 {
        return Err(TrainError::config(
            "--data",
            "the manifest has no train split",
        ));
    }
    let (residency, ranks_in_node, rank_in_node) = match mode {
        ResidencyMode::Node => (
            Residency {
                node: info.node,
                nodes: info.nodes,
            },
            info.ranks_in_node,
            info.rank_in_node,
        ),
        ResidencyMode::Rank => (
            Residency {
                node: rank,
                nodes: world,
            },
            1,
            0,
        ),
    };
    if residency.nodes > train_shards {
        return Err(TrainError::config(
            "--residency",
            format!(
                "{} nodes (ranks with --residency rank) but only {train_shards} train shards: every node needs one; \
                 repack with more shards or use fewer ranks",
                residency.nodes
            ),
        ));
    }
    let devices = parse_devices(&cfg.devices, info.rank_in_node, info.ranks_in_node)?;
    Ok(Plan {
        model,
        precision,
        decay,
        algorithm,
        residency,
        ranks_in_node,
        rank_in_node,
        devices,
        manifest,
    })
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// Encodes u64 values as bytes (for the control plane).
fn u64s_to_bytes(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn bytes_to_u64s(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
        .collect()
}

fn f32s_to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn bytes_to_f32s(b: &[u8]) -> Vec<f32> {
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

struct Run<'a> {
    cfg: &'a TrainConfig,
    plan: Plan,
    comm: Collective,
    table: Table,
    schedule: Schedule,
    train_set: Arc<Dataset>,
    sampler: Sampler,
    val_set: Option<Arc<Dataset>>,
    metrics: Option<MetricsWriter>,
    summary: TrainSummary,
    bar: Option<indicatif::ProgressBar>,
}

/// Trains on this rank. Collective: every rank of `transport` must call it with the same
/// configuration. `topology` describes the physical layout for the allreduce cost model.
pub fn train(
    cfg: &TrainConfig,
    transport: Arc<dyn Transport>,
    topology: Topology,
    info: RankInfo,
) -> Result<TrainSummary> {
    let rank = transport.rank();
    let world = transport.size();
    transport.set_timeout(Duration::from_secs(cfg.comm_timeout_s.max(1)));
    let plan = plan(cfg, rank, world, info)?;
    let comm = Collective::new(transport, plan.algorithm.clone(), topology)?;

    // Every rank must have the same number of replicas: the sampler and the average assume it.
    let replicas = plan.devices.len();
    let counts = comm.allgather_bytes(u64s_to_bytes(&[replicas as u64]))?;
    if counts.iter().any(|c| bytes_to_u64s(c) != [replicas as u64]) {
        let all: Vec<u64> = counts.iter().flat_map(|c| bytes_to_u64s(c)).collect();
        return Err(TrainError::config(
            "--devices",
            format!("ranks have different replica counts {all:?}"),
        ));
    }
    let global_replicas = replicas * world;

    let opts = OpenOptions {
        populate: cfg.populate,
        lock: cfg.lock,
        stage: cfg.stage.clone(),
    };
    let train_set = Arc::new(Dataset::open(&cfg.data, "train", plan.residency, &opts)?);
    let per_node = Dataset::records_per_node(&plan.manifest, "train", plan.residency.nodes);
    let min_node = per_node.iter().copied().min().unwrap_or(0) as usize;
    let sampler = Sampler::try_new(
        train_set.len(),
        min_node,
        SamplerConfig {
            seed: cfg.seed,
            ranks_in_node: plan.ranks_in_node,
            rank_in_node: plan.rank_in_node,
            replicas,
            batch_per_replica: cfg.batch,
            tail: Tail::Drop,
            shuffle: true,
        },
    )
    .map_err(|e| TrainError::config("--batch", e.to_string()))?;
    let steps_per_epoch = sampler.steps_per_epoch() as u64;
    if steps_per_epoch == 0 {
        return Err(TrainError::config(
            "--batch",
            format!(
                "the smallest node holds {min_node} train records, fewer than one step consumes \
                 ({} ranks x {replicas} replicas x {} images)",
                plan.ranks_in_node, cfg.batch
            ),
        ));
    }
    let val_set = if cfg.eval && plan.manifest.splits.contains_key("val") {
        let per_node = Dataset::records_per_node(&plan.manifest, "val", plan.residency.nodes);
        if per_node[plan.residency.node] > 0 {
            Some(Arc::new(Dataset::open(
                &cfg.data,
                "val",
                plan.residency,
                &opts,
            )?))
        } else {
            None
        }
    } else {
        None
    };

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
    let gpus = plan.devices.iter().any(|d| d.is_cuda());
    let overlap = cfg
        .overlap
        .unwrap_or_else(|| auto_overlap(gpus, info.nodes));
    let table = Table::new(TableConfig {
        devices: plan.devices.clone(),
        model: plan.model,
        classes: plan.manifest.num_classes() as i64,
        image_size: cfg.image_size,
        seed: cfg.seed,
        sgd: SgdConfig {
            momentum: cfg.momentum,
            nesterov: cfg.nesterov,
            weight_decay: cfg.weight_decay,
        },
        precision: plan.precision,
        label_smoothing: cfg.label_smoothing,
        bucket_bytes: (cfg.bucket_mb * 1024.0 * 1024.0) as usize,
        overlap,
        channels_last: cfg.channels_last,
        global_replicas,
    })?;
    let bar = (rank == 0 && cfg.verbose && std::io::stderr().is_terminal()).then(|| {
        let b = indicatif::ProgressBar::new(steps_per_epoch);
        b.set_style(
            indicatif::ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    if rank == 0 && cfg.verbose {
        let devs: Vec<String> = plan.devices.iter().map(|d| format!("{d:?}")).collect();
        println!(
            "ddl-train: {} on {} rank(s) x {} replica(s) [{}], {} classes, {} train images/node (min), \
             global batch {}, peak lr {:.4}, {} steps/epoch, allreduce {}, overlap {}, {} bucket(s)",
            plan.model,
            world,
            replicas,
            devs.join(","),
            plan.manifest.num_classes(),
            min_node,
            global_batch,
            schedule.peak,
            steps_per_epoch,
            plan.algorithm,
            overlap.name(),
            table.layout().buckets.len(),
        );
    }
    let run = Run {
        cfg,
        plan,
        comm,
        table,
        schedule,
        train_set,
        sampler,
        val_set,
        metrics: None,
        summary: TrainSummary::default(),
        bar,
    };
    run.go()
}

impl Run<'_> {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn is_root(&self) -> bool {
        self.rank() == 0
    }

    fn go(mut self) -> Result<TrainSummary> {
        let (mut epoch, mut step, mut global) = (0u64, 0u64, 0u64);
        if self.cfg.resume {
            if let Some((e, s, g)) = self.resume()? {
                (epoch, step, global) = (e, s, g);
            }
        }
        if let Some(path) = &self.cfg.metrics {
            if self.is_root() {
                self.metrics = Some(MetricsWriter::open(
                    path,
                    self.summary.resumed_from.is_some(),
                )?);
            }
        }
        if self.cfg.check_replicas {
            self.check_replicas()?;
        }
        let steps_per_epoch = self.schedule.steps_per_epoch;
        let max_steps = self.cfg.max_steps.unwrap_or(u64::MAX);
        let mut stopped = global >= max_steps;
        while epoch < u64::from(self.cfg.epochs) && !stopped {
            let epoch_start = Instant::now();
            let pipeline = Pipeline::start(
                self.train_set.clone(),
                self.sampler.clone(),
                self.pipeline_config(Augment::Train),
                epoch,
                step as usize,
            )?;
            let sources: Vec<BatchIter> = (0..self.table.replicas())
                .map(|r| Box::new(pipeline.replica(r)) as BatchIter)
                .collect();
            self.table.attach(sources)?;
            if let Some(b) = &self.bar {
                b.set_prefix(format!("epoch {epoch}"));
                b.set_position(step);
            }
            let mut acc = EpochAcc::default();
            while step < steps_per_epoch {
                if global >= max_steps {
                    break;
                }
                let lr = self.schedule.lr(global);
                let comm = &self.comm;
                let stats = self
                    .table
                    .step(lr, &mut |buf: &mut [f32]| comm.allreduce_sum(buf))?;
                if !stats.loss.is_finite() {
                    return Err(TrainError::NonFinite { step: global });
                }
                step += 1;
                global += 1;
                self.summary.steps_run += 1;
                let world = self.comm.size() as f64;
                let images = stats.images as f64 * world;
                acc.add(&stats);
                if let Some(m) = &mut self.metrics {
                    m.write(&StepRecord {
                        kind: "step",
                        step: global,
                        epoch,
                        loss: stats.loss,
                        lr,
                        images_per_s: images / secs(stats.wall).max(1e-9),
                        data_wait_s: secs(stats.data_wait),
                        compute_s: secs(stats.compute),
                        allreduce_s: secs(stats.allreduce),
                    })?;
                }
                if let Some(b) = &self.bar {
                    b.set_position(step);
                    b.set_message(format!("loss {:.4} lr {:.4}", stats.loss, lr));
                }
                let (ce, ck_step) = if step == steps_per_epoch {
                    (epoch + 1, 0)
                } else {
                    (epoch, step)
                };
                let every =
                    self.cfg.checkpoint_every > 0 && global % self.cfg.checkpoint_every == 0;
                let last = global >= max_steps && step < steps_per_epoch;
                if (every || last) && step < steps_per_epoch {
                    self.save_checkpoint(ce, ck_step, global)?;
                }
            }
            drop(pipeline);
            let epoch_s = epoch_start.elapsed();
            if step < steps_per_epoch {
                // Stopped by --max-steps inside the epoch.
                break;
            }
            let val = self.evaluate(epoch)?;
            if self.cfg.check_replicas {
                self.check_replicas()?;
            }
            let record = self.epoch_record(epoch, &acc, epoch_s, val)?;
            if self.is_root() {
                if let Some(b) = &self.bar {
                    b.finish_and_clear();
                }
                if self.cfg.verbose {
                    println!(
                        "epoch {:>3}  train loss {:.4}  val top-1 {}  top-5 {}  {:.1} images/s  data-wait {:.1}%  allreduce {:.1}%  ({:.1} s)",
                        record.epoch,
                        record.train_loss,
                        record.val_top1.map_or("-".to_string(), |v| format!("{:.2}%", v * 100.0)),
                        record.val_top5.map_or("-".to_string(), |v| format!("{:.2}%", v * 100.0)),
                        record.images_per_s,
                        record.data_wait_frac * 100.0,
                        record.allreduce_frac * 100.0,
                        record.epoch_s,
                    );
                }
                if let Some(m) = &mut self.metrics {
                    m.write(&record)?;
                }
            }
            self.summary.epochs.push(record);
            epoch += 1;
            step = 0;
            self.save_checkpoint(epoch, 0, global)?;
            stopped = global >= max_steps;
        }
        self.summary.global_steps = global;
        let sums = self.table.checksums()?;
        self.summary.param_checksum = sums[0];
        if let Some(path) = &self.cfg.dump_weights {
            if self.is_root() {
                self.dump_weights(path)?;
            }
        }
        Ok(self.summary)
    }

    fn pipeline_config(&self, augment: Augment) -> PipelineConfig {
        let gpu = self.plan.devices.iter().any(|d| d.is_cuda());
        PipelineConfig {
            image_size: self.cfg.image_size,
            // On GPUs ship bytes and normalise on the device; on the CPU the loader normalises.
            output: if gpu { Output::U8Nhwc } else { Output::F32Nchw },
            augment,
            workers: self.cfg.workers,
            prefetch: self.cfg.prefetch,
            seed: self.cfg.seed,
            on_bad_record: OnBadRecord::Replace,
            ..PipelineConfig::default()
        }
    }

    /// Evaluates replica 0 on this rank's part of the node's val records, then sums over ranks.
    fn evaluate(&mut self, epoch: u64) -> Result<Option<EvalSums>> {
        if !self.cfg.eval || !self.plan.manifest.splits.contains_key("val") {
            return Ok(None);
        }
        let _span = ddl_trace::span_args("eval", "train", &[("epoch", epoch as i64)]);
        let mut sums = EvalSums::default();
        if let Some(val) = &self.val_set {
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
            let resize = if self.cfg.eval_resize > 0 {
                self.cfg.eval_resize
            } else {
                (self.cfg.image_size * 8).div_ceil(7)
            };
            let pipeline = Pipeline::start(
                val.clone(),
                sampler,
                self.pipeline_config(Augment::Eval { resize }),
                epoch,
                0,
            )?;
            // Positions past the node's records are padding (wrapped around): leave them out.
            let valid = Box::new(move |b: &ddl_loader::pipeline::Batch| {
                let first = (b.step * ranks + me) * batch;
                node_records.saturating_sub(first).min(batch)
            });
            sums = self.table.evaluate(Box::new(pipeline.replica(0)), valid)?;
        }
        let mut buf = [
            sums.loss as f32,
            sums.top1 as f32,
            sums.top5 as f32,
            sums.count as f32,
        ];
        self.comm.allreduce_sum(&mut buf)?;
        Ok(Some(EvalSums {
            loss: f64::from(buf[0]),
            top1: f64::from(buf[1]),
            top5: f64::from(buf[2]),
            count: f64::from(buf[3]),
        }))
    }

    fn epoch_record(
        &self,
        epoch: u64,
        acc: &EpochAcc,
        epoch_s: Duration,
        val: Option<EvalSums>,
    ) -> Result<EpochRecord> {
        let wall = acc.wall.max(1e-9);
        let mut buf = [
            acc.loss as f32,
            acc.steps as f32,
            acc.images as f32,
            (acc.data_wait / wall) as f32,
            (acc.allreduce / wall) as f32,
        ];
        self.comm.allreduce_sum(&mut buf)?;
        let world = self.comm.size() as f64;
        let steps = f64::from(buf[1]).max(1.0);
        let val = val.filter(|v| v.count > 0.0);
        Ok(EpochRecord {
            kind: "epoch",
            epoch,
            train_loss: f64::from(buf[0]) / steps,
            val_loss: val.map(|v| v.loss / v.count),
            val_top1: val.map(|v| v.top1 / v.count),
            val_top5: val.map(|v| v.top5 / v.count),
            val_images: val.map(|v| v.count as u64),
            epoch_s: secs(epoch_s),
            images_per_s: f64::from(buf[2]) / secs(epoch_s).max(1e-9),
            data_wait_frac: f64::from(buf[3]) / world,
            allreduce_frac: f64::from(buf[4]) / world,
            steps: acc.steps,
        })
    }

    /// Compares parameter checksums of all replicas of all ranks; fails loudly on a mismatch.
    fn check_replicas(&mut self) -> Result<()> {
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

    /// Writes a checkpoint positioned at (`epoch`, `step`) after `global` steps. Collective:
    /// rank 0 gathers every rank's BatchNorm buffers and writes one file.
    fn save_checkpoint(&mut self, epoch: u64, step: u64, global: u64) -> Result<()> {
        let Some(dir) = self.cfg.checkpoint_dir.clone() else {
            return Ok(());
        };
        let _span = ddl_trace::span_args(
            "checkpoint",
            "train",
            &[("epoch", epoch as i64), ("step", global as i64)],
        );
        let states = self.table.states()?;
        let gathered = self.comm.gather_bytes(encode_buffers(&states))?;
        let Some(gathered) = gathered else {
            return Ok(());
        };
        let layout = self.table.layout();
        let mut tensors = Vec::new();
        let mut data = Vec::new();
        for (i, p) in layout.params.iter().enumerate() {
            tensors.push(TensorEntry {
                name: format!("param/{}", p.name),
                shape: p.shape.clone(),
            });
            data.push(states[0].params[i].clone());
        }
        for (i, p) in layout.params.iter().enumerate() {
            tensors.push(TensorEntry {
                name: format!("momentum/{}", p.name),
                shape: p.shape.clone(),
            });
            data.push(states[0].momentum[i].clone());
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
        let ck = Checkpoint {
            meta: CheckpointMeta {
                model: self.plan.model.name().to_string(),
                classes: self.plan.manifest.num_classes() as i64,
                epoch,
                step,
                global_step: global,
                ranks: self.comm.size(),
                replicas,
                loss_scale,
                good_steps,
                flags: serde_json::to_value(self.cfg).unwrap_or_default(),
                tensors,
            },
            data,
        };
        ck.write(&dir)?;
        checkpoint::prune(&dir, self.cfg.keep_checkpoints)?;
        Ok(())
    }

    /// Loads the newest valid checkpoint (rank 0 reads it and broadcasts its bytes, so only
    /// rank 0 needs to see the checkpoint directory). Returns (epoch, step, global step).
    fn resume(&mut self) -> Result<Option<(u64, u64, u64)>> {
        let Some(dir) = self.cfg.checkpoint_dir.clone() else {
            return Ok(None);
        };
        let mut bytes = Vec::new();
        let mut from = None;
        if self.is_root() {
            let checkpoint::Found {
                checkpoint: found,
                warnings,
            } = checkpoint::newest_valid(&dir)?;
            for w in &warnings {
                tracing::warn!("{w}");
                eprintln!("warning: {w}");
            }
            self.summary.warnings.extend(warnings);
            if let Some((path, ck)) = found {
                bytes = ck.to_bytes()?;
                from = Some(path);
            }
        }
        let bytes = self.comm.broadcast_bytes(bytes)?;
        if bytes.is_empty() {
            if self.is_root() && self.cfg.verbose {
                println!(
                    "resume: no checkpoint in {}, starting from scratch",
                    dir.display()
                );
            }
            return Ok(None);
        }
        let path = from.clone().unwrap_or_else(|| dir.clone());
        let ck = Checkpoint::from_bytes(&bytes, &path)?;
        let bad = |m: String| TrainError::Checkpoint {
            path: path.clone(),
            message: m,
        };
        if ck.meta.model != self.plan.model.name() {
            return Err(bad(format!(
                "written for model {}, this run trains {}",
                ck.meta.model, self.plan.model
            )));
        }
        if ck.meta.classes != self.plan.manifest.num_classes() as i64 {
            return Err(bad(format!(
                "has {} classes, the data has {}",
                ck.meta.classes,
                self.plan.manifest.num_classes()
            )));
        }
        if ck.meta.ranks != self.comm.size() || ck.meta.replicas != self.table.replicas() {
            let w = format!(
                "checkpoint written by {} rank(s) x {} replica(s), resuming on {} x {}: BatchNorm statistics are \
                 taken from matching replicas modulo the old counts; the run will not be bitwise identical",
                ck.meta.ranks,
                ck.meta.replicas,
                self.comm.size(),
                self.table.replicas()
            );
            if self.is_root() {
                eprintln!("warning: {w}");
            }
            self.summary.warnings.push(w);
        }
        let layout = self.table.layout().clone();
        let get = |name: String| {
            ck.get(&name)
                .map(<[f32]>::to_vec)
                .ok_or_else(|| bad(format!("tensor {name} missing")))
        };
        let params = layout
            .params
            .iter()
            .map(|p| get(format!("param/{}", p.name)))
            .collect::<Result<Vec<_>>>()?;
        let momentum = layout
            .params
            .iter()
            .map(|p| get(format!("momentum/{}", p.name)))
            .collect::<Result<Vec<_>>>()?;
        let rank = self.rank();
        for r in 0..self.table.replicas() {
            let (cr, ci) = (rank % ck.meta.ranks.max(1), r % ck.meta.replicas.max(1));
            let buffers = layout
                .buffers
                .iter()
                .map(|(n, _)| get(format!("buffer/{cr}/{ci}/{n}")))
                .collect::<Result<Vec<_>>>()?;
            self.table.set_state(
                r,
                ReplicaState {
                    params: params.clone(),
                    momentum: momentum.clone(),
                    buffers,
                },
            )?;
        }
        self.table
            .set_loss_scale(ck.meta.loss_scale, ck.meta.good_steps);
        if self.is_root() && self.cfg.verbose {
            println!(
                "resume: {} (epoch {}, step {}, global step {})",
                path.display(),
                ck.meta.epoch,
                ck.meta.step,
                ck.meta.global_step
            );
        }
        self.summary.resumed_from = from.or(Some(path));
        Ok(Some((ck.meta.epoch, ck.meta.step, ck.meta.global_step)))
    }

    /// Writes replica 0's parameters and buffers as raw little-endian f32 to `path` and an
    /// index to `path.json`: `{"dtype": "f32", "tensors": [{"name", "shape", "offset"}]}` with
    /// offsets in elements.
    fn dump_weights(&self, path: &Path) -> Result<()> {
        let states = self.table.states()?;
        let layout = self.table.layout();
        let mut raw = Vec::new();
        let mut index = Vec::new();
        let mut offset = 0usize;
        let named = layout
            .params
            .iter()
            .map(|p| (&p.name, &p.shape))
            .zip(states[0].params.iter())
            .chain(
                layout
                    .buffers
                    .iter()
                    .map(|(n, s)| (n, s))
                    .zip(states[0].buffers.iter()),
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

#[derive(Default)]
struct EpochAcc {
    loss: f64,
    steps: u64,
    images: f64,
    wall: f64,
    data_wait: f64,
    allreduce: f64,
}

impl EpochAcc {
    fn add(&mut self, s: &crate::table::StepStats) {
        self.loss += s.loss;
        self.steps += 1;
        self.images += s.images as f64;
        self.wall += secs(s.wall);
        self.data_wait += secs(s.data_wait);
        self.allreduce += secs(s.allreduce);
    }
}
