//! `ddl-synth OUT --classes N --per-class M --val-per-class K [--seed S]`: writes a small
//! ImageNet-style tree of real JPEGs (see `ddl_tools::synth`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Result;
use clap::Parser;
use ddl_tools::cli;
use ddl_tools::synth::{generate, SynthConfig};

/// Write a small ImageNet-style tree of real, class-dependent JPEGs.
#[derive(Parser, Debug)]
#[command(name = "ddl-synth", version)]
struct Args {
    /// Output directory (train/, val/, LOC_val_solution.csv).
    out: PathBuf,
    /// Number of classes.
    #[arg(long, default_value_t = 10)]
    classes: usize,
    /// Training images per class.
    #[arg(long, default_value_t = 100)]
    per_class: usize,
    /// Validation images per class.
    #[arg(long, default_value_t = 20)]
    val_per_class: usize,
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
    let cfg = SynthConfig {
        classes: args.classes,
        per_class: args.per_class,
        val_per_class: args.val_per_class,
        seed: args.seed,
        min_side: args.min_side,
        max_side: args.max_side,
    };
    let start = Instant::now();
    let summary = generate(&args.out, &cfg)?;
    cli::stderr_line(&format!(
        "ddl-synth: {} train + {} val JPEGs, {:.1} MiB, in {} ({:.1} s)",
        summary.train_images,
        summary.val_images,
        summary.bytes as f64 / (1 << 20) as f64,
        args.out.display(),
        start.elapsed().as_secs_f64()
    ));
    Ok(())
}
