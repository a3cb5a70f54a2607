//! `ddl-train`'s command line: its flags, their help and defaults ([`TrainConfig::default`]'s),
//! and the one conversion into a [`TrainConfig`] ([`Args::config`]). Each flag's argument id
//! is its field of the configuration (`--no-eval` sets `eval`), so that messages name the flag
//! of each setting ([`ddl_trainer::setting::spell_as_flags_of`]).

use std::path::PathBuf;

use clap::{ArgAction, Parser};
use ddl_comm::{Algorithm, CommOrder, ShardAlgorithm};
use ddl_loader::pipeline::OnBadRecord;

use ddl_trainer::config::{Precision, ResidencyMode};
use ddl_trainer::device::DeviceSpec;
use ddl_trainer::model::ModelKind;
use ddl_trainer::schedule::DecayKind;
use ddl_trainer::signal::StopRequest;
use ddl_trainer::size_schedule::SizeSchedule;
use ddl_trainer::TrainConfig;

/// Train an image classifier data-parallel on ddl shards.
#[derive(Parser, Debug)]
#[command(name = "ddl-train", version, about)]
pub struct Args {
    /// Directory with manifest.json and the shards written by ddl-pack.
    #[arg(long, required_unless_present = "synthetic_data")]
    pub data: Option<PathBuf>,
    /// Train on one random batch held on each device, without data, evaluation or checkpoints:
    /// times the model, the table and the allreduce alone (as a PyTorch loop on data already
    /// on the GPU does).
    #[arg(long)]
    pub synthetic_data: bool,
    /// Classes of the model with --synthetic-data (with data: the manifest's).
    #[arg(long, requires = "synthetic_data")]
    pub classes: Option<usize>,
    /// cuDNN's deterministic algorithms instead of timing them for the fastest (benchmark mode,
    /// the default): a resumed GPU run is then bitwise the uninterrupted one.
    #[arg(long)]
    pub deterministic: bool,
    /// The network.
    #[arg(long, value_enum, default_value_t = defaults().model)]
    pub model: ModelKind,
    /// Epochs to train.
    #[arg(long, default_value_t = defaults().epochs)]
    pub epochs: u32,
    /// Images per replica per step (global batch = this x replicas x ranks).
    #[arg(long, default_value_t = defaults().batch)]
    pub batch: usize,
    /// auto (the node's GPUs shared out between its ranks, else one CPU replica) | cpu | cpu:N
    /// | cuda | cuda:0,1,2,3.
    #[arg(long, default_value_t = defaults().devices)]
    pub devices: DeviceSpec,
    /// Input side in pixels.
    #[arg(long, default_value_t = defaults().image_size)]
    pub image_size: u32,
    /// Decode threads per rank.
    #[arg(long, default_value_t = defaults().workers)]
    pub workers: usize,
    /// Ready batches queued per replica.
    #[arg(long, default_value_t = defaults().prefetch)]
    pub prefetch: usize,
    /// Seed of weights, sampling and augmentation.
    #[arg(long, default_value_t = defaults().seed)]
    pub seed: u64,
    /// Learning rate per 256 images (peak = base-lr x global batch / 256).
    #[arg(long, default_value_t = defaults().base_lr)]
    pub base_lr: f64,
    /// Peak learning rate, overriding the linear scaling rule.
    #[arg(long)]
    pub lr: Option<f64>,
    /// SGD momentum.
    #[arg(long, default_value_t = defaults().momentum)]
    pub momentum: f64,
    /// Nesterov momentum.
    #[arg(long)]
    pub nesterov: bool,
    /// Weight decay (not applied to BatchNorm and bias parameters).
    #[arg(long, default_value_t = defaults().weight_decay)]
    pub weight_decay: f64,
    /// Linear warmup length in epochs (fractions allowed).
    #[arg(long, default_value_t = defaults().warmup_epochs)]
    pub warmup_epochs: f64,
    /// Learning-rate decay after warmup.
    #[arg(long, value_enum, default_value_t = defaults().schedule)]
    pub schedule: DecayKind,
    /// Step-decay epochs, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "30,60,80")]
    pub milestones: Vec<u32>,
    /// Step-decay factor.
    #[arg(long, default_value_t = defaults().gamma)]
    pub gamma: f64,
    /// Label smoothing of the cross-entropy loss.
    #[arg(long, default_value_t = defaults().label_smoothing)]
    pub label_smoothing: f64,
    /// Arithmetic of forward and backward (autocast on GPUs; gradients are reduced in f32).
    #[arg(long, value_enum, default_value_t = defaults().precision)]
    pub precision: Precision,
    /// Write one JSON line per step and per epoch here (rank 0).
    #[arg(long)]
    pub metrics: Option<PathBuf>,
    /// Write the global ids of the records of every batch trained here, one JSON line per
    /// replica and step: {"epoch", "step", "rank", "replica", "ids"} (every rank; with
    /// several ranks each writes PATH.<rank>; appended to on --resume).
    #[arg(long, value_name = "PATH", conflicts_with = "synthetic_data")]
    pub trace_records: Option<PathBuf>,
    /// Directory of checkpoints (written by rank 0).
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,
    /// Also checkpoint every N global steps (0: only at epoch ends).
    #[arg(long, default_value_t = defaults().checkpoint_every)]
    pub checkpoint_every: u64,
    /// Checkpoints to keep.
    #[arg(long, default_value_t = defaults().keep_checkpoints)]
    pub keep_checkpoints: usize,
    /// Continue the run whose checkpoints are in --checkpoint-dir, from its newest valid one
    /// (refused when a flag that changes the trajectory differs from the checkpoint's).
    #[arg(long, conflicts_with = "restart")]
    pub resume: bool,
    /// Start over in a --checkpoint-dir holding another run's checkpoints, moving them into a
    /// dated subdirectory first (nothing is deleted).
    #[arg(long)]
    pub restart: bool,
    /// With --resume: continue on a different number of ranks, replicas or nodes than the
    /// checkpoint's (not bitwise identical to an uninterrupted run).
    #[arg(long, requires = "resume")]
    pub allow_new_layout: bool,
    /// Stop after this many global steps (0: none, e.g. to dump the initial weights).
    #[arg(long)]
    pub max_steps: Option<u64>,
    /// multicolor[:COLORS[:CHUNK_BYTES]] | ring | rhd | multiring[:AxB..] | mpi | auto (the
    /// cost model's pick per buffer size).
    #[arg(long, default_value_t = defaults().allreduce)]
    pub allreduce: Algorithm,
    /// Cost model for `--allreduce auto`: a file written by `mpirun ddl-bench calibrate` in
    /// this job's layout, whose measured times decide per buffer size (default: formulas).
    #[arg(long)]
    pub cost_model: Option<PathBuf>,
    /// Without --cost-model, `--allreduce auto` times the candidates on the first calls of
    /// each buffer size and keeps the fastest: write what it found to this file (rank 0,
    /// whenever it settles a size), to give to later jobs of this layout as --cost-model.
    #[arg(long)]
    pub save_cost_model: Option<PathBuf>,
    /// Split the classifier head (fc) by class over every replica of the job, the backbone
    /// staying data-parallel: each step all-gathers the features and exchanges the softmax's
    /// per-sample sums instead of allreducing the head's gradient (fewer bytes below a global
    /// batch of about the class count; `ddl-plan --head-parallel` prints both).
    #[arg(long)]
    pub head_parallel: bool,
    /// ring | shm | auto: the allgather and reduce-scatter of --head-parallel.
    #[arg(long, default_value_t = defaults().gather, requires = "head_parallel")]
    pub gather: ShardAlgorithm,
    /// Write the final replica-0 weights as raw f32 LE to FILE (+ FILE.json index).
    #[arg(long)]
    pub dump_weights: Option<PathBuf>,
    /// Write the final model to FILE (.safetensors) with torchvision's keys, shapes and dtypes,
    /// so that torchvision.models.NAME(num_classes=C).load_state_dict(load_file(FILE)) works,
    /// and ddl's metadata: classes, eval transform, flags, final val top-1/top-5.
    #[arg(long, value_name = "FILE")]
    pub export: Option<PathBuf>,
    /// Start from the weights in FILE (.safetensors with torchvision's names, e.g. a state
    /// dict saved from torchvision or a ddl export); a checkpoint --resume finds comes first.
    #[arg(long, value_name = "FILE")]
    pub init_from: Option<PathBuf>,
    /// With --init-from: re-initialise the classifier head (fc) instead of loading it, to
    /// fine-tune on a dataset with other classes.
    #[arg(long, requires = "init_from")]
    pub reset_head: bool,
    /// Compare replica parameter checksums (inside and across ranks) every epoch.
    #[arg(long)]
    pub check_replicas: bool,
    /// How the ranks of a node share the dataset.
    #[arg(long, value_enum, default_value_t = defaults().residency)]
    pub residency: ResidencyMode,
    /// Fraction Q of every node's train records moved to other nodes at each epoch boundary,
    /// received during the epoch before (0: each node serves its own shards forever; 1: a
    /// global shuffle every epoch). Needs more than one node.
    #[arg(long, default_value_t = defaults().exchange)]
    pub exchange: f64,
    /// What the gradient allreduce overlaps: backward (staged backward, buckets reduced while
    /// earlier stages are still in backward) | pipeline (after backward, bucket by bucket) |
    /// off | auto (backward for GPU replicas or ranks on more than one node, else off; with
    /// --compile pipeline instead of backward).
    #[arg(long, default_value = "auto", value_parser = ["auto", "backward", "pipeline", "off"])]
    pub overlap: String,
    /// The order the communication thread reduces the buckets in: fifo (as backward hands them
    /// over, each whole, the next step after all of them) | priority (the first layers' buckets
    /// first, in chunks all ranks agree on, and the next step's forward starts each stage once
    /// its buckets are reduced; priority:CHUNK_BYTES). priority applies with --overlap
    /// backward, several ranks and fp32/bf16; otherwise fifo runs, and the run says why. fifo
    /// is the default: priority gained nothing measurable on the emulated cluster
    /// (BENCHMARKS.md, "Communication priorities").
    #[arg(long, default_value = "fifo")]
    pub comm_order: CommOrder,
    /// Gradient bucket size in MiB.
    #[arg(long, default_value_t = defaults().bucket_mb)]
    pub bucket_mb: f64,
    /// Channels-last (NHWC) images, activations and convolution weights.
    #[arg(long)]
    pub channels_last: bool,
    /// Run the training step (forward, loss, backward) compiled ahead of time by PyTorch's
    /// Inductor, which fuses each block's batch-norm, ReLU and residual add: compiled once per
    /// model, classes, batch, image size, precision, layout, device and torch into
    /// --compile-cache by the Python whose torch ddl-train runs on (DDL_PYTHON to choose
    /// another), then loaded at once. With it --overlap auto is pipeline (the step is one
    /// graph); --overlap backward and --head-parallel are refused.
    #[arg(long)]
    pub compile: bool,
    /// Where --compile keeps its compiled steps (default: $XDG_CACHE_HOME/ddl/compiled, else
    /// ~/.cache/ddl/compiled).
    #[arg(long, value_name = "DIR", requires = "compile")]
    pub compile_cache: Option<PathBuf>,
    /// With --compile: an option of Inductor's compile of the step, KEY=VALUE with VALUE a
    /// Python literal (layout_optimization=False; torch._inductor.config's names), repeatable;
    /// part of the compile cache's key.
    #[arg(
        long = "inductor-option",
        value_name = "KEY=VALUE",
        requires = "compile"
    )]
    pub inductor_options: Vec<String>,
    /// With --compile on GPUs: after two plain steps, capture the compiled step in a CUDA
    /// graph and replay it at every later step (one launch for the step's kernels; the
    /// batch is copied into the graph's input slots). Off by default until measured on a GPU
    /// (BENCHMARKS.md, "The compiled step").
    #[arg(long, requires = "compile")]
    pub cuda_graphs: bool,
    /// Skip the per-epoch evaluation.
    #[arg(long = "no-eval", action = ArgAction::SetFalse)]
    pub eval: bool,
    /// Shorter side before the eval center crop (0: image size x --eval-resize-ratio).
    #[arg(long, default_value_t = defaults().eval_resize)]
    pub eval_resize: u32,
    /// The eval resize as a multiple of the image size, when --eval-resize is 0 (at least 1;
    /// 8/7: 256 for 224).
    #[arg(long, default_value_t = defaults().eval_resize_ratio)]
    pub eval_resize_ratio: f64,
    /// Progressive resizing: the train image size per epoch, EPOCH:SIZE,... (0:160,10:192:
    /// 160 px from epoch 0, 192 from epoch 10; --image-size before the first listed epoch).
    /// Evaluation stays at --image-size.
    #[arg(long, value_name = "EPOCH:SIZE,...")]
    pub image_size_schedule: Option<SizeSchedule>,
    /// RandomResizedCrop's range of the crop's area fraction, LO,HI (0 < LO <= HI <= 1).
    #[arg(long, value_delimiter = ',', default_values_t = defaults().crop_scale, value_name = "LO,HI")]
    pub crop_scale: Vec<f64>,
    /// RandomResizedCrop's range of the crop's aspect ratio (width / height), LO,HI.
    #[arg(long, value_delimiter = ',', default_values_t = defaults().crop_ratio, value_name = "LO,HI")]
    pub crop_ratio: Vec<f64>,
    /// Probability of a horizontal flip of a train image (0: never, 1: always).
    #[arg(long, default_value_t = defaults().flip_prob)]
    pub flip_prob: f64,
    /// Channel means of the normalisation, R,G,B on the 0-1 scale.
    #[arg(long, value_delimiter = ',', default_values_t = defaults().mean, value_name = "R,G,B")]
    pub mean: Vec<f32>,
    /// Channel standard deviations of the normalisation, R,G,B on the 0-1 scale (above 0).
    #[arg(long, value_delimiter = ',', default_values_t = defaults().std, value_name = "R,G,B")]
    pub std: Vec<f32>,
    /// Pre-fault the node's shards at start.
    #[arg(long)]
    pub populate: bool,
    /// mlock the node's shards.
    #[arg(long = "mlock")]
    pub lock: bool,
    /// Copy the node's shards to this node-local directory first (e.g. /dev/shm/ddl).
    #[arg(long)]
    pub stage: Option<PathBuf>,
    /// Seconds a communication operation may block before the job fails.
    #[arg(long = "comm-timeout", value_name = "COMM_TIMEOUT",
          default_value_t = defaults().comm_timeout_s)]
    pub comm_timeout_s: u64,
    /// A training record whose checksum or decoding fails: replace (with the next good record
    /// of the epoch) | skip (shorter batch) | fail (stop the run). Each is reported once;
    /// evaluation always leaves bad records out (or fails with `fail`).
    #[arg(long, value_enum, default_value_t = defaults().on_bad_record)]
    pub on_bad_record: OnBadRecord,
    /// Only errors on stdout/stderr.
    #[arg(long = "quiet", action = ArgAction::SetFalse)]
    pub verbose: bool,
    /// Write a Chrome trace (Perfetto, chrome://tracing) of the run to FILE on rank 0 and to
    /// STEM.rankN.json beside it on rank N (trace.json -> trace.rank1.json).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
}

/// The defaults of the flags: [`TrainConfig::default`]'s values, so that `ddl-train` and a
/// library user start from the same settings.
fn defaults() -> TrainConfig {
    TrainConfig::default()
}

impl Args {
    /// The configuration these flags give, with `stop` as its stop request: the one
    /// conversion of the flags into settings.
    pub fn config(self, stop: StopRequest) -> anyhow::Result<TrainConfig> {
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
            inductor_options: self.inductor_options,
            cuda_graphs: self.cuda_graphs,
            eval: self.eval,
            eval_resize: self.eval_resize,
            eval_resize_ratio: self.eval_resize_ratio,
            image_size_schedule: self.image_size_schedule.unwrap_or_default(),
            crop_scale: values("--crop-scale", self.crop_scale)?,
            crop_ratio: values("--crop-ratio", self.crop_ratio)?,
            flip_prob: self.flip_prob,
            mean: values("--mean", self.mean)?,
            std: values("--std", self.std)?,
            populate: self.populate,
            lock: self.lock,
            stage: self.stage,
            comm_timeout_s: self.comm_timeout_s,
            on_bad_record: self.on_bad_record,
            verbose: self.verbose,
            stop,
            kill_timing: None,
        })
    }
}

/// The `N` comma-separated values of `flag`, or an error naming it.
fn values<const N: usize, T>(flag: &str, v: Vec<T>) -> anyhow::Result<[T; N]> {
    let n = v.len();
    v.try_into()
        .map_err(|_| anyhow::anyhow!("{flag}: takes {N} comma-separated values, got {n}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ddl_trainer::setting::Setting;

    /// Every flag left out means [`TrainConfig::default`]'s value, milestones (written as the
    /// command line spells them) and the switches (`--no-eval`, `--quiet`) included.
    #[test]
    fn flags_left_out_are_the_library_defaults() {
        let cli = Args::try_parse_from(["ddl-train", "--data", "shards"]).expect("parse");
        let cfg = cli.config(StopRequest::default()).expect("config");
        let want = TrainConfig {
            data: "shards".into(),
            ..TrainConfig::default()
        };
        let json = |c: &TrainConfig| serde_json::to_value(c).expect("serialize");
        assert_eq!(json(&cfg), json(&want));
    }

    /// The switches that turn a setting off set it to false.
    #[test]
    fn switches_turn_their_settings_off() {
        let cli = Args::try_parse_from(["ddl-train", "--data", "d", "--no-eval", "--quiet"]);
        let cfg = cli.expect("parse").config(StopRequest::default());
        let cfg = cfg.expect("config");
        assert!(!cfg.eval && !cfg.verbose);
    }

    #[test]
    fn every_setting_has_a_flag() {
        crate::assert_flags::<Args>(Setting::TRAIN);
        let flags = ddl_cli::flags(&<Args as clap::CommandFactory>::command());
        for (setting, flag) in [
            (Setting::Eval, "--no-eval"),
            (Setting::Verbose, "--quiet"),
            (Setting::Lock, "--mlock"),
            (Setting::CommTimeoutS, "--comm-timeout"),
            (Setting::AllowNewLayout, "--allow-new-layout"),
        ] {
            assert_eq!(flags[setting.name()], flag);
        }
    }
}
