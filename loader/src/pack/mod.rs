//! The packer: turns an ImageNet-style input (folder trees, flat validation folders, per-synset
//! tars, an outer tar of tars) into shards, `manifest.json` and `pack-report.json`.
//!
//! Every split's inputs are sorted by (label, name); record `i` of that order goes to shard
//! `i % S`. Each shard is therefore a pure function of the input list and the options and is
//! produced on its own: its inputs are converted in order-preserving parallel windows and
//! written in order, so the bytes do not depend on the thread count. Finished shards are
//! recorded in `OUT/.pack-state.json`; a rerun keeps every shard whose plan fingerprint, size
//! and whole-file checksum still match and redoes only the rest, which gives the same output
//! as an uninterrupted run. The same file lists every file the pack writes: the packer removes
//! or replaces nothing else (see `output.rs` and `loader/FORMAT.md`).
//!
//! Memory: the input index (one [`Item`] per input) and per-class counts; converted images are
//! held one window at a time, and per-shard outcomes keep no per-class data.

mod classes;
pub mod convert;
mod output;
pub mod source;
pub mod split;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::{LoaderError, Result};
use crate::format::{INDEX_ROW_LEN, RECORD_ALIGN};
use crate::manifest::{write_atomic, ClassInfo, Manifest, ShardInfo, SplitInfo};
use crate::shard::{tmp_path, ShardReader, ShardWriter};
use convert::{convert, ConvertOptions, How, Skip, SkipReason, MIN_SHORT_SIDE};
use output::{save_state, Claim, DoneShard, Identity, PackState};
use source::{discover, Inputs, Item, SourceOptions};
use split::{ValSplit, ValSplitReport};

/// File name of the pack report inside the output directory.
pub const REPORT_FILE: &str = "pack-report.json";
/// File name of the resume state inside the output directory.
pub const STATE_FILE: &str = ".pack-state.json";

/// The split names the packer writes.
pub const SPLITS: [&str; 2] = ["train", "val"];

/// How many shards each split gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardCount {
    /// Exactly this many shards per split (capped at the split's input count).
    Count(usize),
    /// Shards of about this many bytes. The split's output size is estimated by converting an
    /// evenly spaced sample of up to [`SIZE_SAMPLE`] inputs (deterministic, so a rerun plans
    /// the same count); the count is rounded up to a multiple of the node count so every node
    /// holds the same number of shards.
    Size(u64),
}

/// Everything `ddl-pack` can be told.
#[derive(Clone, Debug)]
pub struct PackOptions {
    /// Input directory.
    pub input: PathBuf,
    /// Output directory (created if missing).
    pub output: PathBuf,
    /// Shard count or size.
    pub shards: ShardCount,
    /// Image conversion settings.
    pub convert: ConvertOptions,
    /// Class list file (restricts and orders classes).
    pub classes: Option<PathBuf>,
    /// ILSVRC synset list for the devkit validation ground truth.
    pub synsets: Option<PathBuf>,
    /// Drop classes with fewer usable inputs than this (0 keeps all).
    pub min_per_class: u64,
    /// Keep a class without usable training inputs (an empty folder, a class only in val) as
    /// a class with no training records; otherwise such a class is an error
    /// ([`LoaderError::EmptyClasses`]), since leaving it out would relabel every class after it.
    pub keep_empty_classes: bool,
    /// Carve a validation split out of an input that has none.
    pub val_split: Option<ValSplit>,
    /// Number of nodes the shards are assigned to in the manifest (shard `s` -> node `s % P`).
    pub nodes: usize,
    /// Worker threads; 0 = one per core.
    pub threads: usize,
    /// Largest accepted fraction of skipped inputs; above it the pack fails after writing the
    /// report.
    pub max_skip_fraction: f64,
    /// Use an output directory that holds another ddl pack: take over its files whose names
    /// this pack writes (see `loader/FORMAT.md`). Files ddl-pack did not write are never
    /// touched.
    pub force: bool,
}

/// The share of skipped inputs above which a pack fails by default: one in 1,000 (ImageNet's
/// few damaged files, not a broken input).
pub const DEFAULT_MAX_SKIP_FRACTION: f64 = 0.001;

impl PackOptions {
    /// Options with the documented defaults: 1 GiB shards, shorter side 256, quality 90,
    /// one node, all cores, 0.001 skip fraction, no `--force`.
    pub fn new(input: impl Into<PathBuf>, output: impl Into<PathBuf>) -> Self {
        PackOptions {
            input: input.into(),
            output: output.into(),
            shards: ShardCount::Size(1 << 30),
            convert: ConvertOptions {
                max_short_side: 256,
                quality: 90,
                reencode: false,
            },
            classes: None,
            synsets: None,
            min_per_class: 0,
            keep_empty_classes: false,
            val_split: None,
            nodes: 1,
            threads: 0,
            max_skip_fraction: DEFAULT_MAX_SKIP_FRACTION,
            force: false,
        }
    }
}

/// Receives progress while packing (the CLI draws a bar or prints lines).
pub trait PackProgress: Sync {
    /// Packing starts: `total` inputs, of which `done` are in shards kept from a previous run.
    fn start(&self, total: u64, done: u64);
    /// `n` more inputs were processed.
    fn advance(&self, n: u64);
    /// Packing finished.
    fn finish(&self);
}

/// A [`PackProgress`] that ignores everything.
pub struct NoProgress;

impl PackProgress for NoProgress {
    fn start(&self, _total: u64, _done: u64) {}
    fn advance(&self, _n: u64) {}
    fn finish(&self) {}
}

/// An input that was not packed, as listed in the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedInput {
    /// Split ("train" or "val").
    pub split: String,
    /// File path, or `ARCHIVE:MEMBER` for a tar member.
    pub path: String,
    /// One of "unreadable", "zero-byte", "truncated", "not an image", "corrupt", "too large".
    pub reason: String,
    /// Details (decoder or I/O message).
    pub detail: String,
}

/// Per-class counts of one split.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassCount {
    /// WordNet id.
    pub wnid: String,
    /// Label.
    pub label: u32,
    /// Records packed.
    pub records: u64,
    /// Inputs skipped.
    pub skipped: u64,
}

/// Counts of one split.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SplitReport {
    /// How the split's inputs were found.
    pub layout: String,
    /// Inputs found.
    pub inputs: u64,
    /// Their total size in bytes.
    pub input_bytes: u64,
    /// Records packed.
    pub records: u64,
    /// Inputs skipped.
    pub skipped: u64,
    /// Total size of the split's shard files.
    pub output_bytes: u64,
    /// Number of shards.
    pub shards: usize,
    /// Shards kept from a previous, interrupted run.
    pub shards_kept: usize,
    /// Records copied byte for byte.
    pub copied: u64,
    /// Records re-encoded at their original size.
    pub reencoded: u64,
    /// Records resized and re-encoded.
    pub resized: u64,
    /// Per-class counts in label order.
    pub classes: Vec<ClassCount>,
}

/// A file that was not considered an input, with the reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IgnoredFile {
    /// Path (or `ARCHIVE:MEMBER`).
    pub path: String,
    /// Why it was ignored.
    pub reason: String,
}

/// `pack-report.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PackReport {
    /// Input directory.
    pub input: String,
    /// Output directory.
    pub output: String,
    /// Number of classes.
    pub classes: usize,
    /// Per split.
    pub splits: BTreeMap<String, SplitReport>,
    /// Inputs of classes left out by `--classes`, by wnid.
    pub ignored_classes: BTreeMap<String, u64>,
    /// `--min-per-class` (0: no class dropped).
    #[serde(default)]
    pub min_per_class: u64,
    /// Classes dropped by `--min-per-class`, with their usable input counts.
    #[serde(default)]
    pub dropped_classes: BTreeMap<String, u64>,
    /// The validation split carved by `--val-fraction` / `--val-per-class`, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_split: Option<ValSplitReport>,
    /// Files that were not inputs (wrong extension, unlabelled validation images).
    pub ignored_files: Vec<IgnoredFile>,
    /// Every skipped input, in split and input order.
    pub skipped: Vec<SkippedInput>,
    /// Skipped inputs / all inputs.
    pub skip_fraction: f64,
    /// The limit it was checked against.
    pub max_skip_fraction: f64,
    /// Whether the skip fraction was within the limit (manifest written).
    pub ok: bool,
    /// Entries of the output directory this pack did not write, left untouched.
    #[serde(default)]
    pub left_in_place: Vec<String>,
    /// Worker threads used.
    pub threads: usize,
    /// Wall time of this run in seconds.
    pub elapsed_s: f64,
    /// Inputs processed per second in this run (kept shards excluded).
    pub images_per_s: f64,
}

/// 64-bit FNV-1a, used for plan and pack fingerprints (stable across builds, unlike
/// `DefaultHasher`).
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 ^= u64::from(x);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
        // Length-delimit fields so concatenations cannot collide.
        for x in (b.len() as u64).to_le_bytes() {
            self.0 ^= u64::from(x);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Fingerprint of everything that determines a split's shards.
fn plan_fingerprint(
    split: &str,
    shards: usize,
    copts: &ConvertOptions,
    classes: &[String],
    items: &[Item],
) -> String {
    let mut h = Fnv::new();
    h.bytes(b"ddl-pack plan v1");
    h.bytes(split.as_bytes());
    h.bytes(&(shards as u64).to_le_bytes());
    h.bytes(&copts.max_short_side.to_le_bytes());
    h.bytes(&[copts.quality, u8::from(copts.reencode)]);
    h.bytes(env!("CARGO_PKG_VERSION").as_bytes());
    for c in classes {
        h.bytes(c.as_bytes());
    }
    for it in items {
        h.bytes(&it.label.to_le_bytes());
        h.bytes(it.name.as_bytes());
        h.bytes(&it.size.to_le_bytes());
    }
    format!("{:016x}", h.0)
}

/// Inputs converted per split to estimate its output size for [`ShardCount::Size`].
pub const SIZE_SAMPLE: usize = 128;

/// Estimated bytes of a split's shards: the mean stored size (record, index row and alignment
/// padding) of an evenly spaced sample of converted inputs, times the input count. Falls back
/// to the input bytes when no sampled input converts.
fn estimate_output_bytes(
    pool: &rayon::ThreadPool,
    inputs: &Inputs,
    items: &[Item],
    copts: &ConvertOptions,
) -> u64 {
    let n = items.len();
    let k = n.min(SIZE_SAMPLE);
    let sizes: Vec<u64> = pool.install(|| {
        (0..k)
            .into_par_iter()
            .filter_map(|j| {
                let c = process(inputs, &items[j * n / k], copts).ok()?;
                Some(c.bytes.len() as u64 + INDEX_ROW_LEN as u64 + RECORD_ALIGN / 2)
            })
            .collect()
    });
    if sizes.is_empty() {
        return items.iter().map(|i| i.size).sum();
    }
    (sizes.iter().sum::<u64>() as f64 / sizes.len() as f64 * n as f64) as u64
}

/// Number of shards for a split of `items` inputs whose shards hold about `bytes`.
fn shard_count(count: ShardCount, items: usize, bytes: u64, nodes: usize) -> usize {
    let s = match count {
        ShardCount::Count(n) => n.max(1),
        ShardCount::Size(size) => {
            let s = bytes.div_ceil(size.max(1)).max(1) as usize;
            s.div_ceil(nodes) * nodes
        }
    };
    s.min(items).max(1)
}

/// The file name of shard `s` of `split`.
pub fn shard_file_name(split: &str, s: usize) -> String {
    format!("{split}-{s:05}.ddl")
}

/// Whether `name` looks like a shard this packer writes (`SPLIT-NNNNN.ddl`), and its split and
/// index.
fn parse_shard_name(name: &str) -> Option<(&str, usize)> {
    let stem = name.strip_suffix(".ddl")?;
    let (split, num) = stem.rsplit_once('-')?;
    if num.len() != 5 || !num.bytes().all(|b| b.is_ascii_digit()) || split.is_empty() {
        return None;
    }
    Some((split, num.parse().ok()?))
}

/// Per-shard outcome gathered while packing or from the state file.
struct ShardOutcome {
    info: ShardInfo,
    done: DoneShard,
    /// Kept from a previous run rather than produced now.
    kept: bool,
}

/// Records per label of one shard, added to its split's totals as soon as the shard is done
/// (so that memory does not grow with shards x classes).
type LabelCounts = Vec<u64>;

/// Adds a shard's `per_label` records to `totals`.
fn add_counts(totals: &mut [u64], per_label: &[u64]) {
    for (t, n) in totals.iter_mut().zip(per_label) {
        *t += n;
    }
}

struct SplitPlan<'a> {
    name: String,
    items: &'a [Item],
    shards: usize,
    plan: String,
}

/// Packs `opts.input` into `opts.output`. Writes the shards, `pack-report.json` and, when the
/// skip fraction is within the limit, `manifest.json`; returns the report. Above the limit the
/// report is written, no manifest, and [`LoaderError::SkipFraction`] is returned; the shards
/// stay and a rerun with a higher limit finishes without redoing them.
pub fn pack(opts: &PackOptions, progress: &dyn PackProgress) -> Result<PackReport> {
    let started = Instant::now();
    if opts.nodes == 0 {
        return Err(LoaderError::Input {
            path: opts.output.clone(),
            reason: "--nodes must be at least 1".into(),
        });
    }
    let side = opts.convert.max_short_side;
    if side != 0 && side < MIN_SHORT_SIDE {
        return Err(LoaderError::Input {
            path: opts.output.clone(),
            reason: format!(
                "--max-short-side {side} is below {MIN_SHORT_SIDE} pixels (the smallest \
                 ddl-train --image-size); use 0 to keep the original size"
            ),
        });
    }
    if !(1..=100).contains(&opts.convert.quality) {
        return Err(LoaderError::Input {
            path: opts.output.clone(),
            reason: format!("--quality {} is outside 1..=100", opts.convert.quality),
        });
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.threads)
        .thread_name(|i| format!("ddl-pack-{i}"))
        .build()
        .map_err(|e| LoaderError::io("start threads", &opts.output, std::io::Error::other(e)))?;
    let threads = pool.current_num_threads();
    if let Some(vs) = &opts.val_split {
        vs.validate().map_err(|reason| LoaderError::Input {
            path: opts.input.clone(),
            reason,
        })?;
    }
    let sopts = SourceOptions {
        classes: opts.classes.clone(),
        synsets: opts.synsets.clone(),
        min_per_class: opts.min_per_class,
        keep_empty_classes: opts.keep_empty_classes,
    };
    let mut inputs = pool.install(|| discover(&opts.input, &sopts))?;
    let val_split = match &opts.val_split {
        Some(vs) => Some(split::carve(&mut inputs, vs, &opts.input)?),
        None => None,
    };
    let out = &opts.output;

    let plans: Vec<SplitPlan<'_>> = inputs
        .splits
        .iter()
        .map(|(name, items)| {
            let bytes = match opts.shards {
                ShardCount::Size(_) => estimate_output_bytes(&pool, &inputs, items, &opts.convert),
                ShardCount::Count(_) => 0,
            };
            let shards = shard_count(opts.shards, items.len(), bytes, opts.nodes);
            SplitPlan {
                name: name.clone(),
                items,
                shards,
                plan: plan_fingerprint(name, shards, &opts.convert, &inputs.classes, items),
            }
        })
        .collect();

    // Nothing is written to the output directory before it is claimed.
    let shard_files: Vec<String> = plans
        .iter()
        .flat_map(|p| (0..p.shards).map(|s| shard_file_name(&p.name, s)))
        .collect();
    let Claim { mut state, left } =
        output::claim(out, &Identity::of(opts), &shard_files, opts.force)?;

    // Keep what a previous run finished and still matches the plan (checked in parallel: each
    // check reads the whole shard to compare its checksum).
    let candidates: Vec<(&SplitPlan<'_>, usize)> = plans
        .iter()
        .flat_map(|p| (0..p.shards).map(move |s| (p, s)))
        .filter(|(p, s)| state.shards.contains_key(&shard_file_name(&p.name, *s)))
        .collect();
    let kept: Vec<Option<(ShardOutcome, LabelCounts)>> = pool.install(|| {
        candidates
            .par_iter()
            .map(|(p, s)| {
                let file = shard_file_name(&p.name, *s);
                kept_shard(out, &file, *s, p, &state, &inputs, opts.nodes)
            })
            .collect()
    });
    let mut outcomes: BTreeMap<(String, usize), ShardOutcome> = BTreeMap::new();
    let mut class_records: BTreeMap<String, Vec<u64>> = plans
        .iter()
        .map(|p| (p.name.clone(), vec![0u64; inputs.classes.len()]))
        .collect();
    let mut kept_inputs = 0u64;
    for ((p, s), o) in candidates.into_iter().zip(kept) {
        if let Some((o, per_label)) = o {
            kept_inputs += p.items.len().saturating_sub(s).div_ceil(p.shards) as u64;
            add_counts(
                class_records.get_mut(&p.name).expect("a plan's split"),
                &per_label,
            );
            outcomes.insert((p.name.clone(), s), o);
        }
    }
    let kept_files: std::collections::HashSet<String> = outcomes
        .keys()
        .map(|(sp, s)| shard_file_name(sp, *s))
        .collect();
    state.shards.retain(|f, _| kept_files.contains(f));

    let total: u64 = plans.iter().map(|p| p.items.len() as u64).sum();
    progress.start(total, kept_inputs);
    // Inputs converted per parallel window: large enough that waiting for the slowest input of
    // a window costs little, small enough to keep memory bounded (a few MiB of JPEGs).
    let window = (threads * 256).max(512);
    for p in &plans {
        for s in 0..p.shards {
            if outcomes.contains_key(&(p.name.clone(), s)) {
                continue;
            }
            let (o, per_label) = pack_shard(&pool, out, p, s, &inputs, opts, window, progress)?;
            add_counts(
                class_records.get_mut(&p.name).expect("a plan's split"),
                &per_label,
            );
            state.shards.insert(o.info.file.clone(), o.done.clone());
            save_state(out, &state)?;
            outcomes.insert((p.name.clone(), s), o);
        }
    }
    progress.finish();

    // Report and manifest.
    let mut splits_report = BTreeMap::new();
    let mut splits_manifest = BTreeMap::new();
    let mut skipped = Vec::new();
    for p in &plans {
        let mut rep = SplitReport {
            layout: inputs.layouts.get(&p.name).cloned().unwrap_or_default(),
            inputs: p.items.len() as u64,
            input_bytes: p.items.iter().map(|i| i.size).sum(),
            records: 0,
            skipped: 0,
            output_bytes: 0,
            shards: p.shards,
            shards_kept: 0,
            copied: 0,
            reencoded: 0,
            resized: 0,
            classes: inputs
                .classes
                .iter()
                .zip(&class_records[&p.name])
                .enumerate()
                .map(|(l, (w, &records))| ClassCount {
                    wnid: w.clone(),
                    label: l as u32,
                    records,
                    skipped: 0,
                })
                .collect(),
        };
        let mut shard_infos = Vec::with_capacity(p.shards);
        let mut split_skips = Vec::new();
        for s in 0..p.shards {
            let o = &outcomes[&(p.name.clone(), s)];
            rep.records += o.info.records;
            rep.output_bytes += o.info.bytes;
            rep.copied += o.done.copied;
            rep.reencoded += o.done.reencoded;
            rep.resized += o.done.resized;
            for (i, reason, detail) in &o.done.skipped {
                let item = &p.items[*i as usize];
                rep.classes[item.label as usize].skipped += 1;
                split_skips.push((
                    *i,
                    SkippedInput {
                        split: p.name.clone(),
                        path: inputs.display(item),
                        reason: reason.clone(),
                        detail: detail.clone(),
                    },
                ));
            }
            shard_infos.push(o.info.clone());
        }
        rep.shards_kept = (0..p.shards)
            .filter(|&s| outcomes[&(p.name.clone(), s)].kept)
            .count();
        rep.skipped = split_skips.len() as u64;
        split_skips.sort_by_key(|(i, _)| *i);
        skipped.extend(split_skips.into_iter().map(|(_, s)| s));
        splits_manifest.insert(
            p.name.clone(),
            SplitInfo {
                records: rep.records,
                shards: shard_infos,
            },
        );
        splits_report.insert(p.name.clone(), rep);
    }
    let skip_fraction = if total == 0 {
        0.0
    } else {
        skipped.len() as f64 / total as f64
    };
    let ok = skip_fraction <= opts.max_skip_fraction;
    let elapsed = started.elapsed().as_secs_f64();
    let report = PackReport {
        input: opts.input.display().to_string(),
        output: out.display().to_string(),
        classes: inputs.classes.len(),
        splits: splits_report,
        ignored_classes: inputs.ignored_classes.clone(),
        min_per_class: opts.min_per_class,
        dropped_classes: inputs.dropped_classes.clone(),
        val_split: val_split.clone(),
        ignored_files: inputs
            .ignored_files
            .iter()
            .map(|(p, r)| IgnoredFile {
                path: p.clone(),
                reason: r.clone(),
            })
            .collect(),
        skipped,
        skip_fraction,
        max_skip_fraction: opts.max_skip_fraction,
        ok,
        left_in_place: left,
        threads,
        elapsed_s: elapsed,
        images_per_s: (total - kept_inputs) as f64 / elapsed.max(1e-9),
    };
    let report_path = out.join(REPORT_FILE);
    let text = serde_json::to_vec_pretty(&report).map_err(|source| LoaderError::Json {
        path: report_path.clone(),
        source,
    })?;
    write_atomic(&report_path, &text)?;
    if !ok {
        return Err(LoaderError::SkipFraction {
            path: report_path,
            skipped: report.skipped.len() as u64,
            inputs: total,
            max: opts.max_skip_fraction,
        });
    }
    let manifest = Manifest {
        format_version: crate::format::VERSION,
        classes: inputs
            .classes
            .iter()
            .enumerate()
            .map(|(l, w)| ClassInfo {
                wnid: w.clone(),
                label: l as u32,
            })
            .collect(),
        splits: splits_manifest,
        pack: serde_json::json!({
            "packer": concat!("ddl-pack ", env!("CARGO_PKG_VERSION")),
            "max_short_side": opts.convert.max_short_side,
            "quality": opts.convert.quality,
            "subsampling": "4:2:0",
            "reencode": opts.convert.reencode,
            "resize_filter": "lanczos3",
            "order": "per split, inputs sorted by (label, name); input i goes to shard i % shards",
            "plans": plans.iter().map(|p| (p.name.clone(), p.plan.clone())).collect::<BTreeMap<_, _>>(),
            "min_per_class": opts.min_per_class,
            "dropped_classes": inputs.dropped_classes.len(),
            "val_split": val_split,
        }),
        nodes: opts.nodes,
    };
    manifest.save(out)?;
    Ok(report)
}

/// Returns the outcome of shard `s` if a previous run finished it for the same plan and the
/// file on disk is intact (size, whole-file checksum, index valid).
fn kept_shard(
    out: &Path,
    file: &str,
    s: usize,
    p: &SplitPlan<'_>,
    state: &PackState,
    inputs: &Inputs,
    nodes: usize,
) -> Option<(ShardOutcome, LabelCounts)> {
    let done = state.shards.get(file)?;
    if done.plan != p.plan {
        return None;
    }
    let path = out.join(file);
    let md = std::fs::metadata(&path).ok()?;
    if md.len() != done.bytes {
        return None;
    }
    let reader = ShardReader::open(&path).ok()?;
    if reader.len() as u64 != done.records || reader.file_crc32c() != done.crc32c {
        return None;
    }
    let mut per_label = vec![0u64; inputs.classes.len()];
    for i in 0..reader.len() {
        *per_label.get_mut(reader.row(i).label as usize)? += 1;
    }
    let done = done.clone();
    let outcome = ShardOutcome {
        info: ShardInfo {
            file: file.to_string(),
            records: done.records,
            bytes: done.bytes,
            crc32c: done.crc32c,
            node: s % nodes,
        },
        done,
        kept: true,
    };
    Some((outcome, per_label))
}

/// Converts one input.
fn process(
    inputs: &Inputs,
    item: &Item,
    copts: &ConvertOptions,
) -> std::result::Result<convert::Converted, Skip> {
    let bytes = inputs.read(item).map_err(|e| Skip {
        reason: if e.kind() == std::io::ErrorKind::UnexpectedEof {
            SkipReason::Truncated
        } else {
            SkipReason::Unreadable
        },
        detail: e.to_string(),
    })?;
    convert(&bytes, copts)
}

/// Produces shard `s` of plan `p`; returns it with its records per label.
#[allow(clippy::too_many_arguments)]
fn pack_shard(
    pool: &rayon::ThreadPool,
    out: &Path,
    p: &SplitPlan<'_>,
    s: usize,
    inputs: &Inputs,
    opts: &PackOptions,
    window: usize,
    progress: &dyn PackProgress,
) -> Result<(ShardOutcome, LabelCounts)> {
    let file = shard_file_name(&p.name, s);
    let path = out.join(&file);
    let idx: Vec<usize> = (s..p.items.len()).step_by(p.shards).collect();
    let mut writer = ShardWriter::with_capacity(&path, idx.len() as u64)?;
    let mut done = DoneShard {
        plan: p.plan.clone(),
        records: 0,
        bytes: 0,
        crc32c: 0,
        copied: 0,
        reencoded: 0,
        resized: 0,
        skipped: Vec::new(),
    };
    let mut per_label = vec![0u64; inputs.classes.len()];
    for chunk in idx.chunks(window) {
        let results: Vec<_> = pool.install(|| {
            chunk
                .par_iter()
                .map(|&i| process(inputs, &p.items[i], &opts.convert))
                .collect()
        });
        for (&i, r) in chunk.iter().zip(results) {
            let item = &p.items[i];
            match r {
                Ok(c) => {
                    writer.push(&c.bytes, item.label, c.height, c.width)?;
                    per_label[item.label as usize] += 1;
                    match c.how {
                        How::Copied => done.copied += 1,
                        How::Reencoded => done.reencoded += 1,
                        How::Resized => done.resized += 1,
                    }
                }
                Err(sk) => done
                    .skipped
                    .push((i as u64, sk.reason.as_str().to_string(), sk.detail)),
            }
        }
        progress.advance(chunk.len() as u64);
    }
    let summary = writer.finish()?;
    debug_assert!(!tmp_path(&path).exists());
    done.records = summary.records;
    done.bytes = summary.bytes;
    done.crc32c = summary.crc32c;
    let outcome = ShardOutcome {
        info: ShardInfo {
            file,
            records: summary.records,
            bytes: summary.bytes,
            crc32c: summary.crc32c,
            node: s % opts.nodes,
        },
        done,
        kept: false,
    };
    Ok((outcome, per_label))
}

/// What [`verify`] found.
#[derive(Debug)]
pub struct VerifyReport {
    /// Shards checked.
    pub shards: usize,
    /// Records checked.
    pub records: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Every problem, naming the shard and, for damaged records, the record.
    pub problems: Vec<LoaderError>,
}

/// Re-reads the manifest in `dir` and every shard it lists: header, index, every record's
/// checksum, record count, size and whole-file checksum against the manifest.
pub fn verify(dir: &Path) -> Result<VerifyReport> {
    let manifest = Manifest::load(dir)?;
    let shards: Vec<&ShardInfo> = manifest
        .splits
        .values()
        .flat_map(|s| s.shards.iter())
        .collect();
    let results: Vec<(u64, u64, Vec<LoaderError>)> = shards
        .par_iter()
        .map(|info| verify_shard(dir, info))
        .collect();
    let mut report = VerifyReport {
        shards: shards.len(),
        records: 0,
        bytes: 0,
        problems: Vec::new(),
    };
    for (records, bytes, problems) in results {
        report.records += records;
        report.bytes += bytes;
        report.problems.extend(problems);
    }
    Ok(report)
}

fn verify_shard(dir: &Path, info: &ShardInfo) -> (u64, u64, Vec<LoaderError>) {
    let path = dir.join(&info.file);
    let reader = match ShardReader::open(&path) {
        Ok(r) => r,
        Err(e) => return (0, 0, vec![e]),
    };
    let mut problems = Vec::new();
    let mismatch = |reason: String| LoaderError::ShardMismatch {
        path: path.clone(),
        reason,
    };
    if reader.len() as u64 != info.records {
        problems.push(mismatch(format!(
            "{} records, manifest says {}",
            reader.len(),
            info.records
        )));
    }
    if reader.file_bytes() != info.bytes {
        problems.push(mismatch(format!(
            "{} bytes, manifest says {}",
            reader.file_bytes(),
            info.bytes
        )));
    }
    let crc = reader.file_crc32c();
    if crc != info.crc32c {
        problems.push(mismatch(format!(
            "whole-file crc32c {crc:#010x}, manifest says {:#010x}",
            info.crc32c
        )));
    }
    problems.extend(reader.verify());
    (reader.len() as u64, reader.file_bytes(), problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_counts() {
        assert_eq!(shard_count(ShardCount::Count(8), 100, 0, 3), 8);
        assert_eq!(shard_count(ShardCount::Count(8), 5, 0, 1), 5);
        assert_eq!(shard_count(ShardCount::Size(100), 1000, 1001, 1), 11);
        assert_eq!(shard_count(ShardCount::Size(100), 1000, 1001, 4), 12);
        assert_eq!(shard_count(ShardCount::Size(1 << 30), 10, 5, 4), 4);
        assert_eq!(shard_count(ShardCount::Size(1 << 30), 2, 5, 4), 2);
    }

    #[test]
    fn shard_names() {
        assert_eq!(shard_file_name("train", 7), "train-00007.ddl");
        assert_eq!(parse_shard_name("train-00007.ddl"), Some(("train", 7)));
        assert_eq!(parse_shard_name("val-12345.ddl"), Some(("val", 12345)));
        assert_eq!(parse_shard_name("train-7.ddl"), None);
        assert_eq!(parse_shard_name("notes.txt"), None);
    }
}
