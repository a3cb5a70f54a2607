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
//! | `crop_resize` | crop + antialiased resize to `size`² ([`Transformer::apply`](ddl_loader::transform::Transformer::apply) to uint8 minus the `decode_region` work on the same image, in thread CPU time, timed back to back) | derived |
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
mod config;
mod metrics_plot;
mod os;
mod plot;
mod render;
mod report;
mod run;
mod stage;
mod stages;
mod verdict;

pub use config::{default_threads, ProfConfig};
pub use run::profile;
pub use stage::Stage;

pub use metrics_plot::{parse_metrics, plot_metrics, Metrics};
pub use os::{drop_page_cache, resident_bytes, storage_read_bytes};
pub use plot::{check_plot_path, plot_scaling};
pub use render::{fmt_bytes, fmt_rate, render_bad_records, render_nodes, render_table};
pub use report::{
    BadRecordSeen, BadRecords, ColdInfo, ConfigInfo, DatasetInfo, EndToEndRow, Report, StageRow,
    Verdict, BAD_RECORDS_SHOWN, SCHEMA_VERSION,
};
pub use verdict::verdict;
