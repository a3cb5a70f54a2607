//! The configuration of a training run: [`TrainConfig`] (the `ddl-train` flags) and the types
//! of its flags. Its one table of settings also makes [`Setting`] (what errors and messages
//! name, spelled as flags), each setting's class on resume and its flag ([`crate::flag`]).
//! Everything the table names lies below it; errors, which name settings, lie above.

use std::fmt::{self, Display};
use std::path::PathBuf;

use ddl_comm::{Algorithm, CommOrder, ShardAlgorithm};
use ddl_loader::pipeline::{
    OnBadRecord, TrainAugment, EVAL_RESIZE_RATIO, IMAGENET_MEAN, IMAGENET_STD,
};
use serde::{Serialize, Serializer};

/// The arithmetic of forward and backward, a property of the devices (see [`crate::device`]).
pub use crate::device::precision::Precision;
use crate::device::spec::DeviceSpec;
use crate::flag_value::{flag_value_named, parse_one, Choice, FlagValue, Named, Takes};
use crate::model::kind::ModelKind;
use crate::schedule::DecayKind;
use crate::setting::settings;
use crate::signal::{KillTiming, StopRequest};
use crate::size_schedule::SizeSchedule;

/// Serializes a flag value as it is written on the command line.
fn as_flag<T: Display, S: Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(value)
}

/// How the ranks of a node share the dataset (`residency`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ResidencyMode {
    /// The ranks of a node share that node's shards (MPI shared-memory split).
    Node,
    /// Every rank is its own node (to emulate several nodes on one machine).
    Rank,
}

impl Named for ResidencyMode {
    const ALL: &'static [Self] = &[ResidencyMode::Node, ResidencyMode::Rank];

    fn name(self) -> &'static str {
        match self {
            ResidencyMode::Node => "node",
            ResidencyMode::Rank => "rank",
        }
    }

    fn help(self) -> &'static str {
        match self {
            ResidencyMode::Node => "the ranks of a node share that node's shards",
            ResidencyMode::Rank => "every rank is its own node (to emulate several nodes)",
        }
    }
}

flag_value_named!(ResidencyMode);

settings! {
    /// Everything a training run is configured with (the `ddl-train` flags). Each field is a
    /// row of this table: its doc (the flag's help: first paragraph short, the whole long),
    /// how it is typed ([`crate::flag::Flag`]), its type and default, and what a different
    /// value does to a resumed run ([`crate::run_flags`]) with the reason; the table also makes
    /// the [`Setting`] of each field.
    #[derive(Clone, Debug, Serialize)]
    pub struct TrainConfig {
        /// Shards and manifest.json written by ddl-pack (a directory).
        #[flag(Data, required_unless = Some(Setting::SyntheticData))]
        Data data: PathBuf = PathBuf::new()
            => Free("a path: the dataset is compared by content (its fingerprint in the \
                checkpoint)"),
        /// Train on one random batch per device, without data.
        ///
        /// One random batch held on each device; no evaluation or checkpoints either: times the model, the table and the allreduce
        /// alone (as a PyTorch loop on data already on the GPU does).
        #[flag(Data)]
        SyntheticData synthetic_data: bool = false
            => Free("a run on synthetic data writes no checkpoint"),
        /// Classes of the model with `synthetic_data`.
        ///
        /// With data: the manifest's.
        #[flag(Data, requires = Some(Setting::SyntheticData))]
        Classes classes: Option<usize> = None
            => Free("only with `synthetic_data`, which writes no checkpoint"),
        /// cuDNN's deterministic algorithms instead of its benchmark mode.
        ///
        /// Benchmark mode (the default) times the algorithms for the fastest; with this flag a
        /// resumed GPU run is bitwise the uninterrupted one.
        #[flag(Gpu)]
        Deterministic deterministic: bool = false
            => Rounding("other convolution algorithms on GPUs"),
        /// The network.
        #[flag(Model)]
        Model model: ModelKind = ModelKind::Resnet50
            => Trajectory("a different network"),
        /// Epochs to train.
        #[flag(Model)]
        Epochs epochs: u32 = 90
            => Free("only where the run ends (with `schedule` cosine it also stretches the decay: \
                warned)"),
        /// Images per replica per step (global batch = this x replicas x ranks).
        #[flag(Model)]
        Batch batch: usize = 32
            => Trajectory("other batches, global batch and (linearly scaled) learning rate"),
        /// The local devices that get a model replica.
        ///
        /// auto (the node's GPUs shared out between its ranks, else one CPU replica) | cpu |
        /// cpu:N | cuda | cuda:0,1,2,3.
        #[flag(Parallel)]
        #[serde(serialize_with = "as_flag")]
        Devices devices: DeviceSpec = DeviceSpec::Auto
            => Rounding("other devices round differently (the replica count is checked from the \
                layout)"),
        /// Input side in pixels.
        #[flag(Data, value_name = Some("PX"))]
        ImageSize image_size: u32 = 224
            => Trajectory("other input pixels"),
        /// Decode threads per rank.
        #[flag(Data)]
        Workers workers: usize = 2
            => Free("batches depend only on seed, epoch, step and replica"),
        /// Ready batches queued per replica.
        #[flag(Data)]
        Prefetch prefetch: usize = 4
            => Free("batches depend only on seed, epoch, step and replica"),
        /// Seed of weights, sampling and augmentation.
        #[flag(Model)]
        Seed seed: u64 = 0
            => Trajectory("another sampling order and augmentation"),
        /// Learning rate per 256 images (peak = `base_lr` x global batch / 256).
        #[flag(Model, value_name = Some("LR"))]
        BaseLr base_lr: f64 = 0.1
            => Trajectory("another learning rate"),
        /// Peak learning rate, overriding the linear scaling rule.
        #[flag(Model, value_name = Some("LR"))]
        Lr lr: Option<f64> = None
            => Trajectory("another learning rate"),
        /// SGD momentum.
        #[flag(Model)]
        Momentum momentum: f64 = 0.9
            => Trajectory("another optimizer"),
        /// Nesterov momentum.
        #[flag(Model)]
        Nesterov nesterov: bool = false
            => Trajectory("another optimizer"),
        /// Weight decay (not applied to BatchNorm and bias parameters).
        #[flag(Model, value_name = Some("DECAY"))]
        WeightDecay weight_decay: f64 = 1e-4
            => Trajectory("another optimizer"),
        /// Linear warmup length in epochs (fractions allowed).
        #[flag(Model, value_name = Some("EPOCHS"))]
        WarmupEpochs warmup_epochs: f64 = 5.0
            => Trajectory("another learning-rate schedule"),
        /// Learning-rate decay after warmup.
        #[flag(Model)]
        Schedule schedule: DecayKind = DecayKind::Step
            => Trajectory("another learning-rate schedule"),
        /// Step-decay epochs, comma separated.
        #[flag(Model, value_name = Some("EPOCHS"))]
        Milestones milestones: Vec<u32> = vec![30, 60, 80]
            => Trajectory("another learning-rate schedule"),
        /// Step-decay factor.
        #[flag(Model)]
        Gamma gamma: f64 = 0.1
            => Trajectory("another learning-rate schedule"),
        /// Label smoothing of the cross-entropy loss.
        #[flag(Model, value_name = Some("EPS"))]
        LabelSmoothing label_smoothing: f64 = 0.0
            => Trajectory("another loss"),
        /// Arithmetic of forward and backward.
        ///
        /// Autocast on GPUs; gradients are reduced in f32.
        #[flag(Gpu)]
        Precision precision: Precision = Precision::Fp32
            => Trajectory("other arithmetic on GPUs"),
        /// Write one JSON line per step and per epoch here (rank 0).
        #[flag(Diagnostics, value_name = Some("FILE"))]
        Metrics metrics: Option<PathBuf> = None
            => Free("output only"),
        /// Write the global ids of the records of every batch trained here.
        ///
        /// One JSON line per replica and step: {"epoch", "step", "rank", "replica", "ids"}
        /// (every rank; with several ranks each writes PATH.<rank>; appended to on `resume`;
        /// format: ddl_loader::trace_records).
        #[flag(Diagnostics, value_name = Some("PATH"),
               conflicts = Some(Setting::SyntheticData))]
        TraceRecords trace_records: Option<PathBuf> = None
            => Free("output only"),
        /// Directory of checkpoints (written by rank 0).
        #[flag(Checkpoints, value_name = Some("DIR"))]
        CheckpointDir checkpoint_dir: Option<PathBuf> = None
            => Free("output only"),
        /// Also checkpoint every N global steps (0: only at epoch ends).
        #[flag(Checkpoints, value_name = Some("N"))]
        CheckpointEvery checkpoint_every: u64 = 0
            => Free("output only"),
        /// Checkpoints to keep.
        #[flag(Checkpoints, value_name = Some("N"))]
        KeepCheckpoints keep_checkpoints: usize = 3
            => Free("output only"),
        /// Continue from the newest valid checkpoint in `checkpoint_dir`.
        ///
        /// Refused when a flag that changes the trajectory differs from the checkpoint's.
        #[flag(Checkpoints, conflicts = Some(Setting::Restart))]
        Resume resume: bool = false
            => Free("how this run starts"),
        /// Start over in a `checkpoint_dir` holding another run's checkpoints.
        ///
        /// Moves them into a dated subdirectory first (nothing is deleted).
        #[flag(Checkpoints)]
        Restart restart: bool = false
            => Free("how this run starts"),
        /// With `resume`: continue on another layout (ranks, replicas, nodes).
        ///
        /// Not bitwise identical to an uninterrupted run.
        #[flag(Checkpoints, requires = Some(Setting::Resume))]
        AllowNewLayout allow_new_layout: bool = false
            => Free("how this run starts"),
        /// Stop after this many global steps.
        ///
        /// 0: none, e.g. to dump the initial weights.
        #[flag(Model, value_name = Some("N"))]
        MaxSteps max_steps: Option<u64> = None
            => Free("only where the run stops"),
        /// The allreduce algorithm of the gradients.
        ///
        /// NAME[:PARAMETERS], NAME one of those below; auto picks one per buffer size with the
        /// cost model.
        #[flag(Parallel, value_name = Some("NAME"))]
        #[serde(serialize_with = "as_flag")]
        Allreduce allreduce: Algorithm = Algorithm::Auto
            => Rounding("another summation order across ranks"),
        /// Cost model for `allreduce` auto, from `mpirun ddl-bench calibrate`.
        ///
        /// A file written in this job's layout, whose measured times decide per buffer size
        /// (default: formulas).
        #[flag(Parallel, value_name = Some("FILE"))]
        CostModel cost_model: Option<PathBuf> = None
            => Rounding("auto may pick other algorithms, so another summation order"),
        /// Write the cost model `allreduce` auto tuned online to this file.
        ///
        /// Without `cost_model`, auto times the candidates on the first calls of each buffer
        /// size and keeps the fastest; rank 0 writes what it found whenever it settles a size,
        /// to give to later jobs of this layout as `cost_model`.
        #[flag(Parallel, value_name = Some("FILE"))]
        SaveCostModel save_cost_model: Option<PathBuf> = None
            => Free("output only"),
        /// Split the classifier head by class over every replica of the job.
        ///
        /// The backbone stays data-parallel: each step all-gathers the features and exchanges
        /// the softmax's per-sample sums instead of allreducing the head's gradient (fewer
        /// bytes below a global batch of about the class count; `ddl-plan --head-parallel`
        /// prints both).
        #[flag(Parallel)]
        HeadParallel head_parallel: bool = false
            => Rounding("the head's gradient from every sample on the replica owning each class, \
                not summed over the replicas: another summation order"),
        /// The allgather and reduce-scatter algorithm of `head_parallel`.
        #[flag(Parallel, value_name = Some("NAME"), requires = Some(Setting::HeadParallel))]
        #[serde(serialize_with = "as_flag")]
        Gather gather: ShardAlgorithm = ShardAlgorithm::Auto
            => Rounding("another allgather / reduce-scatter of `head_parallel`, so another \
                summation order"),
        /// Write the final replica-0 weights as raw f32 to FILE.
        ///
        /// Little-endian, with an index in FILE.json.
        #[flag(Checkpoints, value_name = Some("FILE"))]
        DumpWeights dump_weights: Option<PathBuf> = None
            => Free("output only"),
        /// Write the final model to FILE (.safetensors) with torchvision's keys.
        ///
        /// Shapes and dtypes are torchvision's, so that
        /// torchvision.models.NAME(num_classes=C).load_state_dict(load_file(FILE)) works; with
        /// ddl's metadata: classes, eval transform, flags, final val top-1/top-5.
        #[flag(Checkpoints, value_name = Some("FILE"))]
        Export export: Option<PathBuf> = None
            => Free("output only"),
        /// Start from the weights in FILE (.safetensors, torchvision's names).
        ///
        /// E.g. a state dict saved from torchvision or a ddl export; a checkpoint `resume`
        /// finds comes first.
        #[flag(Model, value_name = Some("FILE"))]
        InitFrom init_from: Option<PathBuf> = None
            => Free("only the first step's weights, which a resumed run takes from its checkpoint"),
        /// With `init_from`: re-initialise the classifier head, not load it.
        ///
        /// To fine-tune on a dataset with other classes.
        #[flag(Model, requires = Some(Setting::InitFrom))]
        ResetHead reset_head: bool = false
            => Free("only the first step's weights, which a resumed run takes from its checkpoint"),
        /// Compare the replicas' parameter checksums every epoch.
        ///
        /// Inside and across ranks.
        #[flag(Diagnostics)]
        CheckReplicas check_replicas: bool = false
            => Free("a check, changes nothing"),
        /// How the ranks of a node share the dataset.
        #[flag(Parallel)]
        Residency residency: ResidencyMode = ResidencyMode::Node
            => Trajectory("other records on each node, so other batches"),
        /// Fraction of each node's records moved between nodes at each epoch.
        ///
        /// Q of every node's train records go to other nodes at each epoch boundary, received during the epoch before (0: each node serves its own shards forever; 1: a
        /// global shuffle every epoch). Needs more than one node.
        #[flag(Parallel, value_name = Some("Q"))]
        Exchange exchange: f64 = 0.0
            => Trajectory("other records on each node from the next epoch on"),
        /// What the gradient allreduce overlaps with.
        #[flag(Parallel, value_name = Some("WHAT"))]
        Overlap overlap: Option<Overlap> = None
            => Rounding("other allreduce buffers, so another summation order"),
        /// The order the communication thread reduces the buckets in.
        ///
        /// fifo: as backward hands them over, each whole, the next step after all of them.
        /// priority[:CHUNK_BYTES]: the first layers' buckets first, in chunks all ranks agree
        /// on, and the next step's forward starts each stage once its buckets are reduced; it
        /// applies with `overlap` backward, several ranks and fp32/bf16 (otherwise fifo runs,
        /// and the run says why). fifo is the default: priority gained nothing measurable on
        /// the emulated cluster (BENCHMARKS.md, "Communication priorities").
        #[flag(Parallel, value_name = Some("ORDER"))]
        #[serde(serialize_with = "as_flag")]
        CommOrder comm_order: CommOrder = CommOrder::Fifo
            => Rounding("priority cuts buckets into chunks: ring and rhd at 3 or more ranks sum a \
                chunk in another order than its bucket (shm, and any algorithm at 2 ranks, sum the \
                same)"),
        /// Gradient bucket size in MiB.
        #[flag(Parallel, value_name = Some("MIB"))]
        BucketMb bucket_mb: f64 = 25.0
            => Rounding("other allreduce buffers, so another summation order"),
        /// Channels-last (NHWC) images, activations and conv weights.
        #[flag(Gpu)]
        ChannelsLast channels_last: bool = false
            => Rounding("other convolution kernels"),
        /// Run the step compiled ahead of time by PyTorch's Inductor.
        ///
        /// Inductor fuses each block's batch-norm, ReLU and residual add. The step (forward,
        /// loss, backward) is compiled once per model, classes, batch, image size, precision,
        /// layout, device and torch into `compile_cache` by the Python whose torch ddl-train
        /// runs on (DDL_PYTHON to choose another), then loaded at once. With it `overlap` auto
        /// is pipeline (the step is one graph); `overlap` backward and `head_parallel` are
        /// refused.
        #[flag(Gpu)]
        Compile compile: bool = false
            => Rounding("Inductor's fused kernels compute the same step, summing in another order"),
        /// Where `compile` keeps its compiled steps.
        ///
        /// Default: $XDG_CACHE_HOME/ddl/compiled, else ~/.cache/ddl/compiled.
        #[flag(Gpu, value_name = Some("DIR"), requires = Some(Setting::Compile))]
        CompileCache compile_cache: Option<PathBuf> = None
            => Free("where the compiled step is kept"),
        /// With `compile`: an Inductor option of the step's compile.
        ///
        /// Repeatable. KEY=VALUE with VALUE a Python literal (layout_optimization=False;
        /// torch._inductor.config's names); part of the compile cache's key.
        #[flag(Gpu, long = Some("inductor-option"), value_name = Some("KEY=VALUE"),
               takes = Takes::Repeated, requires = Some(Setting::Compile))]
        InductorOptions inductor_options: Vec<String> = Vec::new()
            => Rounding("other generated kernels compute the same step"),
        /// With `compile` on GPUs: replay the step from a CUDA graph.
        ///
        /// After two plain steps the compiled step is captured in a CUDA graph and replayed at
        /// every later step (one launch for the step's kernels; the batch is copied into the
        /// graph's input slots). Off by default until measured on a GPU (BENCHMARKS.md, "The
        /// compiled step").
        #[flag(Gpu, requires = Some(Setting::Compile))]
        CudaGraphs cuda_graphs: bool = false
            => Free("a graph replays the compiled step's own kernels"),
        /// Skip the per-epoch evaluation.
        #[flag(Data, long = Some("no-eval"))]
        Eval eval: bool = true
            => Free("evaluation does not train"),
        /// Eval resize before the center crop (0: `eval_resize_ratio`).
        ///
        /// The shorter side in pixels; 0: the image size x `eval_resize_ratio`.
        #[flag(Data, value_name = Some("PX"))]
        EvalResize eval_resize: u32 = 0
            => Free("evaluation does not train"),
        /// The eval resize / the image size, when `eval_resize` is 0.
        ///
        /// At least 1; 8/7: 256 for 224.
        #[flag(Data, value_name = Some("RATIO"))]
        EvalResizeRatio eval_resize_ratio: f64 = EVAL_RESIZE_RATIO
            => Free("evaluation does not train"),
        /// Progressive resizing: the train image size per epoch.
        ///
        /// EPOCH:SIZE,... (0:160,10:192: 160 px from epoch 0, 192 from epoch 10; `image_size`
        /// before the first listed epoch). Evaluation stays at `image_size`.
        #[flag(Data, value_name = Some("SCHEDULE"))]
        ImageSizeSchedule image_size_schedule: SizeSchedule = SizeSchedule::default()
            => Trajectory("other input pixels from its epochs on"),
        /// RandomResizedCrop's range of the crop's area fraction.
        ///
        /// 0 < LO <= HI <= 1.
        #[flag(Data, value_name = Some("LO,HI"))]
        CropScale crop_scale: [f64; 2] = [0.08, 1.0]
            => Trajectory("other crops"),
        /// RandomResizedCrop's range of aspect ratio (width / height).
        #[flag(Data, value_name = Some("LO,HI"))]
        CropRatio crop_ratio: [f64; 2] = [0.75, 4.0 / 3.0]
            => Trajectory("other crops"),
        /// Probability of a horizontal flip of a train image.
        ///
        /// 0: never, 1: always.
        #[flag(Data, value_name = Some("P"))]
        FlipProb flip_prob: f64 = 0.5
            => Trajectory("other flips"),
        /// Channel means of the normalisation, 0-1 scale.
        #[flag(Data, value_name = Some("R,G,B"))]
        Mean mean: [f32; 3] = IMAGENET_MEAN
            => Trajectory("other input values"),
        /// Channel standard deviations of the normalisation, 0-1 scale.
        ///
        /// Each above 0.
        #[flag(Data, value_name = Some("R,G,B"))]
        Std std: [f32; 3] = IMAGENET_STD
            => Trajectory("other input values"),
        /// Pre-fault the node's shards at start.
        #[flag(Data)]
        Populate populate: bool = false
            => Free("how the shards are loaded"),
        /// mlock the node's shards.
        #[flag(Data, long = Some("mlock"))]
        Lock lock: bool = false
            => Free("how the shards are loaded"),
        /// Copy the node's shards to this local directory first.
        ///
        /// E.g. /dev/shm/ddl: the shards are then read from memory the node holds.
        #[flag(Data, value_name = Some("DIR"))]
        Stage stage: Option<PathBuf> = None
            => Free("how the shards are loaded"),
        /// Seconds a communication operation may block before the job fails.
        #[flag(Parallel, long = Some("comm-timeout"), value_name = Some("SECONDS"))]
        CommTimeoutS comm_timeout_s: u64 = 600
            => Free("when a hung job fails"),
        /// What to do with a record whose checksum or decoding fails.
        ///
        /// Each is reported once; evaluation always leaves bad records out (or fails with
        /// fail).
        #[flag(Data, value_name = Some("RULE"))]
        OnBadRecord on_bad_record: OnBadRecord = OnBadRecord::Replace
            => Trajectory("other stand-ins for bad records (or none), so other batches"),
        /// Only errors on stdout/stderr.
        #[flag(Diagnostics, long = Some("quiet"))]
        Verbose verbose: bool = true
            => Free("output only"),
    }
    not_settings {
        /// Raised by SIGTERM/SIGINT (see [`crate::signal`]): the run stops after the current step.
        #[serde(skip)]
        stop: StopRequest = StopRequest::default(),
        /// How long the job's scheduler leaves a stop (under Slurm, see [`crate::slurm`]): the
        /// run says it at the start, warns when a stop cannot fit, and stops itself ahead of
        /// a time limit that would leave too little.
        #[serde(skip)]
        kill_timing: Option<KillTiming> = None,
    }
    others {
        /// The device of [`crate::predict`].
        Device device = "--device",
        /// The architecture of a state dict without ddl metadata ([`crate::predict`]).
        Arch arch = "--arch",
        /// The file [`crate::export`] writes.
        Output output = "-o",
    }
}

impl Setting {
    /// The setting named `name` ([`Setting::name`]).
    pub fn from_name(name: &str) -> Option<Setting> {
        Setting::ALL.iter().copied().find(|s| s.name() == name)
    }
}

impl fmt::Display for Setting {
    /// The setting as its user types it: its flag.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.spelled())
    }
}

/// Several settings, as `a/b/c` (an error any of them can lift).
pub fn joined(settings: &[Setting]) -> String {
    settings
        .iter()
        .map(Setting::to_string)
        .collect::<Vec<_>>()
        .join("/")
}

/// `text` with each setting named in backquotes (`` `batch` ``) spelled as its flag: for the
/// docs of the table and texts that must be constants.
pub fn spell(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some((before, after)) = rest.split_once('`') {
        let Some((quoted, next)) = after.split_once('`') else {
            break;
        };
        out.push_str(before);
        match Setting::from_name(quoted) {
            Some(s) => out.push_str(&s.to_string()),
            None => out.push_str(&format!("`{quoted}`")),
        }
        rest = next;
    }
    out.push_str(rest);
    out
}

impl TrainConfig {
    /// The shorter side of the eval resize: `eval_resize`, or the image size x
    /// `eval_resize_ratio` (8/7: 256 for 224) when it is 0.
    pub fn eval_resize_px(&self) -> u32 {
        eval_resize_px(self.image_size, self.eval_resize, self.eval_resize_ratio)
    }

    /// The train transform's crop and flip settings.
    pub fn train_augment(&self) -> TrainAugment {
        TrainAugment {
            scale: (self.crop_scale[0], self.crop_scale[1]),
            ratio: (self.crop_ratio[0], self.crop_ratio[1]),
            flip: self.flip_prob,
        }
    }

    /// The train image size of `epoch` (`image_size_schedule`, else `image_size`).
    pub fn train_size(&self, epoch: u64) -> u32 {
        self.image_size_schedule.size_at(epoch, self.image_size)
    }
}

/// The shorter side of the eval resize for `image_size`, `eval_resize` (0: the size x
/// `ratio`) and `eval_resize_ratio`.
pub fn eval_resize_px(image_size: u32, eval_resize: u32, ratio: f64) -> u32 {
    if eval_resize > 0 {
        eval_resize
    } else {
        ddl_loader::pipeline::eval_resize(image_size, ratio)
    }
}

/// How the gradient reduction overlaps the replicas' work (see [`crate::table`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Overlap {
    /// One bucket, reduced after backward.
    Off,
    /// Buckets pipelined after backward (sum and copy of bucket k+1 while k is allreduced).
    Pipeline,
    /// Staged backward: a bucket is allreduced while the earlier stages are still in backward.
    Backward,
}

impl Overlap {
    /// The values `overlap` takes, `auto` (no value: [`auto_overlap`]) first.
    pub const CHOICES: [Choice; 4] = [
        Choice::named(
            "auto",
            "backward for GPU replicas or ranks on more than one node, else off; with \
             `compile` pipeline instead of backward",
        ),
        Choice::named(
            "backward",
            "staged backward: buckets reduced while earlier stages are still in backward",
        ),
        Choice::named("pipeline", "after backward, bucket by bucket"),
        Choice::named("off", "one bucket, reduced after backward"),
    ];

    /// Name as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Overlap::Off => "off",
            Overlap::Pipeline => "pipeline",
            Overlap::Backward => "backward",
        }
    }
}

impl std::str::FromStr for Overlap {
    type Err = String;

    /// Parses one of [`Overlap::CHOICES`] but `auto`.
    fn from_str(s: &str) -> Result<Self, String> {
        [Overlap::Off, Overlap::Pipeline, Overlap::Backward]
            .into_iter()
            .find(|o| o.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Overlap::CHOICES.iter().map(|c| c.name).collect();
                format!("{s:?} is not one of {}", names.join(", "))
            })
    }
}

/// `overlap`: `auto` is no value ([`auto_overlap`] decides).
impl FlagValue for Option<Overlap> {
    fn parse_flag(values: &[&str]) -> Result<Self, String> {
        match values {
            ["auto"] => Ok(None),
            _ => parse_one::<Overlap>(values).map(Some),
        }
    }

    fn shown(&self) -> Option<String> {
        Some(self.map_or("auto", Overlap::name).to_string())
    }

    fn choices() -> Vec<Choice> {
        Overlap::CHOICES.to_vec()
    }
}

/// `overlap` auto: off when the job has one replica (there is nothing to reduce), else
/// backward when the replicas are GPUs (the communication thread has cores of its own) or the
/// ranks span more than one node (the allreduce crosses a network and is worth hiding); off for
/// CPU replicas on one node, where the allreduce is a shared-memory copy and the communication
/// thread would only take cores from the replicas. Measured in BENCHMARKS.md ("Overlap of the
/// gradient allreduce with backward"). A `compiled` step is one graph, whose gradients are
/// complete only at its end: pipeline instead of backward.
pub fn auto_overlap(gpus: bool, nodes: usize, replicas_in_job: usize, compiled: bool) -> Overlap {
    if replicas_in_job > 1 && (gpus || nodes > 1) {
        match compiled {
            true => Overlap::Pipeline,
            false => Overlap::Backward,
        }
    } else {
        Overlap::Off
    }
}

/// The order a table serves its buckets in, from `comm_order` and the run: `priority`
/// needs buckets cut at stage boundaries and a forward pass run stage by stage (`overlap`
/// backward), something that crosses ranks (with one rank nothing is reduced across them),
/// and no fp16 (whether an fp16 step is skipped is known only once every bucket is reduced,
/// so its updates cannot start with the first). Otherwise `fifo`, with the reason, which the
/// run prints.
pub fn comm_order(
    requested: CommOrder,
    overlap: Overlap,
    ranks: usize,
    precision: Precision,
) -> (CommOrder, Option<String>) {
    if requested == CommOrder::Fifo {
        return (requested, None);
    }
    let why = if overlap != Overlap::Backward {
        format!("priority needs {} backward", Setting::Overlap)
    } else if ranks <= 1 {
        "priority needs several ranks".to_string()
    } else if precision == Precision::Fp16 {
        format!("priority does not run with {} fp16", Setting::Precision)
    } else {
        return (requested, None);
    };
    (CommOrder::Fifo, Some(why))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Settings are spelled as the flags users type, overrides and `predict`'s included.
    #[test]
    fn settings_are_spelled_as_flags() {
        for (setting, flag) in [
            (Setting::Eval, "--no-eval"),
            (Setting::Verbose, "--quiet"),
            (Setting::Lock, "--mlock"),
            (Setting::CommTimeoutS, "--comm-timeout"),
            (Setting::AllowNewLayout, "--allow-new-layout"),
            (Setting::InductorOptions, "--inductor-option"),
            (Setting::Output, "-o"),
        ] {
            assert_eq!(setting.to_string(), flag);
        }
    }

    /// Every field of the configuration (as a checkpoint records it) is a setting a message
    /// can name, with its class on resume; the others have none.
    #[test]
    fn every_config_field_is_a_classified_setting() {
        let v = serde_json::to_value(crate::TrainConfig::default()).unwrap();
        let fields: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        for field in &fields {
            let s = Setting::from_name(field);
            assert_eq!(s.map(Setting::name), Some(*field), "{field}");
            assert!(s.and_then(Setting::on_resume).is_some(), "{field}");
        }
        assert_eq!(Setting::TRAIN.len(), fields.len());
        for s in Setting::ALL.iter().filter(|s| !Setting::TRAIN.contains(s)) {
            assert_eq!(s.on_resume(), None, "{s:?}");
        }
    }

    #[test]
    fn spell_names_settings_only() {
        let text = "with `schedule` cosine, not `cosine`, and a lone ` quote";
        let want = "with --schedule cosine, not `cosine`, and a lone ` quote";
        assert_eq!(spell(text), want);
    }

    #[test]
    fn named_values_are_parsed_by_name_and_listed() {
        assert_eq!(
            ModelKind::parse_flag(&["resnet_small"]),
            Ok(ModelKind::ResnetSmall)
        );
        let err = Precision::parse_flag(&["fp8"]).unwrap_err();
        assert_eq!(err, "\"fp8\" is not one of fp32, bf16, fp16");
        let auto = <Option<Overlap>>::parse_flag(&["auto"]);
        assert_eq!(auto, Ok(None));
        let names: Vec<&str> = <Option<Overlap>>::choices()
            .iter()
            .map(|c| c.name)
            .collect();
        assert_eq!(names, ["auto", "backward", "pipeline", "off"]);
    }
}
