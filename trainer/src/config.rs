//! The configuration of a training run: [`TrainConfig`] (the `ddl-train` flags) and the types
//! of its flags.

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
use crate::setting::Setting;
use crate::signal::StopRequest;
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

/// Everything a training run is configured with (the `ddl-train` flags).
#[derive(Clone, Debug, Serialize)]
pub struct TrainConfig {
    /// Directory with `manifest.json` and the shards (`data`; empty with `synthetic_data`).
    pub data: PathBuf,
    /// Train on one random batch held on each device instead of `data`: the model, the table
    /// and the allreduce alone, for speed measurements (`synthetic_data`).
    pub synthetic_data: bool,
    /// Classes of the synthetic data's model (`classes`; with data, the manifest's).
    pub classes: Option<usize>,
    /// cuDNN's deterministic algorithms instead of its benchmark mode (`deterministic`):
    /// on a GPU, a resumed run is then bitwise the uninterrupted one.
    pub deterministic: bool,
    /// Network (`model`).
    pub model: ModelKind,
    /// Epochs to train (`epochs`).
    pub epochs: u32,
    /// Images per replica per step (`batch`).
    pub batch: usize,
    /// Local devices (`devices`).
    #[serde(serialize_with = "as_flag")]
    pub devices: DeviceSpec,
    /// Input side in pixels (`image_size`).
    pub image_size: u32,
    /// Decode threads per rank (`workers`).
    pub workers: usize,
    /// Ready batches queued per replica (`prefetch`).
    pub prefetch: usize,
    /// Seed of weights, sampling and augmentation (`seed`).
    pub seed: u64,
    /// Base learning rate per 256 images (`base_lr`).
    pub base_lr: f64,
    /// Peak learning rate, overriding the linear scaling rule (`lr`).
    pub lr: Option<f64>,
    /// SGD momentum (`momentum`).
    pub momentum: f64,
    /// Nesterov momentum (`nesterov`).
    pub nesterov: bool,
    /// Weight decay of conv/linear weights (`weight_decay`).
    pub weight_decay: f64,
    /// Warmup epochs, fractional allowed (`warmup_epochs`).
    pub warmup_epochs: f64,
    /// Learning-rate decay after warmup (`schedule`).
    pub schedule: DecayKind,
    /// Step-decay epochs (`milestones`).
    pub milestones: Vec<u32>,
    /// Step-decay factor (`gamma`).
    pub gamma: f64,
    /// Label smoothing (`label_smoothing`).
    pub label_smoothing: f64,
    /// Arithmetic of forward and backward (`precision`).
    pub precision: Precision,
    /// JSON-lines metrics file written by rank 0 (`metrics`).
    pub metrics: Option<PathBuf>,
    /// JSON-lines record trace, one file per rank: the global ids of the records of every
    /// batch trained (`trace_records`; format: `ddl_loader::trace_records`).
    pub trace_records: Option<PathBuf>,
    /// Checkpoint directory (`checkpoint_dir`).
    pub checkpoint_dir: Option<PathBuf>,
    /// Checkpoint every N global steps, 0 = only at epoch ends (`checkpoint_every`).
    pub checkpoint_every: u64,
    /// Checkpoints kept (`keep_checkpoints`).
    pub keep_checkpoints: usize,
    /// Continue from the newest valid checkpoint (`resume`).
    pub resume: bool,
    /// Move another run's checkpoints in the directory aside and start over (`restart`).
    pub restart: bool,
    /// Resume on a different layout (ranks, replicas, nodes) than the checkpoint's
    /// (`allow_new_layout`).
    pub allow_new_layout: bool,
    /// Stop after this many global steps (`max_steps`).
    pub max_steps: Option<u64>,
    /// Allreduce algorithm (`allreduce`).
    #[serde(serialize_with = "as_flag")]
    pub allreduce: Algorithm,
    /// Cost model `auto` chooses with, from `ddl-bench calibrate` (`cost_model`; none: the
    /// default model's formulas).
    pub cost_model: Option<PathBuf>,
    /// Where rank 0 writes the cost model `allreduce` auto tuned online, whenever it
    /// settles another buffer size (`save_cost_model`), for `cost_model` of later jobs.
    pub save_cost_model: Option<PathBuf>,
    /// Split the classifier head by class over every replica of the job, the backbone staying
    /// data-parallel (`head_parallel`; see [`crate::table`]).
    pub head_parallel: bool,
    /// Allgather / reduce-scatter algorithm of `head_parallel`'s exchanges (`gather`).
    #[serde(serialize_with = "as_flag")]
    pub gather: ShardAlgorithm,
    /// Write final replica-0 weights here (`dump_weights`).
    pub dump_weights: Option<PathBuf>,
    /// Write the final model here as a torchvision-compatible `.safetensors` file
    /// (`export`; see [`crate::weights`]).
    pub export: Option<PathBuf>,
    /// Start from the weights of this `.safetensors` file, with torchvision's names
    /// (`init_from`), unless `resume` finds a checkpoint.
    pub init_from: Option<PathBuf>,
    /// Re-initialise the classifier head instead of loading it from `init_from`
    /// (`reset_head`: fine-tuning on another class count).
    pub reset_head: bool,
    /// Compare replica checksums every epoch (`check_replicas`).
    pub check_replicas: bool,
    /// How the ranks of a node share the dataset (`residency`).
    pub residency: ResidencyMode,
    /// Fraction of every node's train records exchanged with the other nodes at each epoch
    /// boundary, in `[0, 1]` (`exchange`; ddl-exchange).
    pub exchange: f64,
    /// What the gradient allreduce overlaps with (`overlap` backward|pipeline|off|auto);
    /// `None` = auto ([`auto_overlap`]).
    pub overlap: Option<Overlap>,
    /// The order of the buckets on the communication thread (`comm_order`; see
    /// [`comm_order`] for where `priority` applies).
    #[serde(serialize_with = "as_flag")]
    pub comm_order: CommOrder,
    /// Gradient bucket size in MiB (`bucket_mb`).
    pub bucket_mb: f64,
    /// Keep images, activations and convolution weights channels-last (NHWC strides,
    /// `channels_last`), the layout tensor cores prefer.
    pub channels_last: bool,
    /// Run the step compiled ahead of time by Inductor (`compile`; see [`crate::compiled`]).
    pub compile: bool,
    /// The compile cache (`compile_cache`; none: [`crate::compiled::default_cache_dir`]).
    pub compile_cache: Option<PathBuf>,
    /// Evaluate on the val split after every epoch.
    pub eval: bool,
    /// Shorter side before the center crop in evaluation; 0 = image size x 8/7 (`eval_resize`).
    pub eval_resize: u32,
    /// The eval resize as a multiple of the image size when `eval_resize` is 0.
    pub eval_resize_ratio: f64,
    /// The train image size of each epoch (empty: `image_size` throughout).
    pub image_size_schedule: SizeSchedule,
    /// RandomResizedCrop's range of the crop's area fraction.
    pub crop_scale: [f64; 2],
    /// RandomResizedCrop's range of the crop's aspect ratio.
    pub crop_ratio: [f64; 2],
    /// Probability of a horizontal flip of a train image.
    pub flip_prob: f64,
    /// Channel means of the normalisation, 0-1 scale.
    pub mean: [f32; 3],
    /// Channel standard deviations of the normalisation, 0-1 scale.
    pub std: [f32; 3],
    /// Pre-fault the node's shards (`populate`).
    pub populate: bool,
    /// mlock the node's shards (`lock`).
    pub lock: bool,
    /// Copy the node's shards here first, e.g. /dev/shm/ddl (`stage`).
    pub stage: Option<PathBuf>,
    /// Timeout of one communication operation in seconds (`comm_timeout_s`).
    pub comm_timeout_s: u64,
    /// `replace`, `skip` or `fail`: what a training batch does with a record whose checksum
    /// or decoding fails (`on_bad_record`; evaluation never scores a stand-in, it skips).
    pub on_bad_record: OnBadRecord,
    /// Print per-epoch lines (rank 0).
    pub verbose: bool,
    /// Raised by SIGTERM/SIGINT (see [`crate::signal`]): the run stops after the current step.
    #[serde(skip)]
    pub stop: StopRequest,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            data: PathBuf::new(),
            synthetic_data: false,
            classes: None,
            deterministic: false,
            model: ModelKind::Resnet50,
            epochs: 90,
            batch: 32,
            devices: DeviceSpec::Auto,
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
            schedule: DecayKind::Step,
            milestones: vec![30, 60, 80],
            gamma: 0.1,
            label_smoothing: 0.0,
            precision: Precision::Fp32,
            metrics: None,
            trace_records: None,
            checkpoint_dir: None,
            checkpoint_every: 0,
            keep_checkpoints: 3,
            resume: false,
            restart: false,
            allow_new_layout: false,
            max_steps: None,
            allreduce: Algorithm::Auto,
            cost_model: None,
            save_cost_model: None,
            head_parallel: false,
            gather: ShardAlgorithm::Auto,
            dump_weights: None,
            export: None,
            init_from: None,
            reset_head: false,
            check_replicas: false,
            residency: ResidencyMode::Node,
            exchange: 0.0,
            overlap: None,
            comm_order: CommOrder::Fifo,
            bucket_mb: 25.0,
            channels_last: false,
            compile: false,
            compile_cache: None,
            eval: true,
            eval_resize: 0,
            eval_resize_ratio: EVAL_RESIZE_RATIO,
            image_size_schedule: SizeSchedule::default(),
            crop_scale: [0.08, 1.0],
            crop_ratio: [0.75, 4.0 / 3.0],
            flip_prob: 0.5,
            mean: IMAGENET_MEAN,
            std: IMAGENET_STD,
            populate: false,
            lock: false,
            stage: None,
            comm_timeout_s: 600,
            on_bad_record: OnBadRecord::Replace,
            verbose: true,
            stop: StopRequest::default(),
        }
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
