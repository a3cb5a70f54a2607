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
//! | `check` | [`Dataset::record`](ddl_loader::dataset::Dataset::record): index row, bounds, crc32c of the mapped bytes | mapped shards in RAM (with `--cold`: the sampled records, brought in untimed first) |
//! | `decode_full` | JPEG header + full-resolution decode to RGB ([`JpegDecoder`](ddl_loader::decode::JpegDecoder), `DecodeMode::Full`) | records copied to RAM first |
//! | `decode_scaled` | header + crop geometry + DCT-scaled decode of the whole image (`DecodeMode::Scaled`) | same |
//! | `decode_region` | header + crop geometry + scaled decode of the crop's region only (`DecodeMode::Region`, what the pipeline runs) | same |
//! | `crop_resize` | crop + antialiased resize to `size`² ([`Transformer::apply`] to uint8 minus the `decode_region` work on the same image, in thread CPU time, timed back to back) | derived |
//! | `normalize` | normalize + collate: [`Normalizer::write_chw`](ddl_loader::transform::Normalizer::write_chw) of one resized image into its slot of a float32 batch buffer | resized images in RAM |
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

mod bad_records;
mod metrics_plot;
mod os;
mod plot;
mod render;
mod report;
mod run;
mod stages;
mod verdict;

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Result};
use ddl_loader::dataset::Residency;
use ddl_loader::decode::DecodeMode;
use ddl_loader::limits::{self, Buffers, LimitError, Setting, Settings};
use ddl_loader::pipeline::OnBadRecord;
use ddl_loader::transform::{
    Augment, Output, TrainAugment, TransformConfig, Transformer, IMAGENET_MEAN, IMAGENET_STD,
};
use serde::{Deserialize, Serialize};

pub use run::profile;

pub use metrics_plot::{parse_metrics, plot_metrics, Metrics};
pub use os::{drop_page_cache, resident_bytes, storage_read_bytes};
pub use plot::{check_plot_path, plot_scaling};
pub use render::{fmt_bytes, fmt_rate, render_bad_records, render_nodes, render_table};
pub use report::{
    BadRecordSeen, BadRecords, ColdInfo, ConfigInfo, DatasetInfo, EndToEndRow, Report, StageRow,
    Verdict, BAD_RECORDS_SHOWN,
};
pub use verdict::verdict;

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

    /// Checks every setting before anything is opened or measured; errors name the flag. The
    /// pipeline's settings and the memory of its batches have the loader's limits, as in
    /// ddl-train: each thread count is a pipeline's workers.
    pub fn validate(&self) -> Result<()> {
        if self.threads.is_empty() {
            bail!("--threads: give at least one thread count");
        }
        for &workers in &self.threads {
            let settings = Settings {
                batch: self.batch,
                image_size: self.image_size,
                workers,
                prefetch: self.prefetch,
                eval_resize: 0,
            };
            let buffers = Buffers {
                replicas: 1,
                ranks_on_node: 1,
                output: Output::F32Nchw,
            };
            limits::check(&settings)
                .and_then(|()| limits::check_memory(&settings, buffers, limits::available_memory()))
                .map_err(|e| anyhow!("{}: {e}", limit_flags(&e)))?;
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
            train: TrainAugment::default(),
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

/// The ddl-prof flags that would lift a refusal of the loader's limits.
fn limit_flags(e: &LimitError) -> String {
    e.named(|s| match s {
        Setting::Batch => "--batch",
        Setting::ImageSize => "--image-size",
        Setting::Workers => "--threads",
        Setting::Prefetch => "--prefetch",
        Setting::EvalResize => "--eval",
    })
}
