//! What the pipeline's threads share: the epoch, the workers and the counters behind
//! [`PipelineStats`].

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};

use super::batch::{BadRecord, Batch};
use super::config::PipelineConfig;
use crate::dataset::Dataset;
use crate::error::Result;
use crate::sampler::Sampler;
use crate::transform::Transformer;

/// Counters of a running pipeline.
#[derive(Clone, Debug, Default)]
pub struct PipelineStats {
    /// Batches delivered to the replica queues.
    pub batches: u64,
    /// Images decoded into batches.
    pub images: u64,
    /// Bad records met (each is skipped or replaced or fails its batch).
    pub skipped: u64,
    /// The first [`MAX_BAD_RECORDS_KEPT`] bad records.
    ///
    /// [`MAX_BAD_RECORDS_KEPT`]: super::config::MAX_BAD_RECORDS_KEPT
    pub bad_records: Vec<BadRecord>,
    /// Seconds the workers spent on images, summed over workers.
    pub busy_seconds: f64,
    /// Pixels produced by the JPEG decoder (after DCT scaling and region cropping).
    pub decoded_pixels: u64,
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) batches: AtomicU64,
    pub(super) images: AtomicU64,
    pub(super) skipped: AtomicU64,
    pub(super) busy_ns: AtomicU64,
    pub(super) decoded_pixels: AtomicU64,
    pub(super) bad: Mutex<Vec<BadRecord>>,
}

pub(super) struct Shared {
    pub(super) dataset: Arc<Dataset>,
    pub(super) sampler: Sampler,
    pub(super) cfg: PipelineConfig,
    pub(super) epoch: u64,
    pub(super) image_len: usize,
    pub(super) stop: AtomicBool,
    pub(super) workers: Vec<Mutex<Transformer>>,
    pub(super) counters: Counters,
}

pub(super) type Done = (usize, usize, Result<Batch>);
