//! `ddl-pack`'s flags and the one place where they become settings ([`Settings::from_cli`]),
//! and where the library's typed errors get the flags' names back ([`explain`]).

use std::path::PathBuf;
use std::str::FromStr;

use anyhow::{bail, Result};
use clap::Parser;
use ddl_loader::pack::convert::ConvertOptions;
use ddl_loader::pack::split::{ValRule, ValSplit};
use ddl_loader::pack::{
    self, OptionError, PackOption, PackOptions, PackSpec, ShardCount, ShardOrder,
};
use ddl_loader::LoaderError;

use ddl_loader::units;

/// Pack ImageNet (as downloaded) or a class-folder tree into ddl shards, or verify a pack.
///
/// Writes the shards, manifest.json and pack-report.json to OUT; run again with the same
/// input and flags, it resumes where it stopped. `ddl-train --data OUT` trains on the result.
#[derive(Debug, Parser)]
#[command(name = "ddl-pack", version, max_term_width = 100)]
#[command(group = clap::ArgGroup::new("val").args(["val_fraction", "val_per_class"]))]
pub struct Args {
    /// ImageNet as downloaded, another dataset's download, or a class-folder tree.
    ///
    /// A directory holding any mix of image-net.org's ILSVRC2012_img_train.tar,
    /// ILSVRC2012_img_val.tar and ILSVRC2012_devkit_t12.tar.gz (or their extracted
    /// train/WNID/, flat val/ and devkit folder); Kaggle's download (its .zip, or unzipped; its
    /// LOC_val_solution.csv labels val); Hugging Face's imagenet-1k (data/*.parquet and classes.py, or its older
    /// data/*.tar.gz); timm's WebDataset shards; TFRecord files (TensorFlow Datasets'
    /// imagenet2012/, the TPU reference's train-00000-of-01024 ...); ImageNet-22k's WNID.tar
    /// files or an outer tar of them such as winter21_whole.tar.gz (or that tar itself); a tar
    /// of class folders (imagenet21k_resized.tar.gz, ImageNetV2's tar); or any class-folder
    /// tree. Gzip-compressed tars are read as they are. Labels come only from what states them
    /// (folder and tar names, the devkit, the CSV, parquet rows, .cls files, a TFRecord's
    /// synset or label, a wnid ending an image's name): an input without a label source is
    /// refused.
    #[arg(required_unless_present = "verify")]
    pub input: Option<PathBuf>,

    /// Output directory for the shards, manifest.json and pack-report.json.
    ///
    /// New, empty, or one this same pack (same input and flags) wrote before, which it
    /// resumes. ddl-pack removes or replaces only files its resume state (.pack-state.json)
    /// lists as written by this pack; a directory holding anything else is refused unless
    /// --force.
    #[arg(
        short,
        long,
        value_name = "OUT",
        required_unless_present = "verify",
        help_heading = "Input and output"
    )]
    pub output: Option<PathBuf>,

    /// Write into an output directory that holds another ddl pack.
    ///
    /// Its manifest.json, pack-report.json, resume state and the shards whose names this pack
    /// writes are replaced; its other shards are left in place. Files ddl-pack cannot
    /// identify as a ddl pack's own are never touched, with or without --force.
    #[arg(long, conflicts_with = "verify", help_heading = "Input and output")]
    pub force: bool,

    /// Re-read every shard in DIR against its manifest and report any damage.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["input", "output"],
          help_heading = "Input and output")]
    pub verify: Option<PathBuf>,

    /// Number of shards per split (capped at the split's input count).
    #[arg(
        long,
        value_name = "N",
        conflicts_with = "shard_size",
        help_heading = "Shards"
    )]
    pub shards: Option<usize>,

    /// Target shard size, used when --shards is not given (e.g. 1GiB, 512MiB).
    ///
    /// KiB/MiB/GiB/TiB and K/M/G/T are powers of 1024, KB/MB/GB/TB powers of 1000. The output
    /// size is estimated by converting a sample of the inputs, and the shard count is rounded
    /// up to a multiple of --nodes.
    #[arg(long, value_name = "SIZE", value_parser = units::parse_size, default_value = "1GiB",
          help_heading = "Shards")]
    pub shard_size: u64,

    /// Which inputs each shard holds, of every split's inputs sorted by (label, name).
    ///
    /// Parquet rows are sorted by file and row. interleaved: input i in shard i % shards, so
    /// every shard holds every class; class: consecutive runs, so consecutive shards hold
    /// consecutive classes and each of --nodes P nodes holds about 1/P of the classes (for
    /// experiments on node-local order).
    #[arg(long, value_enum, default_value_t = ShardOrder::Interleaved, help_heading = "Shards")]
    pub order: ShardOrder,

    /// Number of nodes recorded in the manifest (shard s belongs to node s % P).
    #[arg(long, value_name = "P", default_value_t = 1, value_parser = checked(pack::check_nodes),
          help_heading = "Shards")]
    pub nodes: usize,

    /// Resize so the shorter side is at most this many pixels (0: keep the size).
    ///
    /// Otherwise at least 16 (ddl-train's smallest --image-size).
    #[arg(long, value_name = "PX", default_value_t = pack::DEFAULT_MAX_SHORT_SIDE,
          value_parser = checked(pack::check_max_short_side), help_heading = "Images")]
    pub max_short_side: u32,

    /// JPEG quality for re-encoded images (4:2:0 subsampling), 1..=100.
    #[arg(long, value_name = "Q", default_value_t = pack::DEFAULT_QUALITY,
          value_parser = checked(pack::check_quality), help_heading = "Images")]
    pub quality: u8,

    /// Re-encode every image, even baseline JPEGs that already fit.
    #[arg(long, help_heading = "Images")]
    pub reencode: bool,

    /// Class list (one wnid per line): restricts and orders the classes.
    ///
    /// The first token of each line is the wnid.
    #[arg(long, value_name = "FILE", help_heading = "Classes and the val split")]
    pub classes: Option<PathBuf>,

    /// ILSVRC synset list, for a devkit ground truth without data/meta.mat.
    ///
    /// One wnid per line in ILSVRC id order; beside meta.mat it must agree with it.
    #[arg(long, value_name = "FILE", help_heading = "Classes and the val split")]
    pub synsets: Option<PathBuf>,

    /// Drop classes with fewer than N usable inputs.
    ///
    /// Image-named files or tar members, counted before decoding and before a --val-* split;
    /// the report lists them with their counts.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 0,
        help_heading = "Classes and the val split"
    )]
    pub min_per_class: u64,

    /// Keep a class that has no usable training image, with no training records.
    ///
    /// An empty class folder or tar, or a class with images only in val. Without it such a
    /// class is an error: leaving it out would give every later class another label.
    #[arg(long, help_heading = "Classes and the val split")]
    pub keep_empty_classes: bool,

    /// Hold out this fraction (0 < F < 1) of a split-less input as val.
    ///
    /// An image goes to val by a hash of (--val-seed, wnid, file name), whatever the thread
    /// count, tar order or --shards.
    #[arg(long, value_name = "F", help_heading = "Classes and the val split")]
    pub val_fraction: Option<f64>,

    /// Hold out N images of each class as the val split.
    ///
    /// Those with the smallest hash of (--val-seed, wnid, file name); at most all but one per
    /// class.
    #[arg(long, value_name = "N", help_heading = "Classes and the val split")]
    pub val_per_class: Option<u64>,

    /// Seed of the --val-fraction / --val-per-class hash.
    #[arg(
        long,
        value_name = "SEED",
        requires = "val",
        help_heading = "Classes and the val split"
    )]
    pub val_seed: Option<u64>,

    /// Worker threads (0 = one per core).
    #[arg(long, value_name = "N", default_value_t = 0, help_heading = "Run")]
    pub threads: usize,

    /// Fail when more than this fraction of the inputs is skipped.
    ///
    /// The report is written first.
    #[arg(long, value_name = "F", default_value_t = pack::DEFAULT_MAX_SKIP_FRACTION,
          help_heading = "Run")]
    pub max_skip_fraction: f64,
}

/// A clap value parser that parses a `T` and applies the library's rule `check` to it, so
/// that the rule lives in the library and a bad value is still a usage error (status 2).
fn checked<T>(
    check: fn(T) -> Result<(), OptionError>,
) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static
where
    T: FromStr + Copy + Send + Sync + 'static,
{
    move |s: &str| {
        let v: T = s
            .parse()
            .map_err(|_| format!("{s:?} is not a whole number"))?;
        check(v).map_err(|e| format!("{s} {}", e.problem))?;
        Ok(v)
    }
}

/// What one run of `ddl-pack` does.
#[derive(Debug)]
pub enum Settings {
    /// Check the packed directory against its manifest.
    Verify(PathBuf),
    /// Pack with these options.
    Pack(PackOptions),
}

impl Settings {
    /// The settings the flags ask for. The values' rules are the library's: the ones clap
    /// cannot apply while parsing are checked by [`pack::pack`] before it reads anything.
    pub fn from_cli(args: Args) -> Result<Settings> {
        if let Some(dir) = args.verify {
            return Ok(Settings::Verify(dir));
        }
        let (Some(input), Some(output)) = (args.input, args.output) else {
            bail!("INPUT_DIR and -o OUT are required (or --verify DIR)");
        };
        let val_split = match (args.val_fraction, args.val_per_class) {
            (Some(f), None) => Some(ValRule::Fraction(f)),
            (None, Some(n)) => Some(ValRule::PerClass(n)),
            _ => None,
        }
        .map(|rule| ValSplit {
            rule,
            seed: args.val_seed.unwrap_or(0),
        });
        Ok(Settings::Pack(PackOptions {
            input,
            output,
            shards: match args.shards {
                Some(n) => ShardCount::Count(n),
                None => ShardCount::Size(args.shard_size),
            },
            order: args.order,
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
            nodes: args.nodes,
            threads: args.threads,
            max_skip_fraction: args.max_skip_fraction,
            force: args.force,
        }))
    }
}

/// The flag of each library option.
pub fn flag(o: PackOption) -> &'static str {
    match o {
        PackOption::Shards => "--shards",
        PackOption::MaxShortSide => "--max-short-side",
        PackOption::Quality => "--quality",
        PackOption::Nodes => "--nodes",
        PackOption::Synsets => "--synsets",
        PackOption::MinPerClass => "--min-per-class",
        PackOption::ValFraction => "--val-fraction",
        PackOption::ValPerClass => "--val-per-class",
        PackOption::MaxSkipFraction => "--max-skip-fraction",
        PackOption::Order => "--order",
    }
}

/// A pack's options as the flags that ask for them (`IN with --shards 4 --max-short-side
/// 256 ...`), as a refusal names this pack and the other one.
pub fn spec_flags(s: &PackSpec) -> String {
    let shards = match s.shards {
        ShardCount::Count(n) => format!("--shards {n}"),
        ShardCount::Size(b) => format!("--shard-size {b}B"),
    };
    let order = match s.order {
        ShardOrder::Interleaved => "",
        ShardOrder::Class => " --order class",
    };
    let mut line = format!(
        "{} with {shards}{order} --max-short-side {} --quality {}{} --nodes {}",
        s.input.display(),
        s.max_short_side,
        s.quality,
        if s.reencode { " --reencode" } else { "" },
        s.nodes
    );
    for (f, list) in [("--classes", &s.classes), ("--synsets", &s.synsets)] {
        if let Some(p) = list {
            line.push_str(&format!(" {f} {}", p.display()));
        }
    }
    if s.min_per_class > 0 {
        line.push_str(&format!(" --min-per-class {}", s.min_per_class));
    }
    if s.keep_empty_classes {
        line.push_str(" --keep-empty-classes");
    }
    if let Some(vs) = &s.val_split {
        let f = flag(vs.option());
        line.push_str(&format!(" {f} {} --val-seed {}", vs.value(), vs.seed));
    }
    line
}

/// The library's error `e` in the words of `ddl-pack`'s flags.
pub fn explain(e: LoaderError) -> anyhow::Error {
    match &e {
        LoaderError::Option { path, source } => {
            anyhow::anyhow!("{}: {}", path.display(), source.describe(flag))
        }
        LoaderError::OutputInUse { path, conflict } => anyhow::anyhow!(
            "{}: {}",
            path.display(),
            conflict.describe(&spec_flags, "--force")
        ),
        LoaderError::SkipFraction {
            path,
            skipped,
            inputs,
            max,
        } => anyhow::anyhow!(
            "{}: skipped {skipped} of {inputs} inputs, more than --max-skip-fraction {max} \
             allows; the report lists every skipped file. The shards are kept: rerun with a \
             higher --max-skip-fraction to accept them and write manifest.json without redoing \
             any work",
            path.display()
        ),
        LoaderError::EmptyClasses { .. } => anyhow::anyhow!(
            "{e}. Add their images, remove them, pass --keep-empty-classes to keep them as \
             classes without training records, or --min-per-class 1 to drop them"
        ),
        _ => e.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shard_size_default_is_the_librarys() {
        let a = Args::parse_from(["ddl-pack", "in", "-o", "out"]);
        assert_eq!(a.shard_size, pack::DEFAULT_SHARD_BYTES);
        let Settings::Pack(o) = Settings::from_cli(a).unwrap() else {
            panic!("not a pack")
        };
        let d = PackOptions::new("in", "out");
        assert_eq!(
            (o.shards, o.order, o.convert, o.nodes),
            (d.shards, d.order, d.convert, d.nodes)
        );
        assert_eq!(
            (o.threads, o.max_skip_fraction),
            (d.threads, d.max_skip_fraction)
        );
    }

    #[test]
    fn library_errors_name_the_flags() {
        let e = LoaderError::Option {
            path: "dk.txt".into(),
            source: OptionError {
                option: PackOption::Synsets,
                value: None,
                problem: "is needed".into(),
            },
        };
        assert_eq!(explain(e).to_string(), "dk.txt: --synsets is needed");
        let e = LoaderError::SkipFraction {
            path: "r.json".into(),
            skipped: 2,
            inputs: 10,
            max: 0.1,
        };
        assert!(explain(e)
            .to_string()
            .contains("more than --max-skip-fraction 0.1"));
    }
}
