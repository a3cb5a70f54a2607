//! `ddl-pack`: command-line flags, progress display and exit status around
//! [`ddl_loader::pack`].

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use ddl_loader::pack::convert::{ConvertOptions, MIN_SHORT_SIDE};
use ddl_loader::pack::split::{ValRule, ValSplit};
use ddl_loader::pack::{self, PackOptions, PackProgress, ShardCount};
use ddl_loader::LoaderError;

use crate::cli::stderr_line;
use crate::size;

/// Packs an ImageNet-style tree (or ImageNet-22k tars) into ddl shards, or verifies a packed
/// directory.
#[derive(Debug, Parser)]
#[command(name = "ddl-pack", version)]
#[command(group = clap::ArgGroup::new("val").args(["val_fraction", "val_per_class"]))]
pub struct Args {
    /// Input: a directory holding train/WNID/*.JPEG and val/ (class folders, or flat with
    /// LOC_val_solution.csv / the devkit ground truth), or WNID.tar files, or an outer tar of
    /// WNID.tar files; or that outer tar itself (fall11_whole.tar, winter21_whole.tar).
    #[arg(required_unless_present = "verify")]
    pub input: Option<PathBuf>,

    /// Output directory for the shards, manifest.json and pack-report.json: new, empty, or
    /// one this same pack (same input and flags) wrote before, which it resumes. ddl-pack
    /// removes or replaces only files its resume state (.pack-state.json) lists as written by
    /// this pack; a directory holding anything else is refused unless --force.
    #[arg(short, long, required_unless_present = "verify")]
    pub output: Option<PathBuf>,

    /// Use an output directory that holds another ddl pack (other input or flags): its
    /// manifest.json, pack-report.json, resume state and the shards whose names this pack
    /// writes are replaced; its other shards are left in place. Files ddl-pack cannot identify
    /// as a ddl pack's own are never touched, with or without --force.
    #[arg(long, conflicts_with = "verify")]
    pub force: bool,

    /// Re-read every shard in DIR against its manifest and report any damage.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["input", "output"])]
    pub verify: Option<PathBuf>,

    /// Number of shards per split (capped at the split's input count).
    #[arg(long, conflicts_with = "shard_size")]
    pub shards: Option<usize>,

    /// Target shard size (e.g. 1GiB, 512MiB; KiB/MiB/GiB/TiB and K/M/G/T are powers of 1024,
    /// KB/MB/GB/TB powers of 1000), used when --shards is not given; the output
    /// size is estimated by converting a sample of the inputs, and the shard count is rounded
    /// up to a multiple of --nodes.
    #[arg(long, value_parser = size::parse_size, default_value = "1GiB")]
    pub shard_size: u64,

    /// Resize so the shorter side is at most this many pixels: 0 keeps the original size,
    /// otherwise at least 16 (ddl-train's smallest --image-size).
    #[arg(long, default_value_t = 256, value_parser = parse_max_short_side)]
    pub max_short_side: u32,

    /// JPEG quality for re-encoded images (4:2:0 subsampling).
    #[arg(long, default_value_t = 90, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub quality: u8,

    /// Re-encode every image, even baseline JPEGs that already fit.
    #[arg(long)]
    pub reencode: bool,

    /// Class list (one wnid per line, first token): restricts and orders the classes.
    #[arg(long, value_name = "FILE")]
    pub classes: Option<PathBuf>,

    /// ILSVRC synset list (one wnid per line in ILSVRC id order) for the devkit ground truth.
    #[arg(long, value_name = "FILE")]
    pub synsets: Option<PathBuf>,

    /// Drop classes with fewer than N usable inputs (image-named files or tar members, counted
    /// before decoding and before a --val-* split); the report lists them with their counts.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub min_per_class: u64,

    /// Keep a class that has no usable training image (an empty class folder or tar, or a
    /// class with images only in val) as a class with no training records. Without it such a
    /// class is an error: leaving it out would give every later class another label.
    #[arg(long)]
    pub keep_empty_classes: bool,

    /// Hold out this fraction (0 < F < 1) of an input without a val split as the val split:
    /// an image goes to val by a hash of (--val-seed, wnid, file name), whatever the thread
    /// count, tar order or --shards.
    #[arg(long, value_name = "F")]
    pub val_fraction: Option<f64>,

    /// Hold out the N images of each class with the smallest hash of (--val-seed, wnid, file
    /// name) as the val split (at most all but one per class).
    #[arg(long, value_name = "N")]
    pub val_per_class: Option<u64>,

    /// Seed of the --val-fraction / --val-per-class hash.
    #[arg(long, value_name = "SEED", requires = "val")]
    pub val_seed: Option<u64>,

    /// Number of nodes recorded in the manifest (shard s belongs to node s % P).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub nodes: u64,

    /// Worker threads (0 = one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,

    /// Fail (after writing the report) when more than this fraction of inputs is skipped.
    #[arg(long, default_value_t = pack::DEFAULT_MAX_SKIP_FRACTION)]
    pub max_skip_fraction: f64,
}

/// Skipped inputs and left-over files named after a pack (the report lists all of them).
const SHOWN: usize = 5;

/// `--max-short-side`: 0, or at least [`MIN_SHORT_SIDE`].
fn parse_max_short_side(s: &str) -> std::result::Result<u32, String> {
    let v: u32 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a whole number of pixels"))?;
    if v != 0 && v < MIN_SHORT_SIDE {
        return Err(format!(
            "{v} is below {MIN_SHORT_SIDE} pixels, the smallest ddl-train --image-size \
             (use 0 to keep the original size)"
        ));
    }
    Ok(v)
}

/// Progress as an indicatif bar on a terminal, or a plain line every 10 s otherwise.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    plain: Mutex<PlainState>,
}

struct PlainState {
    total: u64,
    done: u64,
    kept: u64,
    started: Instant,
    last: Instant,
}

impl Progress {
    fn new() -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = indicatif::ProgressBar::new(0);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{bar:40} {pos}/{len} images  {rate} images/s  ETA {eta}  {msg}",
                )
                .expect("valid template")
                .with_key(
                    "rate",
                    |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                        let _ = write!(w, "{:.0}", state.per_sec());
                    },
                ),
            );
            b
        });
        let now = Instant::now();
        Progress {
            bar,
            plain: Mutex::new(PlainState {
                total: 0,
                done: 0,
                kept: 0,
                started: now,
                last: now,
            }),
        }
    }
}

impl PackProgress for Progress {
    fn start(&self, total: u64, done: u64) {
        if let Some(b) = &self.bar {
            b.set_length(total);
            b.set_position(done);
            b.reset_eta();
            if done > 0 {
                b.set_message(format!("({done} kept from an earlier run)"));
            }
        } else {
            let mut p = self.plain.lock().expect("progress lock");
            p.total = total;
            p.done = done;
            p.kept = done;
            stderr_line(&format!(
                "ddl-pack: {total} inputs, {done} already packed by an earlier run"
            ));
        }
    }

    fn advance(&self, n: u64) {
        if let Some(b) = &self.bar {
            b.inc(n);
            return;
        }
        let mut p = self.plain.lock().expect("progress lock");
        p.done += n;
        let now = Instant::now();
        if now.duration_since(p.last) >= Duration::from_secs(10) {
            p.last = now;
            let secs = now.duration_since(p.started).as_secs_f64();
            let rate = (p.done - p.kept) as f64 / secs.max(1e-9);
            let eta = (p.total - p.done) as f64 / rate.max(1e-9);
            stderr_line(&format!(
                "ddl-pack: {}/{} images, {rate:.0} images/s, ETA {eta:.0} s",
                p.done, p.total
            ));
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            // The summary printed next repeats the totals and the rate.
            b.finish_and_clear();
        }
    }
}

/// Runs `ddl-pack` with parsed arguments.
pub fn run(args: Args) -> Result<()> {
    if let Some(dir) = &args.verify {
        let report = pack::verify(dir).with_context(|| format!("verifying {}", dir.display()))?;
        for p in &report.problems {
            stderr_line(&format!("DAMAGED: {p}"));
        }
        if !report.problems.is_empty() {
            bail!(
                "{}: {} problem(s) in {} shards ({} records checked); the DAMAGED lines name \
                 each shard and record. Rerunning the ddl-pack command that wrote {} rewrites \
                 the damaged shards from the input and keeps the intact ones; meanwhile \
                 ddl-train --on-bad-record replace (the default) trains around bad records",
                dir.display(),
                report.problems.len(),
                report.shards,
                report.records,
                dir.display()
            );
        }
        println!(
            "{}: OK, {} shards, {} records, {} bytes verified",
            dir.display(),
            report.shards,
            report.records,
            report.bytes
        );
        return Ok(());
    }
    let (Some(input), Some(output)) = (args.input, args.output) else {
        bail!("INPUT_DIR and -o OUT are required (or --verify DIR)");
    };
    if !(0.0..=1.0).contains(&args.max_skip_fraction) {
        bail!(
            "--max-skip-fraction {} is outside 0..=1",
            args.max_skip_fraction
        );
    }
    let val_split = match (args.val_fraction, args.val_per_class) {
        (Some(f), None) => Some(ValRule::Fraction(f)),
        (None, Some(n)) => Some(ValRule::PerClass(n)),
        _ => None,
    }
    .map(|rule| ValSplit {
        rule,
        seed: args.val_seed.unwrap_or(0),
    });
    if let Some(vs) = &val_split {
        vs.validate().map_err(anyhow::Error::msg)?;
    }
    let opts = PackOptions {
        input,
        output,
        shards: match args.shards {
            Some(0) => bail!("--shards must be at least 1"),
            Some(n) => ShardCount::Count(n),
            None => ShardCount::Size(args.shard_size),
        },
        convert: ConvertOptions {
            max_short_side: args.max_short_side,
            quality: args.quality,
            reencode: args.reencode,
        },
        classes: args.classes,
        synsets: args.synsets,
        min_per_class: args.min_per_class,
        keep_empty_classes: args.keep_empty_classes,
        val_split,
        nodes: args.nodes as usize,
        threads: args.threads,
        max_skip_fraction: args.max_skip_fraction,
        force: args.force,
    };
    let progress = Progress::new();
    let report = pack::pack(&opts, &progress).map_err(|e| match e {
        LoaderError::EmptyClasses { .. } => anyhow::anyhow!(
            "{e}. Add their images, remove them, pass --keep-empty-classes to keep them as \
             classes without training records, or --min-per-class 1 to drop them"
        ),
        other => other.into(),
    })?;
    for (name, s) in &report.splits {
        println!(
            "{name}: {} records in {} shards ({} kept), {} skipped, {} bytes \
             (copied {}, re-encoded {}, resized {})",
            s.records,
            s.shards,
            s.shards_kept,
            s.skipped,
            s.output_bytes,
            s.copied,
            s.reencoded,
            s.resized
        );
    }
    if let Some(v) = &report.val_split {
        println!(
            "val held out by {}: {} inputs to val, {} to train (seed {})",
            v.rule, v.val_inputs, v.train_inputs, v.seed
        );
    }
    if !report.dropped_classes.is_empty() {
        println!(
            "dropped {} classes with fewer than {} usable inputs (--min-per-class; listed in \
             the report)",
            report.dropped_classes.len(),
            report.min_per_class
        );
    }
    for s in report.skipped.iter().take(SHOWN) {
        println!("skipped {} ({}: {})", s.path, s.reason, s.detail);
    }
    if report.skipped.len() > SHOWN {
        println!(
            "... and {} more skipped inputs",
            report.skipped.len() - SHOWN
        );
    }
    if !report.left_in_place.is_empty() {
        let shown: Vec<&str> = report
            .left_in_place
            .iter()
            .take(SHOWN)
            .map(String::as_str)
            .collect();
        println!(
            "left {} file(s) in {} that this pack did not write untouched: {}{}",
            report.left_in_place.len(),
            opts.output.display(),
            shown.join(", "),
            if report.left_in_place.len() > shown.len() {
                ", ..."
            } else {
                ""
            }
        );
    }
    if !report.ignored_classes.is_empty() {
        // Only --classes leaves classes out this way (empty ones are refused or kept).
        println!(
            "ignored {} classes not in --classes ({} files)",
            report.ignored_classes.len(),
            report.ignored_classes.values().sum::<u64>()
        );
    }
    println!(
        "{} classes, {:.0} images/s on {} threads, {:.1} s; report: {}",
        report.classes,
        report.images_per_s,
        report.threads,
        report.elapsed_s,
        opts.output.join(pack::REPORT_FILE).display()
    );
    Ok(())
}
