//! The configuration of a training run: [`TrainConfig`] (the `ddl-train` flags) and the types
//! of its flags. Its one table of settings also makes [`Setting`] (re-exported by
//! [`crate::setting`]) and each setting's class on resume.

use std::fmt::Display;
use std::path::PathBuf;

use clap::ValueEnum;
use ddl_comm::{Algorithm, CommOrder, ShardAlgorithm};
use ddl_loader::pipeline::{
    OnBadRecord, TrainAugment, EVAL_RESIZE_RATIO, IMAGENET_MEAN, IMAGENET_STD,
};
use serde::{Serialize, Serializer};

use crate::device::DeviceSpec;
/// The arithmetic of forward and backward, a property of the devices (see [`crate::device`]).
pub use crate::device::Precision;
use crate::error::{Result, TrainError};
use crate::model::ModelKind;
use crate::schedule::DecayKind;
use crate::setting::settings;
use crate::signal::{KillTiming, StopRequest};
use crate::size_schedule::SizeSchedule;

/// Serializes a flag value as it is written on the command line.
fn as_flag<T: Display, S: Serializer>(value: &T, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.collect_str(value)
}

/// How the ranks of a node share the dataset (`residency`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ResidencyMode {
    /// The ranks of a node share that node's shards (MPI shared-memory split).
    Node,
    /// Every rank is its own node (to emulate several nodes on one machine).
    Rank,
}

settings! {
    /// Everything a training run is configured with (the `ddl-train` flags). Each field is a
    /// row of this table: its doc, type and default, and what a different value does to a
    /// resumed run ([`crate::run_flags`]) with the reason; the table also makes the
    /// [`Setting`] of each field.
    #[derive(Clone, Debug, Serialize)]
    pub struct TrainConfig {
        /// Directory with `manifest.json` and the shards (`data`; empty with `synthetic_data`).
        Data data: PathBuf = PathBuf::new()
            => Free("a path: the dataset is compared by content (its fingerprint in the \
                checkpoint)"),
        /// Train on one random batch held on each device instead of `data`: the model, the table
        /// and the allreduce alone, for speed measurements (`synthetic_data`).
        SyntheticData synthetic_data: bool = false
            => Free("a run on synthetic data writes no checkpoint"),
        /// Classes of the synthetic data's model (`classes`; with data, the manifest's).
        Classes classes: Option<usize> = None
            => Free("only with `synthetic_data`, which writes no checkpoint"),
        /// cuDNN's deterministic algorithms instead of its benchmark mode (`deterministic`):
        /// on a GPU, a resumed run is then bitwise the uninterrupted one.
        Deterministic deterministic: bool = false
            => Rounding("other convolution algorithms on GPUs"),
        /// Network (`model`).
        Model model: ModelKind = ModelKind::Resnet50
            => Trajectory("a different network"),
        /// Epochs to train (`epochs`).
        Epochs epochs: u32 = 90
            => Free("only where the run ends (with `schedule` cosine it also stretches the decay: \
                warned)"),
        /// Images per replica per step (`batch`).
        Batch batch: usize = 32
            => Trajectory("other batches, global batch and (linearly scaled) learning rate"),
        /// Local devices (`devices`).
        #[serde(serialize_with = "as_flag")]
        Devices devices: DeviceSpec = DeviceSpec::Auto
            => Rounding("other devices round differently (the replica count is checked from the \
                layout)"),
        /// Input side in pixels (`image_size`).
        ImageSize image_size: u32 = 224
            => Trajectory("other input pixels"),
        /// Decode threads per rank (`workers`).
        Workers workers: usize = 2
            => Free("batches depend only on seed, epoch, step and replica"),
        /// Ready batches queued per replica (`prefetch`).
        Prefetch prefetch: usize = 4
            => Free("batches depend only on seed, epoch, step and replica"),
        /// Seed of weights, sampling and augmentation (`seed`).
        Seed seed: u64 = 0
            => Trajectory("another sampling order and augmentation"),
        /// Base learning rate per 256 images (`base_lr`).
        BaseLr base_lr: f64 = 0.1
            => Trajectory("another learning rate"),
        /// Peak learning rate, overriding the linear scaling rule (`lr`).
        Lr lr: Option<f64> = None
            => Trajectory("another learning rate"),
        /// SGD momentum (`momentum`).
        Momentum momentum: f64 = 0.9
            => Trajectory("another optimizer"),
        /// Nesterov momentum (`nesterov`).
        Nesterov nesterov: bool = false
            => Trajectory("another optimizer"),
        /// Weight decay of conv/linear weights (`weight_decay`).
        WeightDecay weight_decay: f64 = 1e-4
            => Trajectory("another optimizer"),
        /// Warmup epochs, fractional allowed (`warmup_epochs`).
        WarmupEpochs warmup_epochs: f64 = 5.0
            => Trajectory("another learning-rate schedule"),
        /// Learning-rate decay after warmup (`schedule`).
        Schedule schedule: DecayKind = DecayKind::Step
            => Trajectory("another learning-rate schedule"),
        /// Step-decay epochs (`milestones`).
        Milestones milestones: Vec<u32> = vec![30, 60, 80]
            => Trajectory("another learning-rate schedule"),
        /// Step-decay factor (`gamma`).
        Gamma gamma: f64 = 0.1
            => Trajectory("another learning-rate schedule"),
        /// Label smoothing (`label_smoothing`).
        LabelSmoothing label_smoothing: f64 = 0.0
            => Trajectory("another loss"),
        /// Arithmetic of forward and backward (`precision`).
        Precision precision: Precision = Precision::Fp32
            => Trajectory("other arithmetic on GPUs"),
        /// JSON-lines metrics file written by rank 0 (`metrics`).
        Metrics metrics: Option<PathBuf> = None
            => Free("output only"),
        /// JSON-lines record trace, one file per rank: the global ids of the records of every
        /// batch trained (`trace_records`; format: `ddl_loader::trace_records`).
        TraceRecords trace_records: Option<PathBuf> = None
            => Free("output only"),
        /// Checkpoint directory (`checkpoint_dir`).
        CheckpointDir checkpoint_dir: Option<PathBuf> = None
            => Free("output only"),
        /// Checkpoint every N global steps, 0 = only at epoch ends (`checkpoint_every`).
        CheckpointEvery checkpoint_every: u64 = 0
            => Free("output only"),
        /// Checkpoints kept (`keep_checkpoints`).
        KeepCheckpoints keep_checkpoints: usize = 3
            => Free("output only"),
        /// Continue from the newest valid checkpoint (`resume`).
        Resume resume: bool = false
            => Free("how this run starts"),
        /// Move another run's checkpoints in the directory aside and start over (`restart`).
        Restart restart: bool = false
            => Free("how this run starts"),
        /// Resume on a different layout (ranks, replicas, nodes) than the checkpoint's
        /// (`allow_new_layout`).
        AllowNewLayout allow_new_layout: bool = false
            => Free("how this run starts"),
        /// Stop after this many global steps (`max_steps`).
        MaxSteps max_steps: Option<u64> = None
            => Free("only where the run stops"),
        /// Allreduce algorithm (`allreduce`).
        #[serde(serialize_with = "as_flag")]
        Allreduce allreduce: Algorithm = Algorithm::Auto
            => Rounding("another summation order across ranks"),
        /// Cost model `auto` chooses with, from `ddl-bench calibrate` (`cost_model`; none: the
        /// default model's formulas).
        CostModel cost_model: Option<PathBuf> = None
            => Rounding("auto may pick other algorithms, so another summation order"),
        /// Where rank 0 writes the cost model `allreduce` auto tuned online, whenever it
        /// settles another buffer size (`save_cost_model`), for `cost_model` of later jobs.
        SaveCostModel save_cost_model: Option<PathBuf> = None
            => Free("output only"),
        /// Split the classifier head by class over every replica of the job, the backbone staying
        /// data-parallel (`head_parallel`; see [`crate::table`]).
        HeadParallel head_parallel: bool = false
            => Rounding("the head's gradient from every sample on the replica owning each class, \
                not summed over the replicas: another summation order"),
        /// Allgather / reduce-scatter algorithm of `head_parallel`'s exchanges (`gather`).
        #[serde(serialize_with = "as_flag")]
        Gather gather: ShardAlgorithm = ShardAlgorithm::Auto
            => Rounding("another allgather / reduce-scatter of `head_parallel`, so another \
                summation order"),
        /// Write final replica-0 weights here (`dump_weights`).
        DumpWeights dump_weights: Option<PathBuf> = None
            => Free("output only"),
        /// Write the final model here as a torchvision-compatible `.safetensors` file
        /// (`export`; see [`crate::weights`]).
        Export export: Option<PathBuf> = None
            => Free("output only"),
        /// Start from the weights of this `.safetensors` file, with torchvision's names
        /// (`init_from`), unless `resume` finds a checkpoint.
        InitFrom init_from: Option<PathBuf> = None
            => Free("only the first step's weights, which a resumed run takes from its checkpoint"),
        /// Re-initialise the classifier head instead of loading it from `init_from`
        /// (`reset_head`: fine-tuning on another class count).
        ResetHead reset_head: bool = false
            => Free("only the first step's weights, which a resumed run takes from its checkpoint"),
        /// Compare replica checksums every epoch (`check_replicas`).
        CheckReplicas check_replicas: bool = false
            => Free("a check, changes nothing"),
        /// How the ranks of a node share the dataset (`residency`).
        Residency residency: ResidencyMode = ResidencyMode::Node
            => Trajectory("other records on each node, so other batches"),
        /// Fraction of every node's train records exchanged with the other nodes at each epoch
        /// boundary, in `[0, 1]` (`exchange`; ddl-exchange).
        Exchange exchange: f64 = 0.0
            => Trajectory("other records on each node from the next epoch on"),
        /// What the gradient allreduce overlaps with (`overlap` backward|pipeline|off|auto);
        /// `None` = auto ([`auto_overlap`]).
        Overlap overlap: Option<Overlap> = None
            => Rounding("other allreduce buffers, so another summation order"),
        /// The order of the buckets on the communication thread (`comm_order`; see
        /// [`comm_order`] for where `priority` applies).
        #[serde(serialize_with = "as_flag")]
        CommOrder comm_order: CommOrder = CommOrder::Fifo
            => Rounding("priority cuts buckets into chunks: ring and rhd at 3 or more ranks sum a \
                chunk in another order than its bucket (shm, and any algorithm at 2 ranks, sum the \
                same)"),
        /// Gradient bucket size in MiB (`bucket_mb`).
        BucketMb bucket_mb: f64 = 25.0
            => Rounding("other allreduce buffers, so another summation order"),
        /// Keep images, activations and convolution weights channels-last (NHWC strides,
        /// `channels_last`), the layout tensor cores prefer.
        ChannelsLast channels_last: bool = false
            => Rounding("other convolution kernels"),
        /// Run the step compiled ahead of time by Inductor (`compile`; see [`crate::compiled`]).
        Compile compile: bool = false
            => Rounding("Inductor's fused kernels compute the same step, summing in another order"),
        /// The compile cache (`compile_cache`; none: [`crate::compiled::default_cache_dir`]).
        CompileCache compile_cache: Option<PathBuf> = None
            => Free("where the compiled step is kept"),
        /// Options of Inductor's compile of the step, `KEY=VALUE` with VALUE a Python literal
        /// (`inductor_options`; part of the cache key).
        InductorOptions inductor_options: Vec<String> = Vec::new()
            => Rounding("other generated kernels compute the same step"),
        /// Replay the compiled step from a CUDA graph after a few plain steps (`cuda_graphs`;
        /// GPUs only, with `compile`).
        CudaGraphs cuda_graphs: bool = false
            => Free("a graph replays the compiled step's own kernels"),
        /// Evaluate on the val split after every epoch.
        Eval eval: bool = true
            => Free("evaluation does not train"),
        /// Shorter side before the center crop in evaluation; 0 = image size x 8/7 (`eval_resize`).
        EvalResize eval_resize: u32 = 0
            => Free("evaluation does not train"),
        /// The eval resize as a multiple of the image size when `eval_resize` is 0.
        EvalResizeRatio eval_resize_ratio: f64 = EVAL_RESIZE_RATIO
            => Free("evaluation does not train"),
        /// The train image size of each epoch (empty: `image_size` throughout).
        ImageSizeSchedule image_size_schedule: SizeSchedule = SizeSchedule::default()
            => Trajectory("other input pixels from its epochs on"),
        /// RandomResizedCrop's range of the crop's area fraction.
        CropScale crop_scale: [f64; 2] = [0.08, 1.0]
            => Trajectory("other crops"),
        /// RandomResizedCrop's range of the crop's aspect ratio.
        CropRatio crop_ratio: [f64; 2] = [0.75, 4.0 / 3.0]
            => Trajectory("other crops"),
        /// Probability of a horizontal flip of a train image.
        FlipProb flip_prob: f64 = 0.5
            => Trajectory("other flips"),
        /// Channel means of the normalisation, 0-1 scale.
        Mean mean: [f32; 3] = IMAGENET_MEAN
            => Trajectory("other input values"),
        /// Channel standard deviations of the normalisation, 0-1 scale.
        Std std: [f32; 3] = IMAGENET_STD
            => Trajectory("other input values"),
        /// Pre-fault the node's shards (`populate`).
        Populate populate: bool = false
            => Free("how the shards are loaded"),
        /// mlock the node's shards (`lock`).
        Lock lock: bool = false
            => Free("how the shards are loaded"),
        /// Copy the node's shards here first, e.g. /dev/shm/ddl (`stage`).
        Stage stage: Option<PathBuf> = None
            => Free("how the shards are loaded"),
        /// Timeout of one communication operation in seconds (`comm_timeout_s`).
        CommTimeoutS comm_timeout_s: u64 = 600
            => Free("when a hung job fails"),
        /// `replace`, `skip` or `fail`: what a training batch does with a record whose checksum
        /// or decoding fails (`on_bad_record`; evaluation never scores a stand-in, it skips).
        OnBadRecord on_bad_record: OnBadRecord = OnBadRecord::Replace
            => Trajectory("other stand-ins for bad records (or none), so other batches"),
        /// Print per-epoch lines (rank 0).
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
        Device device,
        /// The architecture of a state dict without ddl metadata ([`crate::predict`]).
        Arch arch,
        /// The file [`crate::export`] writes.
        Output output,
    }
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

impl std::str::FromStr for Overlap {
    type Err = TrainError;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "off" => Ok(Overlap::Off),
            "pipeline" => Ok(Overlap::Pipeline),
            "backward" => Ok(Overlap::Backward),
            _ => Err(TrainError::config(
                Setting::Overlap,
                format!("{s:?} is not backward, pipeline, off or auto"),
            )),
        }
    }
}

impl Overlap {
    /// Name as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Overlap::Off => "off",
            Overlap::Pipeline => "pipeline",
            Overlap::Backward => "backward",
        }
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
