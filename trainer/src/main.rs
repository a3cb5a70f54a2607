//! `ddl-train`: data-parallel training of an image classifier on packed shards.
//!
//! Runs as one process per node (or per GPU) under `mpirun`/`srun`, or alone (one rank,
//! without MPI).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use ddl_comm::Transport;
use ddl_comm::{Algorithm, CommOrder, ShardAlgorithm};
use ddl_loader::pipeline::OnBadRecord;
use ddl_trainer::config::{Precision, ResidencyMode};
use ddl_trainer::console::eprint_line;
use ddl_trainer::device::DeviceSpec;
use ddl_trainer::job::Job;
use ddl_trainer::model::ModelKind;
use ddl_trainer::schedule::DecayKind;
use ddl_trainer::signal::StopRequest;
use ddl_trainer::size_schedule::SizeSchedule;
use ddl_trainer::{TrainConfig, TrainError, TrainSummary};

#[path = "cli/flags.rs"]
mod flags;

/// Train an image classifier data-parallel on ddl shards.
#[derive(Parser, Debug)]
#[command(name = "ddl-train", version, about)]
struct Cli {
    /// Directory with manifest.json and the shards written by ddl-pack.
    #[arg(long, required_unless_present = "synthetic_data")]
    data: Option<PathBuf>,
    /// Train on one random batch held on each device, without data, evaluation or checkpoints:
    /// times the model, the table and the allreduce alone (as a PyTorch loop on data already
    /// on the GPU does).
    #[arg(long)]
    synthetic_data: bool,
    /// Classes of the model with --synthetic-data (with data: the manifest's).
    #[arg(long, requires = "synthetic_data")]
    classes: Option<usize>,
    /// cuDNN's deterministic algorithms instead of timing them for the fastest (benchmark mode,
    /// the default): a resumed GPU run is then bitwise the uninterrupted one.
    #[arg(long)]
    deterministic: bool,
    /// The network.
    #[arg(long, value_enum, default_value_t = defaults().model)]
    model: ModelKind,
    /// Epochs to train.
    #[arg(long, default_value_t = defaults().epochs)]
    epochs: u32,
    /// Images per replica per step (global batch = this x replicas x ranks).
    #[arg(long, default_value_t = defaults().batch)]
    batch: usize,
    /// auto (the node's GPUs shared out between its ranks, else one CPU replica) | cpu | cpu:N
    /// | cuda | cuda:0,1,2,3.
    #[arg(long, default_value_t = defaults().devices)]
    devices: DeviceSpec,
    /// Input side in pixels.
    #[arg(long, default_value_t = defaults().image_size)]
    image_size: u32,
    /// Decode threads per rank.
    #[arg(long, default_value_t = defaults().workers)]
    workers: usize,
    /// Ready batches queued per replica.
    #[arg(long, default_value_t = defaults().prefetch)]
    prefetch: usize,
    /// Seed of weights, sampling and augmentation.
    #[arg(long, default_value_t = defaults().seed)]
    seed: u64,
    /// Learning rate per 256 images (peak = base-lr x global batch / 256).
    #[arg(long, default_value_t = defaults().base_lr)]
    base_lr: f64,
    /// Peak learning rate, overriding the linear scaling rule.
    #[arg(long)]
    lr: Option<f64>,
    /// SGD momentum.
    #[arg(long, default_value_t = defaults().momentum)]
    momentum: f64,
    /// Nesterov momentum.
    #[arg(long)]
    nesterov: bool,
    /// Weight decay (not applied to BatchNorm and bias parameters).
    #[arg(long, default_value_t = defaults().weight_decay)]
    weight_decay: f64,
    /// Linear warmup length in epochs (fractions allowed).
    #[arg(long, default_value_t = defaults().warmup_epochs)]
    warmup_epochs: f64,
    /// Learning-rate decay after warmup.
    #[arg(long, value_enum, default_value_t = defaults().schedule)]
    schedule: DecayKind,
    /// Step-decay epochs, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "30,60,80")]
    milestones: Vec<u32>,
    /// Step-decay factor.
    #[arg(long, default_value_t = defaults().gamma)]
    gamma: f64,
    /// Label smoothing of the cross-entropy loss.
    #[arg(long, default_value_t = defaults().label_smoothing)]
    label_smoothing: f64,
    /// Arithmetic of forward and backward (autocast on GPUs; gradients are reduced in f32).
    #[arg(long, value_enum, default_value_t = defaults().precision)]
    precision: Precision,
    /// Write one JSON line per step and per epoch here (rank 0).
    #[arg(long)]
    metrics: Option<PathBuf>,
    /// Write the global ids of the records of every batch trained here, one JSON line per
    /// replica and step: {"epoch", "step", "rank", "replica", "ids"} (every rank; with
    /// several ranks each writes PATH.<rank>; appended to on --resume).
    #[arg(long, value_name = "PATH", conflicts_with = "synthetic_data")]
    trace_records: Option<PathBuf>,
    /// Directory of checkpoints (written by rank 0).
    #[arg(long)]
    checkpoint_dir: Option<PathBuf>,
    /// Also checkpoint every N global steps (0: only at epoch ends).
    #[arg(long, default_value_t = defaults().checkpoint_every)]
    checkpoint_every: u64,
    /// Checkpoints to keep.
    #[arg(long, default_value_t = defaults().keep_checkpoints)]
    keep_checkpoints: usize,
    /// Continue the run whose checkpoints are in --checkpoint-dir, from its newest valid one
    /// (refused when a flag that changes the trajectory differs from the checkpoint's).
    #[arg(long, conflicts_with = "restart")]
    resume: bool,
    /// Start over in a --checkpoint-dir holding another run's checkpoints, moving them into a
    /// dated subdirectory first (nothing is deleted).
    #[arg(long)]
    restart: bool,
    /// With --resume: continue on a different number of ranks, replicas or nodes than the
    /// checkpoint's (not bitwise identical to an uninterrupted run).
    #[arg(long, requires = "resume")]
    allow_new_layout: bool,
    /// Stop after this many global steps (0: none, e.g. to dump the initial weights).
    #[arg(long)]
    max_steps: Option<u64>,
    /// multicolor[:COLORS[:CHUNK_BYTES]] | ring | rhd | multiring[:AxB..] | mpi | auto (the
    /// cost model's pick per buffer size).
    #[arg(long, default_value_t = defaults().allreduce)]
    allreduce: Algorithm,
    /// Cost model for `--allreduce auto`: a file written by `mpirun ddl-bench calibrate` in
    /// this job's layout, whose measured times decide per buffer size (default: formulas).
    #[arg(long)]
    cost_model: Option<PathBuf>,
    /// Without --cost-model, `--allreduce auto` times the candidates on the first calls of
    /// each buffer size and keeps the fastest: write what it found to this file (rank 0,
    /// whenever it settles a size), to give to later jobs of this layout as --cost-model.
    #[arg(long)]
    save_cost_model: Option<PathBuf>,
    /// Split the classifier head (fc) by class over every replica of the job, the backbone
    /// staying data-parallel: each step all-gathers the features and exchanges the softmax's
    /// per-sample sums instead of allreducing the head's gradient (fewer bytes below a global
    /// batch of about the class count; `ddl-plan --head-parallel` prints both).
    #[arg(long)]
    head_parallel: bool,
    /// ring | shm | auto: the allgather and reduce-scatter of --head-parallel.
    #[arg(long, default_value_t = defaults().gather, requires = "head_parallel")]
    gather: ShardAlgorithm,
    /// Write the final replica-0 weights as raw f32 LE to FILE (+ FILE.json index).
    #[arg(long)]
    dump_weights: Option<PathBuf>,
    /// Write the final model to FILE (.safetensors) with torchvision's keys, shapes and dtypes,
    /// so that torchvision.models.NAME(num_classes=C).load_state_dict(load_file(FILE)) works,
    /// and ddl's metadata: classes, eval transform, flags, final val top-1/top-5.
    #[arg(long, value_name = "FILE")]
    export: Option<PathBuf>,
    /// Start from the weights in FILE (.safetensors with torchvision's names, e.g. a state
    /// dict saved from torchvision or a ddl export); a checkpoint --resume finds comes first.
    #[arg(long, value_name = "FILE")]
    init_from: Option<PathBuf>,
    /// With --init-from: re-initialise the classifier head (fc) instead of loading it, to
    /// fine-tune on a dataset with other classes.
    #[arg(long, requires = "init_from")]
    reset_head: bool,
    /// Compare replica parameter checksums (inside and across ranks) every epoch.
    #[arg(long)]
    check_replicas: bool,
    /// How the ranks of a node share the dataset.
    #[arg(long, value_enum, default_value_t = defaults().residency)]
    residency: ResidencyMode,
    /// Fraction Q of every node's train records moved to other nodes at each epoch boundary,
    /// received during the epoch before (0: each node serves its own shards forever; 1: a
    /// global shuffle every epoch). Needs more than one node.
    #[arg(long, default_value_t = defaults().exchange)]
    exchange: f64,
    /// What the gradient allreduce overlaps: backward (staged backward, buckets reduced while
    /// earlier stages are still in backward) | pipeline (after backward, bucket by bucket) |
    /// off | auto (backward for GPU replicas or ranks on more than one node, else off; with
    /// --compile pipeline instead of backward).
    #[arg(long, default_value = "auto", value_parser = ["auto", "backward", "pipeline", "off"])]
    overlap: String,
    /// The order the communication thread reduces the buckets in: fifo (as backward hands them
    /// over, each whole, the next step after all of them) | priority (the first layers' buckets
    /// first, in chunks all ranks agree on, and the next step's forward starts each stage once
    /// its buckets are reduced; priority:CHUNK_BYTES). priority applies with --overlap
    /// backward, several ranks and fp32/bf16; otherwise fifo runs, and the run says why. fifo
    /// is the default: priority gained nothing measurable on the emulated cluster
    /// (BENCHMARKS.md, "Communication priorities").
    #[arg(long, default_value = "fifo")]
    comm_order: CommOrder,
    /// Gradient bucket size in MiB.
    #[arg(long, default_value_t = defaults().bucket_mb)]
    bucket_mb: f64,
    /// Channels-last (NHWC) images, activations and convolution weights.
    #[arg(long)]
    channels_last: bool,
    /// Run the training step (forward, loss, backward) compiled ahead of time by PyTorch's
    /// Inductor, which fuses each block's batch-norm, ReLU and residual add: compiled once per
    /// model, classes, batch, image size, precision, layout, device and torch into
    /// --compile-cache by the Python whose torch ddl-train runs on (DDL_PYTHON to choose
    /// another), then loaded at once. With it --overlap auto is pipeline (the step is one
    /// graph); --overlap backward and --head-parallel are refused.
    #[arg(long)]
    compile: bool,
    /// Where --compile keeps its compiled steps (default: $XDG_CACHE_HOME/ddl/compiled, else
    /// ~/.cache/ddl/compiled).
    #[arg(long, value_name = "DIR", requires = "compile")]
    compile_cache: Option<PathBuf>,
    /// Skip the per-epoch evaluation.
    #[arg(long)]
    no_eval: bool,
    /// Shorter side before the eval center crop (0: image size x --eval-resize-ratio).
    #[arg(long, default_value_t = defaults().eval_resize)]
    eval_resize: u32,
    /// The eval resize as a multiple of the image size, when --eval-resize is 0 (at least 1;
    /// 8/7: 256 for 224).
    #[arg(long, default_value_t = defaults().eval_resize_ratio)]
    eval_resize_ratio: f64,
    /// Progressive resizing: the train image size per epoch, EPOCH:SIZE,... (0:160,10:192:
    /// 160 px from epoch 0, 192 from epoch 10; --image-size before the first listed epoch).
    /// Evaluation stays at --image-size.
    #[arg(long, value_name = "EPOCH:SIZE,...")]
    image_size_schedule: Option<SizeSchedule>,
    /// RandomResizedCrop's range of the crop's area fraction, LO,HI (0 < LO <= HI <= 1).
    #[arg(long, value_delimiter = ',', default_values_t = defaults().crop_scale, value_name = "LO,HI")]
    crop_scale: Vec<f64>,
    /// RandomResizedCrop's range of the crop's aspect ratio (width / height), LO,HI.
    #[arg(long, value_delimiter = ',', default_values_t = defaults().crop_ratio, value_name = "LO,HI")]
    crop_ratio: Vec<f64>,
    /// Probability of a horizontal flip of a train image (0: never, 1: always).
    #[arg(long, default_value_t = defaults().flip_prob)]
    flip_prob: f64,
    /// Channel means of the normalisation, R,G,B on the 0-1 scale.
    #[arg(long, value_delimiter = ',', default_values_t = defaults().mean, value_name = "R,G,B")]
    mean: Vec<f32>,
    /// Channel standard deviations of the normalisation, R,G,B on the 0-1 scale (above 0).
    #[arg(long, value_delimiter = ',', default_values_t = defaults().std, value_name = "R,G,B")]
    std: Vec<f32>,
    /// Pre-fault the node's shards at start.
    #[arg(long)]
    populate: bool,
    /// mlock the node's shards.
    #[arg(long)]
    mlock: bool,
    /// Copy the node's shards to this node-local directory first (e.g. /dev/shm/ddl).
    #[arg(long)]
    stage: Option<PathBuf>,
    /// Seconds a communication operation may block before the job fails.
    #[arg(long, default_value_t = defaults().comm_timeout_s)]
    comm_timeout: u64,
    /// A training record whose checksum or decoding fails: replace (with the next good record
    /// of the epoch) | skip (shorter batch) | fail (stop the run). Each is reported once;
    /// evaluation always leaves bad records out (or fails with `fail`).
    #[arg(long, value_enum, default_value_t = defaults().on_bad_record)]
    on_bad_record: OnBadRecord,
    /// Only errors on stdout/stderr.
    #[arg(long)]
    quiet: bool,
    /// Write a Chrome trace (Perfetto, chrome://tracing) of the run to FILE on rank 0 and to
    /// STEM.rankN.json beside it on rank N (trace.json -> trace.rank1.json).
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
}

/// The defaults of the flags: [`TrainConfig::default`]'s values, so that `ddl-train` and a
/// library user start from the same settings.
fn defaults() -> TrainConfig {
    TrainConfig::default()
}

impl Cli {
    fn config(self, stop: StopRequest) -> anyhow::Result<TrainConfig> {
        Ok(TrainConfig {
            data: self.data.unwrap_or_default(),
            synthetic_data: self.synthetic_data,
            classes: self.classes,
            deterministic: self.deterministic,
            model: self.model,
            epochs: self.epochs,
            batch: self.batch,
            devices: self.devices,
            image_size: self.image_size,
            workers: self.workers,
            prefetch: self.prefetch,
            seed: self.seed,
            base_lr: self.base_lr,
            lr: self.lr,
            momentum: self.momentum,
            nesterov: self.nesterov,
            weight_decay: self.weight_decay,
            warmup_epochs: self.warmup_epochs,
            schedule: self.schedule,
            milestones: self.milestones,
            gamma: self.gamma,
            label_smoothing: self.label_smoothing,
            precision: self.precision,
            metrics: self.metrics,
            trace_records: self.trace_records,
            checkpoint_dir: self.checkpoint_dir,
            checkpoint_every: self.checkpoint_every,
            keep_checkpoints: self.keep_checkpoints,
            resume: self.resume,
            restart: self.restart,
            allow_new_layout: self.allow_new_layout,
            max_steps: self.max_steps,
            allreduce: self.allreduce,
            cost_model: self.cost_model,
            save_cost_model: self.save_cost_model,
            head_parallel: self.head_parallel,
            gather: self.gather,
            dump_weights: self.dump_weights,
            export: self.export,
            init_from: self.init_from,
            reset_head: self.reset_head,
            check_replicas: self.check_replicas,
            residency: self.residency,
            exchange: self.exchange,
            overlap: match self.overlap.as_str() {
                "auto" => None,
                other => Some(other.parse()?),
            },
            comm_order: self.comm_order,
            bucket_mb: self.bucket_mb,
            channels_last: self.channels_last,
            compile: self.compile,
            compile_cache: self.compile_cache,
            eval: !self.no_eval,
            eval_resize: self.eval_resize,
            eval_resize_ratio: self.eval_resize_ratio,
            image_size_schedule: self.image_size_schedule.unwrap_or_default(),
            crop_scale: values("--crop-scale", self.crop_scale)?,
            crop_ratio: values("--crop-ratio", self.crop_ratio)?,
            flip_prob: self.flip_prob,
            mean: values("--mean", self.mean)?,
            std: values("--std", self.std)?,
            populate: self.populate,
            lock: self.mlock,
            stage: self.stage,
            comm_timeout_s: self.comm_timeout,
            on_bad_record: self.on_bad_record,
            verbose: !self.quiet,
            stop,
        })
    }
}

/// The `N` comma-separated values of `flag`, or an error naming it.
fn values<const N: usize, T>(flag: &str, v: Vec<T>) -> anyhow::Result<[T; N]> {
    let n = v.len();
    v.try_into()
        .map_err(|_| anyhow::anyhow!("{flag}: takes {N} comma-separated values, got {n}"))
}

fn main() -> anyhow::Result<()> {
    ddl_comm::cli::init_binary_signals();
    flags::install();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let cli = Cli::parse();
    // Before any thread starts: SIGTERM/SIGINT ask for a stop after the current step; a SIGBUS
    // in a shard mapping names the shard.
    let stop = StopRequest::install().context("installing the SIGTERM/SIGINT handlers")?;
    ddl_loader::fault::report_sigbus().context("installing the SIGBUS report")?;
    let job = Job::start().context("starting the job")?;
    let transport: Arc<dyn Transport> = job.transport();
    let rank = transport.rank();
    let size = transport.size();
    let trace = cli.trace.clone();
    if trace.is_some() {
        ddl_trace::set_pid(rank as u32);
        ddl_trace::set_thread_name("main");
        ddl_trace::enable();
    }
    let cfg = cli.config(stop)?;
    let place = job.info();
    // An error resolving the devices is the run's to report, with the others.
    let devices = cfg
        .devices
        .resolve(place.rank_in_node, place.ranks_in_node)
        .unwrap_or_default();
    job.share_cores(devices.iter().filter(|d| !d.is_cuda()).count());
    let info = job.info();
    if info.rank_in_node == 0 {
        let replicas = devices.len().max(1);
        if let Some(line) = job.binding_warning(cfg.workers + replicas) {
            eprint_line(&format!("ddl-train: {line}"));
        }
    }
    match ddl_trainer::train(&cfg, transport, job.topology(), info) {
        Ok(summary) => {
            if let Some(path) = &trace {
                let path = ddl_trace::rank_path(path, rank);
                let n = ddl_trace::write(&path)?;
                if rank == 0 && cfg.verbose {
                    eprint_line(&format!("trace: {n} spans -> {}", path.display()));
                }
            }
            if rank == 0 && cfg.verbose {
                ddl_comm::outln!(
                    "done: {} global steps ({} in this run), replica-0 parameter crc32c {:08x}",
                    summary.global_steps,
                    summary.steps_run,
                    summary.param_checksum
                );
                if let Some(line) = bad_record_summary(&summary) {
                    ddl_comm::outln!("{line}");
                }
            }
            Ok(())
        }
        Err(e) => {
            if let TrainError::Preempted { signal, .. } = &e {
                // Every rank stopped after the same step: leave MPI together, no abort.
                eprint_line(&format!("ddl-train (rank {rank}): {e}"));
                let code = signal.exit_code();
                drop(job);
                std::process::exit(code);
            }
            eprint_line(&format!("ddl-train (rank {rank}): error: {e}"));
            if size > 1 {
                // Other ranks may be blocked in a collective: take the whole job down.
                job.abort(1);
            }
            std::process::exit(1);
        }
    }
}

/// The end-of-run line about bad records, if there were any.
fn bad_record_summary(summary: &TrainSummary) -> Option<String> {
    if summary.bad_records_train + summary.bad_records_eval == 0 {
        return None;
    }
    const LISTED: usize = 10;
    let mut names: Vec<String> = summary
        .bad_records
        .iter()
        .take(LISTED)
        .map(|b| format!("{} record {}", b.file.display(), b.record))
        .collect();
    if summary.bad_records.len() > LISTED {
        names.push(format!("... {} more", summary.bad_records.len() - LISTED));
    }
    Some(format!(
        "bad records: {} distinct, met {} time(s) in training and left out of evaluation {} \
         time(s): {}",
        summary.bad_records.len(),
        summary.bad_records_train,
        summary.bad_records_eval,
        names.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every flag left out means [`TrainConfig::default`]'s value, milestones (written as the
    /// command line spells them) and the switches (`--no-eval`, `--quiet`) included.
    #[test]
    fn flags_left_out_are_the_library_defaults() {
        let cli = Cli::try_parse_from(["ddl-train", "--data", "shards"]).expect("parse");
        let cfg = cli.config(StopRequest::default()).expect("config");
        let want = TrainConfig {
            data: "shards".into(),
            ..TrainConfig::default()
        };
        let json = |c: &TrainConfig| serde_json::to_value(c).expect("serialize");
        assert_eq!(json(&cfg), json(&want));
    }
}
