//! What a pipeline is told ([`PipelineConfig`]) and its limits.

use crate::transform::{Augment, Output, TrainAugment, IMAGENET_MEAN, IMAGENET_STD};

/// How many later records of the epoch order [`OnBadRecord::Replace`] tries before giving up.
pub const MAX_SUBSTITUTES: usize = 64;

/// Most bad records kept in [`PipelineStats::bad_records`] (all are counted and logged).
///
/// [`PipelineStats::bad_records`]: super::shared::PipelineStats::bad_records
pub const MAX_BAD_RECORDS_KEPT: usize = 1024;

/// What to do with a record whose checksum fails or whose bytes cannot be decoded.
///
/// Every bad record is logged (`tracing::warn!` with shard file, record and reason), kept in
/// [`PipelineStats::bad_records`], and counted in [`Batch::skipped`]. Whether a record is bad
/// depends only on its bytes, so all three rules are deterministic.
///
/// [`PipelineStats::bad_records`]: super::shared::PipelineStats::bad_records
/// [`Batch::skipped`]: super::batch::Batch::skipped
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum OnBadRecord {
    /// Leave the record out: the batch is shorter by one (labels and indices stay aligned).
    Skip,
    /// Fill the slot with the first good record that follows it in the epoch's order
    /// (wrapping; at most [`MAX_SUBSTITUTES`] tries): fixed batch size, a few duplicates.
    Replace,
    /// Deliver an error for the whole batch instead.
    Fail,
}

/// Settings of a [`Pipeline`].
///
/// [`Pipeline`]: super::Pipeline
#[derive(Clone, Debug)]
pub struct PipelineConfig {
    /// Output side in pixels (224).
    pub image_size: u32,
    /// Output type and layout.
    pub output: Output,
    /// Train or eval transform.
    pub augment: Augment,
    /// The train transform's crop scale and ratio and flip probability.
    pub train: TrainAugment,
    /// Decode threads.
    pub workers: usize,
    /// Depth of each replica's queue of ready batches.
    pub prefetch: usize,
    /// Seed of the crops and flips.
    pub seed: u64,
    /// Handling of bad records.
    pub on_bad_record: OnBadRecord,
    /// Channel means (0-1 scale) for [`Output::F32Nchw`].
    pub mean: [f32; 3],
    /// Channel standard deviations (0-1 scale) for [`Output::F32Nchw`].
    pub std: [f32; 3],
}

impl Default for PipelineConfig {
    /// ImageNet training at 224 pixels, float32 NCHW, one worker per available core,
    /// prefetch 2, seed 0, bad records replaced.
    fn default() -> Self {
        PipelineConfig {
            image_size: 224,
            output: Output::F32Nchw,
            augment: Augment::Train,
            train: TrainAugment::default(),
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            prefetch: 2,
            seed: 0,
            on_bad_record: OnBadRecord::Replace,
            mean: IMAGENET_MEAN,
            std: IMAGENET_STD,
        }
    }
}
