//! The report of a profile: its JSON layout (see the module's parent for the schema).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::stage::Stage;

/// Version of the JSON report layout.
pub const SCHEMA_VERSION: u32 = 1;

/// The dataset profiled.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DatasetInfo {
    /// Shard directory.
    pub dir: PathBuf,
    /// Split.
    pub split: String,
    /// This node.
    pub node: usize,
    /// Number of nodes the split is spread over.
    pub nodes: usize,
    /// Shards this node owns.
    pub shards: usize,
    /// Records on this node.
    pub records: u64,
    /// Bytes of this node's shard files.
    pub file_bytes: u64,
    /// Mean encoded record size in bytes.
    pub mean_record_bytes: f64,
    /// Mean image width in pixels (from the index).
    pub mean_width: f64,
    /// Mean image height in pixels (from the index).
    pub mean_height: f64,
}

/// The settings the figures were measured with.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ConfigInfo {
    /// Thread counts measured.
    pub threads: Vec<usize>,
    /// Images per batch.
    pub batch: usize,
    /// Output side in pixels.
    pub image_size: u32,
    /// `train` or `eval`.
    pub augment: String,
    /// `f32_nchw`.
    pub output: String,
    /// Decoder of the pipeline: `region`.
    pub decode_mode: String,
    /// Seconds per end-to-end measurement.
    pub seconds: f64,
    /// Seconds per stage measurement.
    pub stage_seconds: f64,
    /// Pipeline queue depth.
    pub prefetch: usize,
    /// Seed.
    pub seed: u64,
    /// Images/s one GPU consumes.
    pub gpu_rate_images_per_s: f64,
    /// Whether reads were cold.
    pub cold: bool,
    /// Records copied to RAM for the decode stages.
    pub sample_records: usize,
    /// `--on-bad-record`: `fail`, `skip` or `replace`.
    #[serde(default)]
    pub on_bad_record: String,
}

/// What dropping the page cache achieved (`--cold`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ColdInfo {
    /// Shard files dropped.
    pub files: usize,
    /// Their total size in bytes.
    pub file_bytes: u64,
    /// Bytes of them resident in RAM before the first drop.
    pub resident_bytes_before: u64,
    /// Bytes of them resident right after the first drop.
    pub resident_bytes_after: u64,
}

/// One stage at one thread count.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StageRow {
    /// The stage.
    pub stage: Stage,
    /// Threads running it.
    pub threads: usize,
    /// Items (images) processed.
    pub images: u64,
    /// Wall seconds measured (for `derived` rows: the summed per-thread attributed time
    /// divided by the thread count).
    pub seconds: f64,
    /// Images per second, all threads together.
    pub images_per_s: f64,
    /// Bytes per second, all threads together (see `bytes_basis`).
    pub bytes_per_s: f64,
    /// What `bytes_per_s` counts: `encoded`, `rgb_u8`, `f32` or `payload`.
    pub bytes_basis: String,
    /// `measured` or `derived: ...`.
    pub method: String,
    /// Bytes the process read from storage during the measurement (`read_bytes` of
    /// `/proc/self/io`); read stage only, where the kernel reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_bytes: Option<u64>,
}

/// The real pipeline at one thread count.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EndToEndRow {
    /// Pipeline workers.
    pub threads: usize,
    /// Images delivered.
    pub images: u64,
    /// Batches delivered.
    pub batches: u64,
    /// Wall seconds.
    pub seconds: f64,
    /// Images per second delivered to the consumer.
    pub images_per_s: f64,
    /// Rate relative to the smallest thread count measured.
    pub speedup: f64,
    /// `speedup / (threads / smallest threads)`.
    pub efficiency: f64,
    /// Fraction of the workers' wall time spent decoding (pipeline statistics).
    pub worker_busy_frac: f64,
    /// Bad records met.
    pub skipped: u64,
}

/// Bad records named in a report, at most.
pub const BAD_RECORDS_SHOWN: usize = 10;

/// A bad record met while profiling.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BadRecordSeen {
    /// The shard file.
    pub file: PathBuf,
    /// The record's index within the shard.
    pub record: usize,
    /// Why it is bad (checksum mismatch, decoder message).
    pub reason: String,
}

/// The bad records met: each counted once, however often the stages met it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BadRecords {
    /// Distinct bad records met.
    pub count: u64,
    /// The first [`BAD_RECORDS_SHOWN`] of them, in the order met.
    pub first: Vec<BadRecordSeen>,
}

/// The conclusion.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Verdict {
    /// Thread count of the verdict (the largest measured).
    pub threads: usize,
    /// End-to-end images/s at that thread count: what the node sustains.
    pub node_images_per_s: f64,
    /// Pipeline stage with the lowest rate alone.
    pub bottleneck: Stage,
    /// Its rate alone.
    pub bottleneck_images_per_s: f64,
    /// Rate the pipeline stages would reach run back to back by each worker:
    /// `1 / sum(1 / rate)`.
    pub predicted_images_per_s: f64,
    /// Share of each pipeline stage in the per-image time (sums to 1).
    pub time_share: BTreeMap<Stage, f64>,
    /// Images/s one GPU consumes.
    pub gpu_rate_images_per_s: f64,
    /// Whole GPUs the node feeds.
    pub gpus_fed: u64,
    /// `node_images_per_s / gpu_rate_images_per_s`.
    pub gpus_fed_exact: f64,
    /// The verdict as one line of text.
    pub line: String,
}

/// Everything one profile run measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Unit of each kind of field.
    pub units: BTreeMap<String, String>,
    /// The data.
    pub dataset: DatasetInfo,
    /// The settings.
    pub config: ConfigInfo,
    /// Page-cache drop results, with `--cold`.
    pub cold: Option<ColdInfo>,
    /// Every stage at every thread count.
    pub stages: Vec<StageRow>,
    /// The real pipeline at every thread count.
    pub end_to_end: Vec<EndToEndRow>,
    /// Bad records met by any measurement.
    #[serde(default)]
    pub bad_records: BadRecords,
    /// The conclusion.
    pub verdict: Verdict,
}

pub(crate) fn units() -> BTreeMap<String, String> {
    [
        ("images_per_s", "images/s"),
        ("bytes_per_s", "bytes/s"),
        ("node_images_per_s", "images/s"),
        ("bottleneck_images_per_s", "images/s"),
        ("predicted_images_per_s", "images/s"),
        ("gpu_rate_images_per_s", "images/s per GPU"),
        ("seconds", "s"),
        ("stage_seconds", "s"),
        ("file_bytes", "bytes"),
        ("mean_record_bytes", "bytes"),
        ("resident_bytes_before", "bytes"),
        ("resident_bytes_after", "bytes"),
        ("mean_width", "pixels"),
        ("mean_height", "pixels"),
        ("image_size", "pixels"),
        ("time_share", "fraction of per-image time"),
        ("worker_busy_frac", "fraction"),
        ("efficiency", "fraction"),
        ("speedup", "ratio"),
        ("gpus_fed", "GPUs"),
        ("gpus_fed_exact", "GPUs"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}
