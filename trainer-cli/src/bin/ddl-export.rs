//! `ddl-export CHECKPOINT -o FILE.safetensors`: the model of a ddl-train checkpoint as a
//! torchvision-compatible safetensors file (see `ddl_trainer::export`).

use std::process::ExitCode;

use clap::Parser;
use ddl_trainer::console::eprint_line;
use ddl_trainer::export::export_checkpoint;
use ddl_trainer_cli::export::Args;

fn main() -> ExitCode {
    ddl_cli::init_binary_signals();
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprint_line(&format!("ddl-export: error: {}", ddl_cli::error_chain(&*e)));
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> anyhow::Result<()> {
    let out = export_checkpoint(&args.checkpoint, &args.output, args.data.as_deref())?;
    if !args.quiet {
        let m = &out.meta;
        let pct = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.2}%", v * 100.0));
        ddl_cli::outln!(
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
