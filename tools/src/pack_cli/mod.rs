//! `ddl-pack`: command-line flags (`flags.rs`), progress display (`progress.rs`) and the
//! summary and exit status around [`ddl_loader::pack`].

mod flags;
mod progress;

use std::path::Path;

use anyhow::{bail, Context, Result};
use ddl_cli::escape_controls;
use ddl_loader::pack::{self, PackOptions, PackReport};

use ddl_cli::stderr_line;
pub use flags::{explain, flag, spec_flags, Args, Settings};

/// Skipped inputs and left-over files named after a pack (the report lists all of them).
const SHOWN: usize = 5;

/// Runs `ddl-pack` with parsed arguments.
pub fn run(args: Args) -> Result<()> {
    match Settings::from_cli(args)? {
        Settings::Verify(dir) => verify(&dir),
        Settings::Pack(opts) => {
            let report = pack::pack(&opts, &progress::Progress::new()).map_err(explain)?;
            print_summary(&report, &opts);
            Ok(())
        }
    }
}

/// `--verify DIR`: one `DAMAGED:` line per problem, and a failure naming the fix.
fn verify(dir: &Path) -> Result<()> {
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
    ddl_cli::outln!(
        "{}: OK, {} shards, {} records, {} bytes verified",
        dir.display(),
        report.shards,
        report.records,
        report.bytes
    );
    Ok(())
}

/// What a finished pack prints: per split, the held-out split, dropped classes, the first
/// skipped inputs, files left in place, ignored classes, and the totals.
fn print_summary(report: &PackReport, opts: &PackOptions) {
    for (name, s) in &report.splits {
        ddl_cli::outln!(
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
        if let Some(l) = &s.labels {
            let checked = match l.checked.as_slice() {
                [] => String::new(),
                files => format!(", checked against {}", files.join(" with ")),
            };
            ddl_cli::outln!(
                "{name} labels: {}",
                escape_controls(&(l.files.join(" with ") + &checked))
            );
        }
    }
    if let Some(v) = &report.val_split {
        ddl_cli::outln!(
            "val held out by {}: {} inputs to val, {} to train (seed {})",
            v.rule,
            v.val_inputs,
            v.train_inputs,
            v.seed
        );
    }
    if !report.dropped_classes.is_empty() {
        ddl_cli::outln!(
            "dropped {} classes with fewer than {} usable inputs (--min-per-class; listed in \
             the report)",
            report.dropped_classes.len(),
            report.min_per_class
        );
    }
    print_left_out(report, &opts.output);
    ddl_cli::outln!(
        "{} classes, {:.0} images/s on {} threads, {:.1} s; report: {}",
        report.classes,
        report.images_per_s,
        report.threads,
        report.elapsed_s,
        opts.output.join(pack::REPORT_FILE).display()
    );
}

/// The first skipped inputs, the files left in `output`, the files that were not inputs, and
/// the classes not in the list.
fn print_left_out(report: &PackReport, output: &Path) {
    for s in report.skipped.iter().take(SHOWN) {
        ddl_cli::outln!(
            "skipped {} ({}: {})",
            escape_controls(&s.path),
            s.reason,
            escape_controls(&s.detail)
        );
    }
    if report.skipped.len() > SHOWN {
        ddl_cli::outln!(
            "... and {} more skipped inputs",
            report.skipped.len() - SHOWN
        );
    }
    if !report.left_in_place.is_empty() {
        let shown: Vec<std::borrow::Cow<str>> = report
            .left_in_place
            .iter()
            .take(SHOWN)
            .map(|name| escape_controls(name))
            .collect();
        ddl_cli::outln!(
            "left {} file(s) in {} that this pack did not write untouched: {}{}",
            report.left_in_place.len(),
            output.display(),
            shown.join(", "),
            if report.left_in_place.len() > shown.len() {
                ", ..."
            } else {
                ""
            }
        );
    }
    if !report.ignored_files.is_empty() {
        let shown: Vec<String> = report
            .ignored_files
            .iter()
            .take(SHOWN)
            .map(|f| format!("{} ({})", escape_controls(&f.path), f.reason))
            .collect();
        ddl_cli::outln!(
            "ignored {} file(s) that are not inputs: {}{}",
            report.ignored_files.len(),
            shown.join(", "),
            if report.ignored_files.len() > shown.len() {
                ", ... (the report lists all)"
            } else {
                ""
            }
        );
    }
    if !report.ignored_classes.is_empty() {
        // Only --classes leaves classes out this way (empty ones are refused or kept).
        ddl_cli::outln!(
            "ignored {} classes not in --classes ({} files)",
            report.ignored_classes.len(),
            report.ignored_classes.values().sum::<u64>()
        );
    }
}
