//! `ddl-prof`: how fast can this node feed its GPUs?
//!
//! [`profile`] measures, in one run on the same files and cores, the throughput of every stage
//! of the input pipeline *alone* and of the *whole* pipeline (the real
//! [`ddl_loader::pipeline::Pipeline`]), for each requested thread count, and ends with a
//! [`Verdict`]: the node's sustained rate (end to end at the largest thread count), the
//! bottleneck stage, and how many GPUs of a given speed that rate feeds.
//!
//! # Stages
//!
//! | stage | what one item is | measured how |
//! |---|---|---|
//! | `read` | one record's bytes, `pread` from its shard file into a buffer | page cache (RAM), or storage after [`drop_page_cache`] with `--cold` (each record read at most once then) |
//! | `check` | [`Dataset::record`]: index row, bounds, crc32c of the mapped bytes | mapped shards in RAM (with `--cold`: the sampled records, brought in untimed first) |
//! | `decode_full` | JPEG header + full-resolution decode to RGB ([`JpegDecoder`], `DecodeMode::Full`) | records copied to RAM first |
//! | `decode_scaled` | header + crop geometry + DCT-scaled decode of the whole image (`DecodeMode::Scaled`) | same |
//! | `decode_region` | header + crop geometry + scaled decode of the crop's region only (`DecodeMode::Region`, what the pipeline runs) | same |
//! | `crop_resize` | crop + antialiased resize to `size`² ([`Transformer::apply`] to uint8 minus the `decode_region` work on the same image, in thread CPU time, timed back to back) | derived |
//! | `normalize` | normalize + collate: [`Normalizer::write_chw`] of one resized image into its slot of a float32 batch buffer | resized images in RAM |
//! | `queue` | hand-off of batch-sized messages through a bounded channel (`std::sync::mpsc::sync_channel`, the crossbeam algorithm std adopted), recycled through a free list like the pipeline's buffers; `threads` producers, one consumer | counted in images (batches × batch) |
//!
//! With `T` threads every stage runs on `T` threads at once, each on its own share of the
//! records (in the epoch-0 shuffled order), for `stage_seconds`; the end-to-end run uses a
//! pipeline with `T` workers for `seconds`, restarting epochs as needed and counting every
//! image delivered to the consumer, pipeline start-up included (the trainer pays it too).
//!
//! With `--cold`, the node's shards are unmapped and dropped from the page cache
//! ([`drop_page_cache`]) before each thread count's read stage and before each end-to-end run,
//! so both read from storage (the pipeline through page faults on its mapping, with the
//! device's read-ahead); the read stage's `storage_bytes` (from `/proc/self/io`) shows what
//! came from storage. To emulate slow storage, run under a throttle, e.g. a cgroup-v1
//! `blkio.throttle.read_bps_device` limit.
//!
//! # Bad records
//!
//! A record whose checksum fails or that cannot be decoded is handled as
//! `ProfConfig::on_bad_record` says: `Fail` stops the profile with an error naming the shard
//! file and record; `Skip` and `Replace` leave it out of the stage measurements (and the
//! pipeline skips or replaces it as in training). Every bad record met is counted once and the
//! first [`BAD_RECORDS_SHOWN`] are named in the report (`bad_records`) and the table.
//!
//! # JSON schema (`--json FILE`, version [`SCHEMA_VERSION`])
//!
//! Every number's unit is in its name: `*_per_s` are per second of wall time, `seconds` are
//! seconds, `*bytes*` are bytes, `images`/`batches`/`records` are counts; `units` repeats this.
//!
//! ```text
//! {
//!   "schema_version": 1,
//!   "units": {"images_per_s": "images/s", "bytes_per_s": "bytes/s", ...},
//!   "dataset": {"dir", "split", "node", "nodes", "shards", "records", "file_bytes",
//!               "mean_record_bytes", "mean_width", "mean_height"},
//!   "config": {"threads": [1, 2], "batch", "image_size", "augment": "train"|"eval",
//!              "output": "f32_nchw", "decode_mode": "region", "seconds", "stage_seconds",
//!              "prefetch", "seed", "gpu_rate_images_per_s", "cold", "sample_records",
//!              "on_bad_record": "fail"|"skip"|"replace"},
//!   "cold": null | {"files", "file_bytes", "resident_bytes_before", "resident_bytes_after"},
//!   "stages": [{"stage": "decode_full", "threads": 2, "images": 5210, "seconds": 2.0,
//!               "images_per_s": 2605.0, "bytes_per_s": 8.1e7, "bytes_basis": "encoded",
//!               "method": "measured"}, ...],   (read rows add "storage_bytes" where known)
//!   "end_to_end": [{"threads": 2, "images": 25600, "batches": 100, "seconds": 10.0,
//!                   "images_per_s": 2560.0, "speedup": 1.9, "efficiency": 0.95,
//!                   "worker_busy_frac": 0.97, "skipped": 0}, ...],
//!   "bad_records": {"count": 0, "first": [{"file", "record", "reason"}, ...]},
//!   "verdict": {"threads": 2, "node_images_per_s": 2560.0, "bottleneck": "decode_region",
//!               "bottleneck_images_per_s": 3100.0, "predicted_images_per_s": 2500.0,
//!               "time_share": {"read": 0.02, ...}, "gpu_rate_images_per_s": 1200.0,
//!               "gpus_fed": 2, "gpus_fed_exact": 2.13, "line": "..."}
//! }
//! ```
//!
//! `bytes_basis` says what `bytes_per_s` counts: `encoded` (JPEG record bytes in), `rgb_u8`
//! (resized uint8 pixels out), `f32` (normalized floats out) or `payload` (batch bytes handed
//! over by reference, not copied).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use ddl_loader::dataset::{Dataset, OpenOptions, Residency};
use ddl_loader::decode::{plan, DecodeMode, JpegDecoder};
use ddl_loader::pipeline::{OnBadRecord, Pipeline, PipelineConfig};
use ddl_loader::sampler::{Sampler, SamplerConfig, Tail, Xoshiro256};
use ddl_loader::shard::cached_bytes;
use ddl_loader::transform::{
    Augment, Normalizer, Output, Slot, TransformConfig, Transformer, IMAGENET_MEAN, IMAGENET_STD,
};
use ddl_loader::LoaderError;
use plotters::coord::Shift;
use plotters::prelude::*;
use serde::{Deserialize, Serialize};

/// Version of the JSON report layout.
pub const SCHEMA_VERSION: u32 = 1;

/// One stage of the input pipeline, measured alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Record bytes from the shard file (page cache, or storage with `--cold`).
    Read,
    /// Index row, bounds and crc32c check of a mapped record.
    Check,
    /// Full-resolution JPEG decode.
    DecodeFull,
    /// DCT-scaled JPEG decode of the whole image.
    DecodeScaled,
    /// DCT-scaled decode of the crop's region (the pipeline's decoder).
    DecodeRegion,
    /// Crop and antialiased resize to the output size.
    CropResize,
    /// Normalization into a float32 batch buffer (collate).
    Normalize,
    /// Hand-off of batch-sized messages through a bounded channel.
    Queue,
}

impl Stage {
    /// All stages, in pipeline order.
    pub const ALL: [Stage; 8] = [
        Stage::Read,
        Stage::Check,
        Stage::DecodeFull,
        Stage::DecodeScaled,
        Stage::DecodeRegion,
        Stage::CropResize,
        Stage::Normalize,
        Stage::Queue,
    ];

    /// The stages every image of the real pipeline goes through (the other decoders are
    /// references): the candidates for the bottleneck.
    pub const PIPELINE: [Stage; 6] = [
        Stage::Read,
        Stage::Check,
        Stage::DecodeRegion,
        Stage::CropResize,
        Stage::Normalize,
        Stage::Queue,
    ];

    /// The snake_case name used in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Read => "read",
            Stage::Check => "check",
            Stage::DecodeFull => "decode_full",
            Stage::DecodeScaled => "decode_scaled",
            Stage::DecodeRegion => "decode_region",
            Stage::CropResize => "crop_resize",
            Stage::Normalize => "normalize",
            Stage::Queue => "queue",
        }
    }

    /// What the stage's `bytes_per_s` counts.
    pub fn bytes_basis(self) -> &'static str {
        match self {
            Stage::Read
            | Stage::Check
            | Stage::DecodeFull
            | Stage::DecodeScaled
            | Stage::DecodeRegion => "encoded",
            Stage::CropResize => "rgb_u8",
            Stage::Normalize => "f32",
            Stage::Queue => "payload",
        }
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What to profile and how long.
#[derive(Clone, Debug)]
pub struct ProfConfig {
    /// Directory with `manifest.json` and the shards.
    pub dir: PathBuf,
    /// Split to read (`train`).
    pub split: String,
    /// Thread counts to measure, ascending; the largest gives the verdict.
    pub threads: Vec<usize>,
    /// Images per batch.
    pub batch: usize,
    /// Output side in pixels.
    pub image_size: u32,
    /// Duration of each end-to-end measurement.
    pub seconds: f64,
    /// Duration of each stage measurement (per stage and thread count).
    pub stage_seconds: f64,
    /// Eval transform (resize shorter side to `image_size * 8 / 7`, center crop) instead of
    /// the train transform (random-resized crop + flip).
    pub eval: bool,
    /// Drop this node's shards from the page cache before each read measurement and each
    /// end-to-end run, so both read from storage.
    pub cold: bool,
    /// Images/s one GPU consumes, for the verdict.
    pub gpu_rate: f64,
    /// Which node's shards to profile.
    pub residency: Residency,
    /// Seed of the record order, crops and flips.
    pub seed: u64,
    /// Queue depth of the pipeline and of the `queue` stage.
    pub prefetch: usize,
    /// Records copied to RAM for the decode, resize and normalize stages.
    pub sample_records: usize,
    /// What to do with a bad record (see the module documentation).
    pub on_bad_record: OnBadRecord,
}

impl ProfConfig {
    /// Defaults for `dir`: train split, threads 1, 2, 4, ... up to the available cores,
    /// batch 256, 224 pixels, 10 s end to end and 2 s per stage, 1,200 images/s per GPU.
    pub fn new(dir: &Path) -> ProfConfig {
        ProfConfig {
            dir: dir.to_path_buf(),
            split: "train".to_string(),
            threads: default_threads(),
            batch: 256,
            image_size: 224,
            seconds: 10.0,
            stage_seconds: 2.0,
            eval: false,
            cold: false,
            gpu_rate: 1200.0,
            residency: Residency { node: 0, nodes: 1 },
            seed: 0,
            prefetch: 2,
            sample_records: 2048,
            on_bad_record: OnBadRecord::Replace,
        }
    }

    /// Checks every setting before anything is opened or measured; errors name the flag.
    pub fn validate(&self) -> Result<()> {
        if self.threads.is_empty() || self.threads.contains(&0) {
            bail!(
                "--threads {:?}: thread counts must be at least 1",
                self.threads
            );
        }
        if self.batch == 0 {
            bail!("--batch must be at least 1");
        }
        if self.split.is_empty() {
            bail!("--split must name a split (e.g. train)");
        }
        for (flag, v) in [
            ("--seconds", self.seconds),
            ("--stage-seconds", self.stage_seconds),
            ("--gpu-rate", self.gpu_rate),
        ] {
            if !(v.is_finite() && v > 0.0) {
                bail!("{flag} {v} must be a positive number");
            }
        }
        if self.prefetch == 0 {
            bail!("--prefetch must be at least 1 (the depth of the pipeline's batch queue)");
        }
        if self.sample_records == 0 {
            bail!("--sample-records must be at least 1");
        }
        if self.residency.nodes == 0 || self.residency.node >= self.residency.nodes {
            bail!(
                "--node {} must be below --nodes {}",
                self.residency.node,
                self.residency.nodes
            );
        }
        Transformer::new(self.transform(Output::F32Nchw, DecodeMode::Region))
            .map_err(|e| anyhow!("--image-size {}: {e}", self.image_size))?;
        Ok(())
    }

    fn augment(&self) -> Augment {
        if self.eval {
            Augment::Eval {
                resize: self.image_size * 8 / 7,
            }
        } else {
            Augment::Train
        }
    }

    fn transform(&self, output: Output, decode: DecodeMode) -> TransformConfig {
        TransformConfig {
            size: self.image_size,
            augment: self.augment(),
            output,
            mean: IMAGENET_MEAN,
            std: IMAGENET_STD,
            seed: self.seed,
            decode,
        }
    }
}

/// Powers of two up to the available cores, plus the core count itself.
pub fn default_threads() -> Vec<usize> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut t: Vec<usize> = std::iter::successors(Some(1usize), |x| Some(x * 2))
        .take_while(|&x| x <= cores)
        .collect();
    if t.last() != Some(&cores) {
        t.push(cores);
    }
    t
}

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

impl Report {
    /// Rate of `stage` at `threads`, if measured.
    pub fn stage_rate(&self, stage: Stage, threads: usize) -> Option<f64> {
        self.stages
            .iter()
            .find(|r| r.stage == stage && r.threads == threads)
            .map(|r| r.images_per_s)
    }
}

fn units() -> BTreeMap<String, String> {
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

// ---------------------------------------------------------------------------------------------
// Page cache

/// CPU time the calling thread has used, in nanoseconds (0 if the clock is unavailable).
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Bytes this process has read from storage so far (`read_bytes` of `/proc/self/io`), if the
/// kernel reports it.
pub fn storage_read_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/io").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("read_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Drops the clean pages of `paths` from the page cache (`posix_fadvise(DONTNEED)` over each
/// whole file, after `fdatasync`). Pages that a process still has mapped stay resident, so
/// callers unmap the shards first.
pub fn drop_page_cache(paths: &[PathBuf]) -> Result<()> {
    for p in paths {
        let f = File::open(p).with_context(|| format!("open {}", p.display()))?;
        f.sync_data()
            .with_context(|| format!("fdatasync {}", p.display()))?;
        // SAFETY: plain syscall on a file descriptor we own; offset 0, len 0 = whole file.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if rc != 0 {
            bail!(
                "posix_fadvise(DONTNEED) on {}: {}",
                p.display(),
                std::io::Error::from_raw_os_error(rc)
            );
        }
    }
    Ok(())
}

/// Bytes of `paths` resident in the page cache (`mincore` on a fresh mapping of each file;
/// nothing is read, so measuring does not bring pages in).
pub fn resident_bytes(paths: &[PathBuf]) -> Result<u64> {
    let mut total = 0;
    for p in paths {
        total += cached_bytes(p)?;
    }
    Ok(total)
}

/// The distinct bad records met so far: (shard file, record) keys, and each record in the
/// order first met.
type SeenBadRecords = (BTreeSet<(PathBuf, usize)>, Vec<BadRecordSeen>);

/// Collects the bad records met from every thread and applies `--on-bad-record fail`.
struct BadLog {
    policy: OnBadRecord,
    dir: PathBuf,
    seen: Mutex<SeenBadRecords>,
}

impl BadLog {
    fn new(cfg: &ProfConfig) -> BadLog {
        BadLog {
            policy: cfg.on_bad_record,
            dir: cfg.dir.clone(),
            seen: Mutex::new((BTreeSet::new(), Vec::new())),
        }
    }

    /// Notes that record `record` of `file` is bad; under `Fail` returns the error that stops
    /// the profile.
    fn met(&self, file: &Path, record: usize, reason: &str) -> Result<()> {
        if self.policy == OnBadRecord::Fail {
            bail!(
                "{}: record {record}: {reason} (--on-bad-record fail); `ddl-pack --verify {}` \
                 lists every damaged record, --on-bad-record replace profiles around them",
                file.display(),
                self.dir.display()
            );
        }
        let mut g = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if g.0.insert((file.to_path_buf(), record)) && g.1.len() < BAD_RECORDS_SHOWN {
            g.1.push(BadRecordSeen {
                file: file.to_path_buf(),
                record,
                reason: reason.to_string(),
            });
        }
        Ok(())
    }

    /// Notes `e` if it is a bad record (checksum or decode error); any other error is
    /// returned as it is.
    fn met_error(&self, e: LoaderError) -> Result<()> {
        match e {
            LoaderError::RecordChecksum {
                path,
                record,
                expected,
                actual,
            } => self.met(
                &path,
                record,
                &format!(
                    "checksum mismatch: stored crc32c {expected:#010x}, data has {actual:#010x}"
                ),
            ),
            LoaderError::Decode {
                path,
                record,
                reason,
            } => self.met(&path, record, &format!("cannot decode: {reason}")),
            other => Err(other.into()),
        }
    }

    fn report(&self) -> BadRecords {
        let g = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        BadRecords {
            count: g.0.len() as u64,
            first: g.1.clone(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Measurement helpers

/// What one thread did in one stage measurement.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    images: u64,
    bytes: u64,
    /// For derived stages: time attributed to the stage, in nanoseconds.
    attributed_ns: u64,
}

/// Runs `work(thread, deadline)` for `stage` on `threads` scoped threads (named
/// `<stage> <t>/<threads>` in the trace) and returns their tallies and the wall time from
/// start until the last one finished.
fn parallel<F>(stage: Stage, threads: usize, seconds: f64, work: F) -> Result<(Vec<Tally>, f64)>
where
    F: Fn(usize, Instant) -> Result<Tally> + Sync,
{
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let results: Vec<Result<Tally>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let work = &work;
                s.spawn(move || {
                    ddl_trace::set_thread_name(format!("{stage} {t}/{threads}"));
                    work(t, deadline)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("stage thread panicked")))
            })
            .collect()
    });
    let wall = start.elapsed().as_secs_f64();
    let tallies = results.into_iter().collect::<Result<Vec<_>>>()?;
    Ok((tallies, wall))
}

fn row(stage: Stage, threads: usize, tallies: &[Tally], wall: f64) -> StageRow {
    let images: u64 = tallies.iter().map(|t| t.images).sum();
    let bytes: u64 = tallies.iter().map(|t| t.bytes).sum();
    let wall = wall.max(1e-9);
    StageRow {
        stage,
        threads,
        images,
        seconds: wall,
        images_per_s: images as f64 / wall,
        bytes_per_s: bytes as f64 / wall,
        bytes_basis: stage.bytes_basis().to_string(),
        method: "measured".to_string(),
        storage_bytes: None,
    }
}

/// A row from per-thread attributed times: each thread's rate is its items over its own
/// attributed time; the stage's rate is their sum.
fn derived_row(stage: Stage, threads: usize, tallies: &[Tally], method: &str) -> StageRow {
    let mut images_per_s = 0.0;
    let mut bytes_per_s = 0.0;
    let mut secs = 0.0;
    for t in tallies {
        let s = (t.attributed_ns as f64 * 1e-9).max(1e-9);
        images_per_s += t.images as f64 / s;
        bytes_per_s += t.bytes as f64 / s;
        secs += s;
    }
    StageRow {
        stage,
        threads,
        images: tallies.iter().map(|t| t.images).sum(),
        seconds: secs / tallies.len().max(1) as f64,
        images_per_s,
        bytes_per_s,
        bytes_basis: stage.bytes_basis().to_string(),
        method: method.to_string(),
        storage_bytes: None,
    }
}

/// One record copied into RAM for the CPU stages.
struct SampleImage {
    bytes: Vec<u8>,
    id: u64,
    /// Index of its shard file in `Prof::paths`.
    file: u32,
    /// Its index within that shard.
    record: usize,
}

/// Where one record lies in its shard file.
#[derive(Clone, Copy)]
struct ReadItem {
    file: u32,
    offset: u64,
    len: u32,
}

/// The items thread `t` of `threads` handles: `t, t + threads, ...`, wrapping around unless
/// `once` (then each item at most once).
fn strided(n: usize, t: usize, threads: usize, once: bool) -> impl Iterator<Item = usize> {
    let first = t % n.max(1);
    let mut k = 0usize;
    std::iter::from_fn(move || {
        let i = first + k * threads;
        if n == 0 || (once && i >= n) {
            return None;
        }
        k += 1;
        Some(i % n)
    })
}

/// A seeded permutation of `0..n` (Fisher-Yates with the loader's xoshiro256**).
fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut p: Vec<usize> = (0..n).collect();
    let mut rng = Xoshiro256::from_seed(seed ^ 0x5052_4F46);
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        p.swap(i, j);
    }
    p
}

// ---------------------------------------------------------------------------------------------
// The profiler

/// State shared by the stage measurements.
struct Prof<'a> {
    cfg: &'a ProfConfig,
    paths: Vec<PathBuf>,
    items: Vec<ReadItem>,
    order: Vec<usize>,
    sample: Vec<SampleImage>,
    resized: Vec<Vec<u8>>,
    bad: &'a BadLog,
}

fn open_dataset(cfg: &ProfConfig, populate: bool) -> Result<Arc<Dataset>> {
    let opts = OpenOptions {
        populate,
        ..OpenOptions::default()
    };
    let ds = Dataset::open(&cfg.dir, &cfg.split, cfg.residency, &opts).with_context(|| {
        format!(
            "open split {} of {} as node {} of {}",
            cfg.split,
            cfg.dir.display(),
            cfg.residency.node,
            cfg.residency.nodes
        )
    })?;
    Ok(Arc::new(ds))
}

impl Prof<'_> {
    fn read(&self, threads: usize) -> Result<StageRow> {
        let files = self
            .paths
            .iter()
            .map(|p| File::open(p).with_context(|| format!("open {}", p.display())))
            .collect::<Result<Vec<_>>>()?;
        let once = self.cfg.cold;
        let max_len = self.items.iter().map(|i| i.len).max().unwrap_or(0) as usize;
        let storage_before = storage_read_bytes();
        let (tallies, wall) = parallel(
            Stage::Read,
            threads,
            self.cfg.stage_seconds,
            |t, deadline| {
                let mut buf = vec![0u8; max_len];
                let mut tally = Tally::default();
                for k in strided(self.order.len(), t, threads, once) {
                    let it = self.items[self.order[k]];
                    let len = it.len as usize;
                    files[it.file as usize]
                        .read_exact_at(&mut buf[..len], it.offset)
                        .with_context(|| {
                            format!("read {}", self.paths[it.file as usize].display())
                        })?;
                    std::hint::black_box(&buf[..len]);
                    tally.images += 1;
                    tally.bytes += len as u64;
                    if Instant::now() >= deadline {
                        break;
                    }
                }
                Ok(tally)
            },
        )?;
        let mut r = row(Stage::Read, threads, &tallies, wall);
        r.storage_bytes = storage_before
            .zip(storage_read_bytes())
            .map(|(b, a)| a.saturating_sub(b));
        if once {
            r.method = "measured: cold, each record read at most once".to_string();
        }
        Ok(r)
    }

    /// The check stage runs on mapped pages in RAM: with `--cold` only on the sampled records,
    /// after an untimed pass that brings them in (a cold page fault is the read stage's cost).
    /// A bad record is noted and left out.
    fn check(&self, ds: &Dataset, threads: usize) -> Result<StageRow> {
        let set = if self.cfg.cold {
            let set = &self.order[..self.sample.len().min(self.order.len())];
            for &i in set {
                if let Ok(rec) = ds.record(i) {
                    std::hint::black_box(rec.label);
                }
            }
            set
        } else {
            &self.order[..]
        };
        let (tallies, wall) = parallel(
            Stage::Check,
            threads,
            self.cfg.stage_seconds,
            |t, deadline| {
                let mut tally = Tally::default();
                for k in strided(set.len(), t, threads, false) {
                    match ds.record(set[k]) {
                        Ok(rec) => {
                            std::hint::black_box(rec.label);
                            tally.images += 1;
                            tally.bytes += rec.bytes.len() as u64;
                        }
                        Err(e) => self.bad.met_error(e)?,
                    }
                    if Instant::now() >= deadline {
                        break;
                    }
                }
                Ok(tally)
            },
        )?;
        Ok(row(Stage::Check, threads, &tallies, wall))
    }

    /// Notes that sample image `img` cannot be decoded (the stage then leaves it out).
    fn bad_sample(&self, img: &SampleImage, e: impl std::fmt::Display) -> Result<()> {
        self.bad.met(
            &self.paths[img.file as usize],
            img.record,
            &format!("cannot decode: {e}"),
        )
    }

    fn decode(&self, stage: Stage, threads: usize) -> Result<StageRow> {
        let mode = match stage {
            Stage::DecodeFull => DecodeMode::Full,
            Stage::DecodeScaled => DecodeMode::Scaled,
            _ => DecodeMode::Region,
        };
        let size = self.cfg.image_size;
        let tcfg = self.cfg.transform(Output::U8Nhwc, mode);
        let (tallies, wall) = parallel(stage, threads, self.cfg.stage_seconds, |t, deadline| {
            let mut dec = JpegDecoder::new().map_err(|e| anyhow!("{e}"))?;
            let geometry = Transformer::new(tcfg).map_err(|e| anyhow!("{e}"))?;
            let mut tally = Tally::default();
            for k in strided(self.sample.len(), t, threads, false) {
                let img = &self.sample[k];
                let _s = ddl_trace::span_args(stage.name(), "decode", &[("thread", t as i64)]);
                let decoded = dec.header(&img.bytes).and_then(|h| {
                    let crop = if mode == DecodeMode::Full {
                        [0.0, 0.0, h.width as f64, h.height as f64]
                    } else {
                        geometry.geometry(h.width, h.height, 0, img.id).0
                    };
                    let out = if mode == DecodeMode::Full {
                        (h.width, h.height)
                    } else {
                        (size, size)
                    };
                    let p = plan(&h, crop, out, mode);
                    dec.decode(&img.bytes, &p).map(|px| px.len())
                });
                match decoded {
                    Ok(n) => {
                        std::hint::black_box(n);
                        tally.images += 1;
                        tally.bytes += img.bytes.len() as u64;
                    }
                    Err(e) => self.bad_sample(img, e)?,
                }
                if Instant::now() >= deadline {
                    break;
                }
            }
            Ok(tally)
        })?;
        Ok(row(stage, threads, &tallies, wall))
    }

    /// Crop + resize cannot be run alone through the loader's API (the transformer decodes
    /// too), so each image is decoded (`decode_region`) and then transformed to uint8, back to
    /// back, and the thread CPU time of the second minus the first is the resize's share.
    /// Each thread's wall time is split in that proportion, so the rate keeps the wall-clock
    /// meaning of the measured stages while the subtraction is immune to preemption.
    fn crop_resize(&self, threads: usize) -> Result<StageRow> {
        let size = self.cfg.image_size;
        let n = 3 * size as usize * size as usize;
        let tcfg = self.cfg.transform(Output::U8Nhwc, DecodeMode::Region);
        let (tallies, _) = parallel(
            Stage::CropResize,
            threads,
            self.cfg.stage_seconds,
            |t, deadline| {
                let mut dec = JpegDecoder::new().map_err(|e| anyhow!("{e}"))?;
                let mut tr = Transformer::new(tcfg).map_err(|e| anyhow!("{e}"))?;
                let mut out = vec![0u8; n];
                let (mut decode_cpu, mut apply_cpu) = (0u64, 0u64);
                let mut tally = Tally::default();
                let wall = Instant::now();
                for k in strided(self.sample.len(), t, threads, false) {
                    let img = &self.sample[k];
                    let _s = ddl_trace::span("crop_resize", "prof");
                    let c0 = thread_cpu_ns();
                    let decoded = dec.header(&img.bytes).and_then(|h| {
                        let crop = tr.geometry(h.width, h.height, 0, img.id).0;
                        let p = plan(&h, crop, (size, size), DecodeMode::Region);
                        dec.decode(&img.bytes, &p).map(|px| px.len())
                    });
                    let c1 = thread_cpu_ns();
                    let applied = decoded.and_then(|len| {
                        std::hint::black_box(len);
                        tr.apply(&img.bytes, 0, img.id, Slot::U8(&mut out))
                    });
                    let c2 = thread_cpu_ns();
                    match applied {
                        Ok(_) => {
                            decode_cpu += c1.saturating_sub(c0);
                            apply_cpu += c2.saturating_sub(c1);
                            tally.images += 1;
                            tally.bytes += n as u64;
                        }
                        Err(e) => self.bad_sample(img, e)?,
                    }
                    if Instant::now() >= deadline {
                        break;
                    }
                }
                let wall_ns = wall.elapsed().as_nanos() as f64;
                let total = (decode_cpu + apply_cpu).max(1) as f64;
                // Never below 1% of the transform: measurement noise must not give absurd rates.
                let resize = apply_cpu.saturating_sub(decode_cpu).max(apply_cpu / 100) as f64;
                tally.attributed_ns = ((wall_ns * resize / total) as u64).max(1);
                Ok(tally)
            },
        )?;
        Ok(derived_row(
            Stage::CropResize,
            threads,
            &tallies,
            "derived: thread CPU time of transform-to-uint8 minus decode_region on the same \
             images, as a share of each thread's wall time",
        ))
    }

    fn normalize(&self, threads: usize) -> Result<StageRow> {
        let s = self.cfg.image_size as usize;
        let n = 3 * s * s;
        let batch = self.cfg.batch;
        let norm = Normalizer::new(IMAGENET_MEAN, IMAGENET_STD);
        let (tallies, wall) = parallel(
            Stage::Normalize,
            threads,
            self.cfg.stage_seconds,
            |t, deadline| {
                let mut buf = vec![0f32; batch * n];
                let mut tally = Tally::default();
                let mut k = t;
                loop {
                    let src = &self.resized[k % self.resized.len()];
                    let slot = (tally.images as usize) % batch;
                    norm.write_chw(src, s, s, k % 2 == 1, &mut buf[slot * n..(slot + 1) * n]);
                    tally.images += 1;
                    tally.bytes += (n * 4) as u64;
                    k += threads;
                    if Instant::now() >= deadline {
                        break;
                    }
                }
                std::hint::black_box(&buf);
                Ok(tally)
            },
        )?;
        Ok(row(Stage::Normalize, threads, &tallies, wall))
    }

    fn queue(&self, threads: usize) -> Result<StageRow> {
        let s = self.cfg.image_size as usize;
        let batch = self.cfg.batch;
        let elems = batch * 3 * s * s;
        let depth = self.cfg.prefetch.max(1);
        let (full_tx, full_rx) = mpsc::sync_channel::<Vec<f32>>(depth);
        let (free_tx, free_rx) = mpsc::channel::<Vec<f32>>();
        for _ in 0..depth + threads {
            // Zeroed allocations stay untouched (and unbacked) except for one element.
            free_tx
                .send(vec![0f32; elems])
                .map_err(|_| anyhow!("queue free list"))?;
        }
        let free_rx = std::sync::Mutex::new(free_rx);
        let start = Instant::now();
        let deadline = start + Duration::from_secs_f64(self.cfg.stage_seconds);
        let received = AtomicU64::new(0);
        std::thread::scope(|sc| -> Result<()> {
            for t in 0..threads {
                let (full_tx, free_rx) = (full_tx.clone(), &free_rx);
                sc.spawn(move || {
                    ddl_trace::set_thread_name(format!("queue {t}/{threads}"));
                    let mut k = 0u64;
                    while Instant::now() < deadline {
                        let Ok(mut buf) = free_rx.lock().unwrap_or_else(|p| p.into_inner()).recv()
                        else {
                            return;
                        };
                        buf[0] = (t as u64 + k) as f32;
                        k += 1;
                        if full_tx.send(buf).is_err() {
                            return;
                        }
                    }
                });
            }
            drop(full_tx);
            for buf in full_rx.iter() {
                std::hint::black_box(buf[0]);
                received.fetch_add(1, Ordering::Relaxed);
                // Producers may already be gone: then the buffer is simply freed.
                let _ = free_tx.send(buf);
            }
            Ok(())
        })?;
        let wall = start.elapsed().as_secs_f64().max(1e-9);
        let batches = received.load(Ordering::Relaxed);
        let images = batches * batch as u64;
        Ok(StageRow {
            stage: Stage::Queue,
            threads,
            images,
            seconds: wall,
            images_per_s: images as f64 / wall,
            bytes_per_s: (images * 3 * s as u64 * s as u64 * 4) as f64 / wall,
            bytes_basis: Stage::Queue.bytes_basis().to_string(),
            method: format!(
                "measured: batch messages of {batch} images, depth {depth}, {threads} producers"
            ),
            storage_bytes: None,
        })
    }
}

/// Runs the real pipeline with `threads` workers for `seconds` (epochs restarted as needed);
/// the bad records it meets go to `bad`.
fn end_to_end(
    ds: &Arc<Dataset>,
    cfg: &ProfConfig,
    threads: usize,
    bad: &BadLog,
) -> Result<EndToEndRow> {
    let scfg = SamplerConfig {
        seed: cfg.seed,
        ranks_in_node: 1,
        rank_in_node: 0,
        replicas: 1,
        batch_per_replica: cfg.batch,
        tail: Tail::Drop,
        shuffle: true,
    };
    let sampler = Sampler::try_new(ds.len(), ds.len(), scfg)?;
    if sampler.steps_per_epoch() == 0 {
        bail!(
            "node {} has {} records, fewer than one batch of {}",
            cfg.residency.node,
            ds.len(),
            cfg.batch
        );
    }
    let pcfg = PipelineConfig {
        image_size: cfg.image_size,
        output: Output::F32Nchw,
        augment: cfg.augment(),
        workers: threads,
        prefetch: cfg.prefetch,
        seed: cfg.seed,
        on_bad_record: cfg.on_bad_record,
        ..PipelineConfig::default()
    };
    let _run = ddl_trace::span_args("end_to_end", "prof", &[("threads", threads as i64)]);
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(cfg.seconds);
    let (mut images, mut batches, mut busy, mut skipped) = (0u64, 0u64, 0.0f64, 0u64);
    let mut epoch = 0u64;
    'run: loop {
        let p = Pipeline::start(Arc::clone(ds), sampler.clone(), pcfg.clone(), epoch, 0)?;
        let mut it = p.replica(0);
        let mut done = false;
        loop {
            let next = {
                let _w = ddl_trace::span("wait_batch", "prof");
                it.next()
            };
            let Some(b) = next else { break };
            let b = b.with_context(|| {
                format!(
                    "end to end with {threads} threads (--on-bad-record fail); `ddl-pack \
                     --verify {}` lists every damaged record, --on-bad-record replace profiles \
                     around them",
                    cfg.dir.display()
                )
            })?;
            images += b.len() as u64;
            batches += 1;
            drop(b);
            if Instant::now() >= deadline {
                done = true;
                break;
            }
        }
        let stats = p.stats();
        busy += stats.busy_seconds;
        skipped += stats.skipped;
        for r in &stats.bad_records {
            let prefix = format!("{}: record {}: ", r.file.display(), r.record);
            bad.met(
                &r.file,
                r.record,
                r.reason.strip_prefix(&prefix).unwrap_or(&r.reason),
            )?;
        }
        if done {
            break 'run;
        }
        epoch += 1;
    }
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    Ok(EndToEndRow {
        threads,
        images,
        batches,
        seconds: secs,
        images_per_s: images as f64 / secs,
        speedup: 1.0,
        efficiency: 1.0,
        worker_busy_frac: (busy / (secs * threads as f64)).min(1.0),
        skipped,
    })
}

/// Computes the verdict from the rows at the largest thread count.
pub fn verdict(stages: &[StageRow], e2e: &[EndToEndRow], gpu_rate: f64) -> Result<Verdict> {
    let last = e2e
        .iter()
        .max_by_key(|r| r.threads)
        .context("no end-to-end measurement")?;
    let t = last.threads;
    let mut time_share = BTreeMap::new();
    let mut inv_sum = 0.0;
    let mut worst: Option<(Stage, f64)> = None;
    for stage in Stage::PIPELINE {
        let Some(r) = stages.iter().find(|r| r.stage == stage && r.threads == t) else {
            continue;
        };
        let rate = r.images_per_s.max(1e-9);
        inv_sum += 1.0 / rate;
        time_share.insert(stage, 1.0 / rate);
        if worst.is_none_or(|(_, w)| rate < w) {
            worst = Some((stage, rate));
        }
    }
    let (bottleneck, bottleneck_rate) = worst.context("no pipeline stage measured")?;
    for v in time_share.values_mut() {
        *v /= inv_sum;
    }
    let node = last.images_per_s;
    let exact = if gpu_rate > 0.0 { node / gpu_rate } else { 0.0 };
    let gpus = exact.floor() as u64;
    let line = format!(
        "verdict: this node sustains {} images/s end to end with {t} threads; bottleneck: {} \
         ({} images/s alone, {:.0}% of per-image time); feeds {gpus} GPU{} at {} images/s each \
         ({exact:.2})",
        fmt_rate(node),
        bottleneck,
        fmt_rate(bottleneck_rate),
        100.0 * time_share.get(&bottleneck).copied().unwrap_or(0.0),
        if gpus == 1 { "" } else { "s" },
        fmt_rate(gpu_rate),
    );
    Ok(Verdict {
        threads: t,
        node_images_per_s: node,
        bottleneck,
        bottleneck_images_per_s: bottleneck_rate,
        predicted_images_per_s: 1.0 / inv_sum.max(1e-12),
        time_share,
        gpu_rate_images_per_s: gpu_rate,
        gpus_fed: gpus,
        gpus_fed_exact: exact,
        line,
    })
}

/// Profiles node `cfg.residency.node`'s shards of `cfg.split`; `progress` receives one line
/// per finished measurement.
pub fn profile(cfg: &ProfConfig, mut progress: impl FnMut(&str)) -> Result<Report> {
    cfg.validate()?;
    let bad = BadLog::new(cfg);
    let mut threads = cfg.threads.clone();
    threads.sort_unstable();
    threads.dedup();

    let mut ds = Some(open_dataset(cfg, !cfg.cold)?);
    let d = ds.as_ref().expect("just opened");
    let n = d.len();
    let paths: Vec<PathBuf> = d.shard_paths().iter().map(|p| p.to_path_buf()).collect();
    let mut items = Vec::with_capacity(n);
    let (mut bytes, mut w, mut h) = (0u64, 0f64, 0f64);
    {
        let mut file_of = BTreeMap::new();
        for (k, p) in paths.iter().enumerate() {
            file_of.insert(p.clone(), k as u32);
        }
        for i in 0..n {
            let (reader, r) = d.locate(i);
            let row = reader.row(r);
            items.push(ReadItem {
                file: file_of[reader.path()],
                offset: reader.header().data_offset + row.offset,
                len: row.length,
            });
            bytes += row.length as u64;
            w += row.width as f64;
            h += row.height as f64;
        }
    }
    let dataset = DatasetInfo {
        dir: cfg.dir.clone(),
        split: cfg.split.clone(),
        node: cfg.residency.node,
        nodes: cfg.residency.nodes,
        shards: paths.len(),
        records: n as u64,
        file_bytes: d.file_bytes(),
        mean_record_bytes: bytes as f64 / n.max(1) as f64,
        mean_width: w / n.max(1) as f64,
        mean_height: h / n.max(1) as f64,
    };
    if n < cfg.batch {
        bail!(
            "node {} has {n} records of split {}, fewer than one batch of {}",
            cfg.residency.node,
            cfg.split,
            cfg.batch
        );
    }
    let order = permutation(n, cfg.seed);
    let sample_n = cfg.sample_records.clamp(1, n.max(1)).min(n);
    let file_index: BTreeMap<&Path, u32> = paths
        .iter()
        .enumerate()
        .map(|(k, p)| (p.as_path(), k as u32))
        .collect();
    let mut sample = Vec::with_capacity(sample_n);
    for &i in order.iter().take(sample_n) {
        let (reader, r) = d.locate(i);
        match d.record(i) {
            Ok(rec) => sample.push(SampleImage {
                bytes: rec.bytes.to_vec(),
                id: d.global_id(i),
                file: file_index[reader.path()],
                record: r,
            }),
            Err(e) => bad.met_error(e)?,
        }
    }
    let size = cfg.image_size as usize;
    let mut tr = Transformer::new(cfg.transform(Output::U8Nhwc, DecodeMode::Region))
        .map_err(|e| anyhow!("{e}"))?;
    let mut resized = Vec::new();
    for img in &sample {
        if resized.len() == 8 {
            break;
        }
        let mut out = vec![0u8; 3 * size * size];
        match tr.apply(&img.bytes, 0, img.id, Slot::U8(&mut out)) {
            Ok(_) => resized.push(out),
            Err(e) => bad.met(
                &paths[img.file as usize],
                img.record,
                &format!("cannot decode: {e}"),
            )?,
        }
    }
    if resized.is_empty() {
        bail!(
            "node {}: none of the {} sampled records of split {} is a good image ({} bad); \
             `ddl-pack --verify {}` lists the damaged ones",
            cfg.residency.node,
            sample_n,
            cfg.split,
            bad.report().count,
            cfg.dir.display()
        );
    }
    let prof = Prof {
        cfg,
        paths: paths.clone(),
        items,
        order,
        sample,
        resized,
        bad: &bad,
    };

    let mut cold = None;
    let mut stages = Vec::new();
    let mut e2e = Vec::new();
    for &t in &threads {
        // Read first: with --cold, unmap and drop the shards right before it.
        if cfg.cold {
            ds = None;
            let before = if cold.is_none() {
                Some(resident_bytes(&paths)?)
            } else {
                None
            };
            drop_page_cache(&paths)?;
            if let Some(before) = before {
                cold = Some(ColdInfo {
                    files: paths.len(),
                    file_bytes: dataset.file_bytes,
                    resident_bytes_before: before,
                    resident_bytes_after: resident_bytes(&paths)?,
                });
            }
        }
        let mut measured = Vec::new();
        {
            let _g = ddl_trace::span_args("stage read", "prof", &[("threads", t as i64)]);
            measured.push(prof.read(t)?);
        }
        let d = match &ds {
            Some(d) => Arc::clone(d),
            None => open_dataset(cfg, false)?,
        };
        {
            let _g = ddl_trace::span_args("stage check", "prof", &[("threads", t as i64)]);
            measured.push(prof.check(&d, t)?);
        }
        for stage in [Stage::DecodeFull, Stage::DecodeScaled, Stage::DecodeRegion] {
            let _g =
                ddl_trace::span_args(format!("stage {stage}"), "prof", &[("threads", t as i64)]);
            measured.push(prof.decode(stage, t)?);
        }
        {
            let _g = ddl_trace::span_args("stage crop_resize", "prof", &[("threads", t as i64)]);
            measured.push(prof.crop_resize(t)?);
        }
        {
            let _g = ddl_trace::span_args("stage normalize", "prof", &[("threads", t as i64)]);
            measured.push(prof.normalize(t)?);
        }
        {
            let _g = ddl_trace::span_args("stage queue", "prof", &[("threads", t as i64)]);
            measured.push(prof.queue(t)?);
        }
        for r in &measured {
            progress(&format!(
                "{:<14} threads {t:>3}: {:>12} images/s  {:>12}",
                r.stage.name(),
                fmt_rate(r.images_per_s),
                if r.stage == Stage::Queue {
                    "(by reference)".to_string()
                } else {
                    format!("{}/s", fmt_bytes(r.bytes_per_s))
                }
            ));
        }
        stages.extend(measured);
        let d = if cfg.cold {
            drop(d);
            ds = None;
            drop_page_cache(&paths)?;
            open_dataset(cfg, false)?
        } else {
            d
        };
        let r = end_to_end(&d, cfg, t, &bad)?;
        progress(&format!(
            "{:<14} threads {t:>3}: {:>12} images/s  (workers busy {:.0}%)",
            "end_to_end",
            fmt_rate(r.images_per_s),
            100.0 * r.worker_busy_frac
        ));
        e2e.push(r);
        if !cfg.cold {
            ds = Some(d);
        }
    }
    let base = e2e[0].images_per_s.max(1e-9);
    let base_t = e2e[0].threads as f64;
    for r in &mut e2e {
        r.speedup = r.images_per_s / base;
        r.efficiency = r.speedup / (r.threads as f64 / base_t);
    }
    let verdict = verdict(&stages, &e2e, cfg.gpu_rate)?;
    Ok(Report {
        schema_version: SCHEMA_VERSION,
        units: units(),
        dataset,
        config: ConfigInfo {
            threads,
            batch: cfg.batch,
            image_size: cfg.image_size,
            augment: if cfg.eval { "eval" } else { "train" }.to_string(),
            output: "f32_nchw".to_string(),
            decode_mode: "region".to_string(),
            seconds: cfg.seconds,
            stage_seconds: cfg.stage_seconds,
            prefetch: cfg.prefetch,
            seed: cfg.seed,
            gpu_rate_images_per_s: cfg.gpu_rate,
            cold: cfg.cold,
            sample_records: sample_n,
            on_bad_record: match cfg.on_bad_record {
                OnBadRecord::Fail => "fail",
                OnBadRecord::Skip => "skip",
                OnBadRecord::Replace => "replace",
            }
            .to_string(),
        },
        cold,
        stages,
        end_to_end: e2e,
        bad_records: bad.report(),
        verdict,
    })
}

// ---------------------------------------------------------------------------------------------
// Text output

/// `12,345` style integer rate.
pub fn fmt_rate(x: f64) -> String {
    let v = x.round().max(0.0) as u64;
    let s = v.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes with a binary unit (`12.3 MiB`).
pub fn fmt_bytes(x: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = x;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", units[u])
}

/// The report as a table (images/s per stage and thread count, bytes/s of the read stages,
/// the end-to-end scaling curve) followed by the verdict line.
pub fn render_table(r: &Report) -> String {
    let threads = &r.config.threads;
    let mut s = String::new();
    s.push_str(&format!(
        "ddl-prof: {} split {} node {}/{}: {} records in {} shards, {}, mean {:.0} x {:.0} px, {} per record{}\n",
        r.dataset.dir.display(),
        r.dataset.split,
        r.dataset.node,
        r.dataset.nodes,
        r.dataset.records,
        r.dataset.shards,
        fmt_bytes(r.dataset.file_bytes as f64),
        r.dataset.mean_width,
        r.dataset.mean_height,
        fmt_bytes(r.dataset.mean_record_bytes),
        if r.config.cold { ", cold reads" } else { "" }
    ));
    if let Some(c) = &r.cold {
        s.push_str(&format!(
            "page cache: {} of {} resident before the drop, {} after\n",
            fmt_bytes(c.resident_bytes_before as f64),
            fmt_bytes(c.file_bytes as f64),
            fmt_bytes(c.resident_bytes_after as f64)
        ));
    }
    s.push_str(&format!("{:<16}", "images/s"));
    for t in threads {
        s.push_str(&format!("{:>14}", format!("{t} thr")));
    }
    s.push_str(&format!("{:>16}\n", "bytes/s (max)"));
    for stage in Stage::ALL {
        s.push_str(&format!("{:<16}", stage.name()));
        let mut last_bytes = 0.0;
        for &t in threads {
            match r.stages.iter().find(|x| x.stage == stage && x.threads == t) {
                Some(x) => {
                    s.push_str(&format!("{:>14}", fmt_rate(x.images_per_s)));
                    last_bytes = x.bytes_per_s;
                }
                None => s.push_str(&format!("{:>14}", "-")),
            }
        }
        let bytes = if stage == Stage::Queue {
            "(by reference)".to_string()
        } else {
            format!("{}/s", fmt_bytes(last_bytes))
        };
        s.push_str(&format!("{bytes:>16}\n"));
    }
    s.push_str(&format!("{:<16}", "end_to_end"));
    for &t in threads {
        match r.end_to_end.iter().find(|x| x.threads == t) {
            Some(x) => s.push_str(&format!("{:>14}", fmt_rate(x.images_per_s))),
            None => s.push_str(&format!("{:>14}", "-")),
        }
    }
    s.push('\n');
    s.push_str(&format!("{:<16}", "  speedup"));
    for x in &r.end_to_end {
        s.push_str(&format!(
            "{:>14}",
            format!("{:.2}x ({:.0}%)", x.speedup, 100.0 * x.efficiency)
        ));
    }
    s.push('\n');
    s.push_str(&format!(
        "predicted from stages (1/sum of 1/rate): {} images/s\n",
        fmt_rate(r.verdict.predicted_images_per_s)
    ));
    s.push_str(&render_bad_records(r));
    s.push_str(&r.verdict.line);
    s.push('\n');
    s
}

/// The bad records of a report: a count line and one line for each named record (empty when
/// there were none).
pub fn render_bad_records(r: &Report) -> String {
    let b = &r.bad_records;
    if b.count == 0 {
        return String::new();
    }
    let mut s = format!(
        "bad records: {} met (left out of the stages; end to end: {}); `ddl-pack --verify {}` \
         lists every damaged record\n",
        b.count,
        match r.config.on_bad_record.as_str() {
            "skip" => "skipped",
            _ => "replaced by the next good record",
        },
        r.dataset.dir.display()
    );
    for x in &b.first {
        s.push_str(&format!(
            "  {} record {}: {}\n",
            x.file.display(),
            x.record,
            x.reason
        ));
    }
    if b.count as usize > b.first.len() {
        s.push_str(&format!(
            "  ... and {} more\n",
            b.count as usize - b.first.len()
        ));
    }
    s
}

/// Per-node summary of several nodes' reports (one per MPI rank), naming the slowest node.
pub fn render_nodes(reports: &[Report]) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "{:<6}{:>10}{:>12}{:>16}{:>16}{:>10}\n",
        "node", "records", "threads", "images/s", "bottleneck", "GPUs"
    ));
    for r in reports {
        s.push_str(&format!(
            "{:<6}{:>10}{:>12}{:>16}{:>16}{:>10}\n",
            r.dataset.node,
            r.dataset.records,
            r.verdict.threads,
            fmt_rate(r.verdict.node_images_per_s),
            r.verdict.bottleneck.name(),
            r.verdict.gpus_fed
        ));
    }
    if let Some(slow) = reports.iter().min_by(|a, b| {
        a.verdict
            .node_images_per_s
            .total_cmp(&b.verdict.node_images_per_s)
    }) {
        s.push_str(&format!(
            "slowest node: {} at {} images/s (bottleneck {}); every node feeds at least {} GPU(s) at {} images/s\n",
            slow.dataset.node,
            fmt_rate(slow.verdict.node_images_per_s),
            slow.verdict.bottleneck.name(),
            slow.verdict.gpus_fed,
            fmt_rate(slow.verdict.gpu_rate_images_per_s)
        ));
    }
    s
}

// ---------------------------------------------------------------------------------------------
// Plots

/// Turns plotters' backend-specific errors into anyhow errors.
trait PlotResult<T> {
    fn plot(self) -> Result<T>;
}

impl<T, E: std::fmt::Debug> PlotResult<T> for std::result::Result<T, E> {
    fn plot(self) -> Result<T> {
        self.map_err(|e| anyhow!("plotting: {e:?}"))
    }
}

/// Checks that `path` names a plot format [`plot_scaling`] and [`plot_metrics`] can write
/// (`.svg` or `.png`).
pub fn check_plot_path(path: &Path) -> Result<()> {
    backend_of(path).map(|_| ())
}

/// Which plotters backend a file name asks for.
fn backend_of(path: &Path) -> Result<&'static str> {
    match path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("svg") => Ok("svg"),
        Some("png") => Ok("png"),
        _ => bail!("{}: plot files must end in .svg or .png", path.display()),
    }
}

/// Draws into an RGB buffer and writes it to `path` as a PNG. The encoding is done by the
/// `image` crate ddl already uses: plotters' own encoder would compile a second, older `image`.
fn write_png(
    path: &Path,
    (width, height): (u32, u32),
    draw: impl FnOnce(DrawingArea<BitMapBackend, Shift>) -> Result<()>,
) -> Result<()> {
    let mut rgb = vec![0u8; width as usize * height as usize * 3];
    draw(BitMapBackend::with_buffer(&mut rgb, (width, height)).into_drawing_area())?;
    image::save_buffer(path, &rgb, width, height, image::ExtendedColorType::Rgb8)?;
    Ok(())
}

/// Draws images/s against threads for every stage and end to end (log-log) to `path`
/// (`.svg` or `.png`).
pub fn plot_scaling(r: &Report, path: &Path) -> Result<()> {
    let size = (1000, 650);
    match backend_of(path)? {
        "svg" => draw_scaling(SVGBackend::new(path, size).into_drawing_area(), r),
        _ => write_png(path, size, |area| draw_scaling(area, r)),
    }
    .with_context(|| format!("draw {}", path.display()))
}

fn draw_scaling<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, r: &Report) -> Result<()> {
    root.fill(&WHITE).plot()?;
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Stage::ALL
        .iter()
        .map(|&st| {
            let pts = r
                .stages
                .iter()
                .filter(|x| x.stage == st)
                .map(|x| (x.threads as f64, x.images_per_s.max(1e-3)))
                .collect();
            (st.name().to_string(), pts)
        })
        .collect();
    series.push((
        "end_to_end".to_string(),
        r.end_to_end
            .iter()
            .map(|x| (x.threads as f64, x.images_per_s.max(1e-3)))
            .collect(),
    ));
    let all: Vec<(f64, f64)> = series.iter().flat_map(|(_, p)| p.iter().copied()).collect();
    let xmax = all.iter().map(|p| p.0).fold(1.0, f64::max);
    let ymin = all.iter().map(|p| p.1).fold(f64::MAX, f64::min).min(1e9);
    let ymax = all.iter().map(|p| p.1).fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "ddl-prof: {} node {}/{}, images/s per stage vs threads",
                r.dataset.split, r.dataset.node, r.dataset.nodes
            ),
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d(
            (0.8f64..xmax * 1.25).log_scale(),
            (ymin / 2.0..ymax * 2.0).log_scale(),
        )
        .plot()?;
    chart
        .configure_mesh()
        .x_desc("threads")
        .y_desc("images/s")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| fmt_rate(*y))
        .draw()
        .plot()?;
    for (i, (name, pts)) in series.into_iter().enumerate() {
        if pts.is_empty() {
            continue;
        }
        let e2e = name == "end_to_end";
        let color: RGBAColor = if e2e {
            BLACK.to_rgba()
        } else {
            Palette99::pick(i).to_rgba()
        };
        let style = color.stroke_width(if e2e { 4 } else { 2 });
        chart
            .draw_series(LineSeries::new(pts.clone(), style))
            .plot()?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        chart
            .draw_series(pts.into_iter().map(|p| Circle::new(p, 4, color.filled())))
            .plot()?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .plot()?;
    root.present().plot()?;
    Ok(())
}

/// The series of a training metrics file (ddl-train's `--metrics` JSON lines).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metrics {
    /// (step, loss) of every step line.
    pub loss: Vec<(f64, f64)>,
    /// (step, images/s) of every step line.
    pub images_per_s: Vec<(f64, f64)>,
    /// (step, % of step time waiting on data = data_wait_s / (data_wait_s + compute_s +
    /// allreduce_s)).
    pub data_wait_pct: Vec<(f64, f64)>,
    /// (epoch, train_loss) of every epoch line.
    pub epoch_loss: Vec<(f64, f64)>,
    /// (epoch, val top-1 in %) of epoch lines that have it.
    pub val_top1_pct: Vec<(f64, f64)>,
    /// (epoch, val top-5 in %) of epoch lines that have it.
    pub val_top5_pct: Vec<(f64, f64)>,
    /// (epoch, data_wait_frac in %) of epoch lines.
    pub epoch_data_wait_pct: Vec<(f64, f64)>,
}

/// Parses a metrics JSON-lines text: `{"type":"step",...}` lines (step, loss, images_per_s,
/// data_wait_s, compute_s, allreduce_s) and `{"type":"epoch",...}` lines (epoch, train_loss,
/// val_top1, val_top5, data_wait_frac). Blank lines and other types are ignored; a line that
/// is not JSON is an error naming its number.
pub fn parse_metrics(text: &str) -> Result<Metrics> {
    let mut m = Metrics::default();
    for (k, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("metrics line {}: not JSON", k + 1))?;
        let num = |key: &str| v.get(key).and_then(serde_json::Value::as_f64);
        match v.get("type").and_then(serde_json::Value::as_str) {
            Some("step") => {
                let Some(step) = num("step") else { continue };
                if let Some(l) = num("loss") {
                    m.loss.push((step, l));
                }
                if let Some(r) = num("images_per_s") {
                    m.images_per_s.push((step, r));
                }
                if let Some(w) = num("data_wait_s") {
                    let total =
                        w + num("compute_s").unwrap_or(0.0) + num("allreduce_s").unwrap_or(0.0);
                    if total > 0.0 {
                        m.data_wait_pct.push((step, 100.0 * w / total));
                    }
                }
            }
            Some("epoch") => {
                let Some(e) = num("epoch") else { continue };
                if let Some(l) = num("train_loss") {
                    m.epoch_loss.push((e, l));
                }
                if let Some(a) = num("val_top1") {
                    m.val_top1_pct.push((e, 100.0 * a));
                }
                if let Some(a) = num("val_top5") {
                    m.val_top5_pct.push((e, 100.0 * a));
                }
                if let Some(f) = num("data_wait_frac") {
                    m.epoch_data_wait_pct.push((e, 100.0 * f));
                }
            }
            _ => {}
        }
    }
    Ok(m)
}

/// Draws training curves (loss, val top-1/top-5, images/s, data-wait %) from the metrics
/// file `metrics` into `out` (`.svg` or `.png`); returns the parsed series.
pub fn plot_metrics(metrics: &Path, out: &Path) -> Result<Metrics> {
    let text =
        std::fs::read_to_string(metrics).with_context(|| format!("read {}", metrics.display()))?;
    let m = parse_metrics(&text).with_context(|| metrics.display().to_string())?;
    if m.loss.is_empty() && m.epoch_loss.is_empty() {
        bail!("{}: no step or epoch lines with a loss", metrics.display());
    }
    let size = (1200, 800);
    match backend_of(out)? {
        "svg" => draw_metrics(SVGBackend::new(out, size).into_drawing_area(), &m),
        _ => write_png(out, size, |area| draw_metrics(area, &m)),
    }
    .with_context(|| format!("draw {}", out.display()))?;
    Ok(m)
}

/// One panel: several named series against a shared x axis.
fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[(&str, &[(f64, f64)])],
) -> Result<()> {
    let pts: Vec<(f64, f64)> = series.iter().flat_map(|(_, s)| s.iter().copied()).collect();
    if pts.is_empty() {
        area.titled(&format!("{title}: no data"), ("sans-serif", 18))
            .plot()?;
        return Ok(());
    }
    let (mut x0, mut x1) = pts
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (mut y0, mut y1) = pts
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
    if x1 <= x0 {
        x0 -= 0.5;
        x1 += 0.5;
    }
    let pad = ((y1 - y0) * 0.08).max(1e-6);
    y0 -= pad;
    y1 += pad;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, y0..y1)
        .plot()?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()
        .plot()?;
    for (i, (name, s)) in series.iter().enumerate() {
        if s.is_empty() {
            continue;
        }
        let color: RGBAColor = Palette99::pick(i).to_rgba();
        let style = color.stroke_width(2);
        chart
            .draw_series(LineSeries::new(s.iter().copied(), style))
            .plot()?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        if s.len() <= 64 {
            chart
                .draw_series(s.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .plot()?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .plot()?;
    Ok(())
}

fn draw_metrics<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, m: &Metrics) -> Result<()> {
    root.fill(&WHITE).plot()?;
    let areas = root.split_evenly((2, 2));
    if m.loss.is_empty() {
        panel(
            &areas[0],
            "training loss",
            "epoch",
            "loss",
            &[("train_loss", &m.epoch_loss)],
        )?;
    } else {
        panel(
            &areas[0],
            "training loss",
            "step",
            "loss",
            &[("loss", &m.loss)],
        )?;
    }
    panel(
        &areas[1],
        "validation accuracy",
        "epoch",
        "%",
        &[
            ("val top-1", &m.val_top1_pct),
            ("val top-5", &m.val_top5_pct),
        ],
    )?;
    panel(
        &areas[2],
        "throughput",
        "step",
        "images/s",
        &[("images/s", &m.images_per_s)],
    )?;
    if m.data_wait_pct.is_empty() {
        panel(
            &areas[3],
            "data wait",
            "epoch",
            "% of step time",
            &[("data wait", &m.epoch_data_wait_pct)],
        )?;
    } else {
        panel(
            &areas[3],
            "data wait",
            "step",
            "% of step time",
            &[("data wait", &m.data_wait_pct)],
        )?;
    }
    root.present().plot()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn srow(stage: Stage, threads: usize, rate: f64) -> StageRow {
        StageRow {
            stage,
            threads,
            images: 100,
            seconds: 1.0,
            images_per_s: rate,
            bytes_per_s: rate * 1000.0,
            bytes_basis: stage.bytes_basis().to_string(),
            method: "measured".to_string(),
            storage_bytes: None,
        }
    }

    fn erow(threads: usize, rate: f64) -> EndToEndRow {
        EndToEndRow {
            threads,
            images: 1000,
            batches: 10,
            seconds: 1.0,
            images_per_s: rate,
            speedup: 1.0,
            efficiency: 1.0,
            worker_busy_frac: 0.9,
            skipped: 0,
        }
    }

    #[test]
    fn verdict_picks_slowest_pipeline_stage_at_max_threads() {
        let mut stages = Vec::new();
        for (t, k) in [(1, 1.0), (4, 3.5)] {
            stages.push(srow(Stage::Read, t, 50_000.0 * k));
            stages.push(srow(Stage::Check, t, 80_000.0 * k));
            // decode_full is slower but not part of the pipeline.
            stages.push(srow(Stage::DecodeFull, t, 500.0 * k));
            stages.push(srow(Stage::DecodeRegion, t, 1_000.0 * k));
            stages.push(srow(Stage::CropResize, t, 4_000.0 * k));
            stages.push(srow(Stage::Normalize, t, 9_000.0 * k));
            stages.push(srow(Stage::Queue, t, 1e6 * k));
        }
        let v = verdict(&stages, &[erow(1, 700.0), erow(4, 2_600.0)], 1200.0).unwrap();
        assert_eq!(v.threads, 4);
        assert_eq!(v.bottleneck, Stage::DecodeRegion);
        assert_eq!(v.bottleneck_images_per_s, 3_500.0);
        assert_eq!(v.gpus_fed, 2);
        assert!((v.gpus_fed_exact - 2600.0 / 1200.0).abs() < 1e-12);
        let share: f64 = v.time_share.values().sum();
        assert!((share - 1.0).abs() < 1e-9);
        assert!(v.predicted_images_per_s < 3_500.0);
        assert!(
            v.line.contains("decode_region") && v.line.contains("2,600"),
            "{}",
            v.line
        );
        // A slow read becomes the bottleneck.
        stages.push(srow(Stage::Read, 4, 0.0));
        stages.retain(|r| !(r.stage == Stage::Read && r.threads == 4 && r.images_per_s > 0.0));
        let v = verdict(&stages, &[erow(4, 100.0)], 1200.0).unwrap();
        assert_eq!(v.bottleneck, Stage::Read);
        assert_eq!(v.gpus_fed, 0);
    }

    #[test]
    fn strided_covers_and_wraps() {
        let a: Vec<usize> = strided(5, 1, 2, true).collect();
        assert_eq!(a, vec![1, 3]);
        let b: Vec<usize> = strided(5, 0, 2, false).take(5).collect();
        assert_eq!(b, vec![0, 2, 4, 1, 3]);
        assert_eq!(strided(0, 0, 2, false).count(), 0);
        let mut p = permutation(100, 7);
        assert_ne!(p, (0..100).collect::<Vec<_>>());
        p.sort_unstable();
        assert_eq!(p, (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn formats() {
        assert_eq!(fmt_rate(1234567.4), "1,234,567");
        assert_eq!(fmt_rate(999.0), "999");
        assert_eq!(fmt_bytes(1536.0), "1.5 KiB");
        assert!(default_threads().starts_with(&[1]));
    }

    #[test]
    fn metrics_parse() {
        let text = r#"{"type":"step","step":1,"epoch":0,"loss":2.5,"lr":0.1,"images_per_s":100.0,"data_wait_s":0.1,"compute_s":0.3,"allreduce_s":0.1}

{"type":"epoch","epoch":0,"train_loss":2.4,"val_top1":0.25,"val_top5":null,"epoch_s":3.0,"data_wait_frac":0.2}
{"type":"other"}"#;
        let m = parse_metrics(text).unwrap();
        assert_eq!(m.loss, vec![(1.0, 2.5)]);
        assert_eq!(m.data_wait_pct, vec![(1.0, 20.0)]);
        assert_eq!(m.val_top1_pct, vec![(0.0, 25.0)]);
        assert!(m.val_top5_pct.is_empty());
        assert_eq!(m.epoch_data_wait_pct, vec![(0.0, 20.0)]);
        let err = parse_metrics("{\"type\":\"step\"}\nnot json").unwrap_err();
        assert!(format!("{err:#}").contains("line 2"));
    }
}
