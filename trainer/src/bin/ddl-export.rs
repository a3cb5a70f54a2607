//! `ddl-export CHECKPOINT -o FILE.safetensors`: the model of a ddl-train checkpoint as a
//! torchvision-compatible safetensors file (see `ddl_trainer::export`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use ddl_trainer::console::eprint_line;
use ddl_trainer::export::export_checkpoint;

#[path = "../cli/flags.rs"]
mod flags;

/// Write the model of a ddl-train checkpoint as FILE.safetensors, with torchvision's keys,
/// shapes and dtypes and ddl's metadata (classes, eval transform, flags, val top-1/top-5).
#[derive(Parser, Debug)]
#[command(name = "ddl-export", version, about)]
struct Args {
    /// A checkpoint file (ckpt-*.ddlck), or a checkpoint directory (its newest intact one).
    checkpoint: PathBuf,
    /// The .safetensors file to write.
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
    /// Shards whose manifest names the classes, for a checkpoint that predates class names
    /// (default: the --data of the run that wrote it).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Only errors.
    #[arg(long)]
    quiet: bool,
}

fn main() -> ExitCode {
    ddl_comm::cli::init_binary_signals();
    flags::install();
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprint_line(&format!(
                "ddl-export: error: {}",
                ddl_comm::cli::error_chain(&*e)
            ));
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> anyhow::Result<()> {
    let out = export_checkpoint(&args.checkpoint, &args.output, args.data.as_deref())?;
    if !args.quiet {
        let m = &out.meta;
        let pct = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.2}%", v * 100.0));
        ddl_comm::outln!(
            "ddl-export: {} -> {} ({}, {} classes, global step {}, {} tensors, val top-1 {} top-5 {})",
            out.checkpoint.display(),
            args.output.display(),
            m.model,
            m.classes.len(),
            m.global_step.unwrap_or(0),
            out.tensors,
            pct(m.val_top1),
            pct(m.val_top5),
        );
    }
    Ok(())
}
