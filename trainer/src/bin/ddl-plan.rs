//! `ddl-plan --model M --classes N`: the parameter count, gradient buckets and model-state
//! memory of a ddl-train run, without data or devices, and for a job of `--ranks` x
//! `--replicas` x `--batch` the memory and bytes sent per step data-parallel and with the head
//! split over the replicas (`--head-parallel`), with the crossover global batch (see
//! `ddl_trainer::memory`).

use std::process::ExitCode;

use clap::Parser;
use ddl_trainer::config::Overlap;
use ddl_trainer::console::eprint_line;
use ddl_trainer::memory::{compare, describe, Job, PlanFor};
use ddl_trainer::model::ModelKind;
use ddl_trainer::table::Layout;

#[path = "../cli/flags.rs"]
mod flags;

/// Print the parameter count, the gradient bucket plan and the model-state memory ddl-train
/// would have for a model and class count.
#[derive(Parser, Debug)]
#[command(name = "ddl-plan", version, about)]
struct Args {
    /// The network (as ddl-train's --model).
    #[arg(long, value_enum, default_value_t = ModelKind::Resnet50)]
    model: ModelKind,
    /// Output classes (21841 for the whole of ImageNet-22k).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(i64).range(2..))]
    classes: i64,
    /// Input side in pixels (only resnet_small's stem depends on it).
    #[arg(long, default_value_t = 224)]
    image_size: u32,
    /// backward | pipeline | off (as ddl-train's --overlap; auto picks backward on GPUs and
    /// across nodes).
    #[arg(long, default_value = "backward", value_parser = ["backward", "pipeline", "off"])]
    overlap: String,
    /// Gradient bucket size in MiB (as ddl-train's --bucket-mb).
    #[arg(long, default_value_t = 25.0)]
    bucket_mb: f64,
    /// Replicas per rank (for the per-rank memory of CPU replicas).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    replicas: u64,
    /// Ranks of the job (for the bytes sent per step).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    ranks: u64,
    /// Images per replica per step (as ddl-train's --batch; global batch = this x replicas x
    /// ranks).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..))]
    batch: u64,
    /// List the buckets of a run with the head split over the replicas (the comparison of the
    /// two modes is printed either way).
    #[arg(long)]
    head_parallel: bool,
}

fn main() -> ExitCode {
    ddl_comm::cli::init_binary_signals();
    flags::install();
    match run(&Args::parse()) {
        Ok(text) => {
            ddl_comm::cli::write_stdout(&text);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprint_line(&format!(
                "ddl-plan: error: {}",
                ddl_comm::cli::error_chain(&*e)
            ));
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> anyhow::Result<String> {
    let overlap: Overlap = args.overlap.parse()?;
    if !(args.bucket_mb.is_finite() && args.bucket_mb > 0.0) {
        anyhow::bail!(
            "--bucket-mb {} must be a positive size in MiB",
            args.bucket_mb
        );
    }
    let bucket_bytes = (args.bucket_mb * 1024.0 * 1024.0) as usize;
    let layout = |head_parallel| {
        Layout::of_model(
            args.model,
            args.classes,
            args.image_size,
            overlap,
            bucket_bytes,
            head_parallel,
        )
    };
    let (dp, hp) = (layout(false), layout(true));
    let replicas = (args.ranks * args.replicas) as i64;
    if replicas > args.classes {
        anyhow::bail!(
            "--ranks {} x --replicas {} replicas would split {} classes with some left without one",
            args.ranks,
            args.replicas,
            args.classes
        );
    }
    let plan = describe(
        if args.head_parallel { &hp } else { &dp },
        &PlanFor {
            model: args.model.name(),
            classes: args.classes,
            overlap,
            bucket_bytes,
            replicas: args.replicas as usize,
        },
    );
    let job = Job {
        ranks: args.ranks as usize,
        replicas: args.replicas as usize,
        batch: args.batch as usize,
    };
    Ok(plan + &compare(&dp, &hp, job))
}
