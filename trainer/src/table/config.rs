//! What a table of one rank is built for ([`TableConfig`]).

use ddl_comm::CommOrder;
use tch::Device;

use crate::compiled::CompileSettings;
use crate::config::{Overlap, Precision};
use crate::model::ModelKind;
use crate::optim::SgdConfig;

/// Configuration of the table of one rank.
#[derive(Clone, Debug)]
pub struct TableConfig {
    /// One replica per entry.
    pub devices: Vec<Device>,
    /// Network.
    pub model: ModelKind,
    /// Number of output classes.
    pub classes: i64,
    /// Square input size in pixels.
    pub image_size: u32,
    /// Channel means of the normalisation of uint8 batches on the device (0-1 scale).
    pub mean: [f32; 3],
    /// Channel standard deviations of that normalisation.
    pub std: [f32; 3],
    /// Seed of the weight initialisation (identical on every rank).
    pub seed: u64,
    /// Optimizer.
    pub sgd: SgdConfig,
    /// Forward/backward precision.
    pub precision: Precision,
    /// Label smoothing of the cross-entropy loss.
    pub label_smoothing: f64,
    /// Target bucket size in bytes.
    pub bucket_bytes: usize,
    /// What the gradient reduction overlaps with.
    pub overlap: Overlap,
    /// The order of the buckets on the communication thread: `priority` only with
    /// `Overlap::Backward`, several ranks and no fp16 (see `crate::config::comm_order`).
    pub comm_order: CommOrder,
    /// Channels-last images and convolution weights (activations follow).
    pub channels_last: bool,
    /// Total number of replicas over all ranks (the divisor of the gradient sum).
    pub global_replicas: usize,
    /// Ranks of the job: with one, gradients never leave the devices.
    pub ranks: usize,
    /// With `synthetic_data`: images per replica of the batch made on each device.
    pub synthetic_batch: Option<usize>,
    /// Images per replica of a training batch (and per rank of an evaluation batch).
    pub batch: usize,
    /// This rank's index among the `ranks`.
    pub rank: usize,
    /// Split the classifier head by class over every replica of the job.
    pub head_parallel: bool,
    /// CPU replicas on a node whose ranks outnumber its cores: the replica threads run below
    /// the communication thread's CPU priority ([`COMPUTE_NICE`]), so that it gets a core as
    /// soon as its data arrives instead of waiting for a replica's time slice (every step
    /// waits for the slowest allreduce; BENCHMARKS.md, "Communication priorities").
    ///
    /// [`COMPUTE_NICE`]: ddl_comm::cores::COMPUTE_NICE
    pub yield_to_comm: bool,
    /// Run the step compiled by Inductor (`compile`): where its packages are cached and the
    /// image sizes it is compiled for; none: the eager step.
    pub compile: Option<CompileSettings>,
}
