//! The packer: turns ImageNet as it was downloaded (image-net.org's archives or their extracted
//! folders, Kaggle's, Hugging Face's parquet, WebDataset shards, ImageNet-22k's tars) or any
//! class-folder tree into shards, `manifest.json` and `pack-report.json`.
//!
//! Every split's inputs are sorted by (label, name) (parquet rows: by their place in the
//! files); record `i` of that order goes to shard `i % S`, or, in class order, shard `s` holds
//! the `s`-th of `S` consecutive runs of them ([`ShardOrder`]). Each shard is therefore a pure
//! function of the input list and the options and is produced on its own (a parquet split's
//! together, in one pass over the rows): its inputs are converted in order-preserving parallel
//! windows and written in order, so the bytes do not depend on the thread count. Finished
//! shards are recorded in `OUT/.pack-state.json`; a rerun keeps every shard whose plan
//! fingerprint, size and whole-file checksum still match and redoes only the rest, which gives
//! the same output as an uninterrupted run. The same file lists every file the pack writes:
//! the packer removes or replaces nothing else (see `output.rs` and `loader/FORMAT.md`).
//!
//! Memory: the input index (one [`source::Item`] per input) and per-class counts; converted
//! images are held one window at a time, and per-shard outcomes keep no per-class data.
//!
//! Files by concern: `options.rs` (what the packer can be told, each value's rule), `source/`
//! and `classes.rs` (finding the inputs and their labels, in every form ImageNet is downloaded
//! in), `split.rs` (a held-out validation split), `shard_plan.rs` (shard counts, names, plan
//! fingerprints), `identity.rs` and `output.rs` (whose files the output directory holds),
//! `shards.rs` (keeping and writing shards), `convert.rs` (one image), `report.rs` (report and
//! manifest), `verify.rs`.

mod classes;
pub(crate) mod conflict;
pub mod convert;
mod fnv;
mod identity;
mod identity_v1;
mod names;
pub(crate) mod option_error;
mod options;
mod output;
pub(crate) mod progress;
mod report;
mod shard_plan;
mod shards;
pub mod source;
pub(crate) mod spec;
pub mod split;
mod val_split;
mod verify;

use std::time::Instant;

use crate::error::{LoaderError, Result};
pub use conflict::{Occupant, OutputConflict, PackedBy};
pub use names::{REPORT_FILE, SPLITS, STATE_FILE};
pub use option_error::{OptionError, PackOption};
pub use options::{
    check_max_short_side, check_max_skip_fraction, check_nodes, check_quality, check_shards,
    PackOptions, DEFAULT_MAX_SHORT_SIDE, DEFAULT_MAX_SKIP_FRACTION, DEFAULT_QUALITY,
    DEFAULT_SHARD_BYTES,
};
pub use progress::{NoProgress, PackProgress};
pub use report::{ClassCount, IgnoredFile, PackReport, SkippedInput, SplitReport};
pub use shard_plan::{shard_file_name, SIZE_SAMPLE};
pub use spec::{PackSpec, ShardCount, ShardOrder};
pub use verify::{verify, VerifyReport};

/// Packs `opts.input` into `opts.output`. Writes the shards, `pack-report.json` and, when the
/// skip fraction is within the limit, `manifest.json`; returns the report. Above the limit the
/// report is written, no manifest, and [`LoaderError::SkipFraction`] is returned; the shards
/// stay and a rerun with a higher limit finishes without redoing them. An option's value is
/// checked before anything is read ([`LoaderError::Option`]).
///
/// # Examples
///
/// Packing a folder tree of two classes and reading a record back from the node's shards:
///
/// ```
/// use ddl_loader::dataset::{Dataset, OpenOptions, Residency};
/// use ddl_loader::pack::{self, NoProgress, PackOptions};
///
/// let tmp = tempfile::tempdir()?;
/// let (input, output) = (tmp.path().join("imagenet"), tmp.path().join("shards"));
/// for (class, wnid) in ["n01440764", "n01443537"].iter().enumerate() {
///     let dir = input.join("train").join(wnid);
///     std::fs::create_dir_all(&dir)?;
///     for i in 0..3 {
///         let jpeg = ddl_testkit::jpeg(48, 40, class * 10 + i);
///         std::fs::write(dir.join(format!("{wnid}_{i}.JPEG")), jpeg)?;
///     }
/// }
/// let report = pack::pack(&PackOptions::new(&input, &output), &NoProgress)?;
/// assert_eq!((report.classes, report.splits["train"].records), (2, 6));
///
/// let one_node = Residency { node: 0, nodes: 1 };
/// let train = Dataset::open(&output, "train", one_node, &OpenOptions::default())?;
/// let record = train.record(0)?;
/// assert_eq!((record.label, record.width, record.height), (0, 48, 40));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn pack(opts: &PackOptions, progress: &dyn PackProgress) -> Result<PackReport> {
    let started = Instant::now();
    opts.validate().map_err(|source| {
        let split = matches!(
            source.option,
            PackOption::ValFraction | PackOption::ValPerClass
        );
        LoaderError::Option {
            path: if split { &opts.input } else { &opts.output }.clone(),
            source,
        }
    })?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.threads)
        .thread_name(|i| format!("ddl-pack-{i}"))
        .build()
        .map_err(|e| LoaderError::io("start threads", &opts.output, std::io::Error::other(e)))?;
    let sopts = source::SourceOptions {
        classes: opts.classes.clone(),
        synsets: opts.synsets.clone(),
        min_per_class: opts.min_per_class,
        keep_empty_classes: opts.keep_empty_classes,
    };
    let mut inputs = pool.install(|| source::discover(&opts.input, &sopts, progress))?;
    if opts.order == ShardOrder::Class {
        if inputs
            .splits
            .values()
            .any(|items| source::sequential_only(items))
        {
            return Err(LoaderError::Option {
                path: opts.input.clone(),
                source: OptionError::new(
                    PackOption::Order,
                    "class",
                    "needs to read the inputs in class order, and this input is a \
                     gzip-compressed tar, read only in its own order: gunzip it first",
                ),
            });
        }
        // Consecutive classes in consecutive shards, whatever order the inputs were found in.
        for items in inputs.splits.values_mut() {
            source::sort_by_label(items);
        }
    }
    let val_split = match &opts.val_split {
        Some(vs) => Some(split::carve(&mut inputs, vs, &opts.input)?),
        None => None,
    };
    let plans = shard_plan::plan_splits(&pool, &inputs, opts);
    // Nothing is written to the output directory before it is claimed.
    let files = shard_plan::shard_files(&plans);
    let id = identity::Identity::of(opts);
    let output::Claim {
        mut state,
        left,
        lock: _lock,
    } = output::claim(&opts.output, &id, &files, opts.force)?;
    let mut tally =
        shards::keep_finished(&pool, &opts.output, &plans, &mut state, &inputs, opts.nodes);
    let total: u64 = plans.iter().map(|p| p.items.len() as u64).sum();
    progress.start(total, tally.kept_inputs);
    let writing = shards::Writing {
        pool: &pool,
        out: &opts.output,
        inputs: &inputs,
        convert: &opts.convert,
        nodes: opts.nodes,
        progress,
    };
    shards::write_missing(&writing, &plans, &mut state, &mut tally)?;
    progress.finish();
    let run = report::RunFacts {
        val_split,
        left,
        threads: pool.current_num_threads(),
        started,
    };
    report::finish(opts, &inputs, &plans, &tally, run)
}
