//! `ddl-synth OUT [--layout tree|tars] --classes N --per-class M --val-per-class K [--seed S]`:
//! writes a small ImageNet-style tree, or ImageNet-22k-style per-synset tars, of real JPEGs
//! (see `ddl_tools::synth`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Parser;
use ddl_cli as cli;
use ddl_tools::synth::{generate, Layout, SynthConfig};

/// Write a small ImageNet-style tree (or ImageNet-22k-style tars) of real, class-dependent
/// JPEGs.
#[derive(Parser, Debug)]
#[command(name = "ddl-synth", version)]
struct Args {
    /// Output directory (tree: train/, val/, LOC_val_solution.csv; tars: WNID.tar files).
    out: PathBuf,
    /// tree: ILSVRC-2012 folders with a flat val/; tars: one WNID.tar per class (uneven class
    /// sizes, a few odd members, no val split), like ImageNet-22k.
    #[arg(long, value_enum, default_value_t = Layout::Tree)]
    layout: Layout,
    /// Number of classes.
    #[arg(long, default_value_t = 10)]
    classes: usize,
    /// Training images per class (tars: the mean).
    #[arg(long, default_value_t = 100)]
    per_class: usize,
    /// Validation images per class (tree only; default 20).
    #[arg(long)]
    val_per_class: Option<usize>,
    /// Seed: the same seed writes byte-identical files.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Smallest image side in pixels.
    #[arg(long, default_value_t = 200)]
    min_side: usize,
    /// Largest image side in pixels.
    #[arg(long, default_value_t = 500)]
    max_side: usize,
}

fn main() -> ExitCode {
    cli::run("ddl-synth", || run(cli::parse()))
}

fn run(args: Args) -> Result<()> {
    if args.layout == Layout::Tars && args.val_per_class.is_some() {
        bail!(
            "--val-per-class: --layout tars writes no val split (ImageNet-22k has none); \
             ddl-pack --val-fraction or --val-per-class holds one out"
        );
    }
    let cfg = SynthConfig {
        layout: args.layout,
        classes: args.classes,
        per_class: args.per_class,
        val_per_class: args.val_per_class.unwrap_or(20),
        seed: args.seed,
        min_side: args.min_side,
        max_side: args.max_side,
    };
    let start = Instant::now();
    let summary = generate(&args.out, &cfg)?;
    cli::stderr_line(&format!(
        "ddl-synth: {} train + {} val JPEGs and {} odd files, {:.1} MiB, in {} ({:.1} s)",
        summary.train_images,
        summary.val_images,
        summary.odd_files,
        ddl_loader::units::mib(summary.bytes),
        args.out.display(),
        start.elapsed().as_secs_f64()
    ));
    if let Some(note) = summary
        .damaged
        .and_then(|(name, inputs)| damaged_note(&name, inputs))
    {
        cli::stderr_line(&note);
    }
    Ok(())
}

/// What packing a tree with a cut-short member needs, when ddl-pack's default skip limit
/// (one input in 1,000) would refuse it.
fn damaged_note(name: &str, inputs: usize) -> Option<String> {
    const DEFAULT_MAX_SKIP: f64 = ddl_loader::pack::DEFAULT_MAX_SKIP_FRACTION;
    let share = 1.0 / inputs as f64;
    if share <= DEFAULT_MAX_SKIP {
        return None;
    }
    let enough = [0.01, 0.1, 1.0]
        .into_iter()
        .find(|&f| f >= share)
        .unwrap_or(1.0);
    Some(format!(
        "ddl-synth: {name} is cut short on purpose, as real synset tars hold a damaged member \
         now and then: ddl-pack skips it, 1 of {inputs} inputs, more than its default \
         --max-skip-fraction of {DEFAULT_MAX_SKIP} allows; pack this tree with \
         --max-skip-fraction {enough}"
    ))
}
