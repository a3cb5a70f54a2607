//! `ddl-plan --model M --classes N`: the parameter count, gradient buckets and model-state
//! memory of a ddl-train run, without data or devices, and for a job of `--ranks` x
//! `--replicas` x `--batch` the memory and bytes sent per step data-parallel and with the head
//! split over the replicas (`--head-parallel`), with the crossover global batch (see
//! `ddl_trainer::memory`); with `--exchange Q`, what the record exchange between `--nodes`
//! nodes sends at each epoch boundary (see `ddl_loader::exchange_cost`).

use std::process::ExitCode;

use clap::Parser;
use ddl_loader::exchange_cost::{self, EpochTime};
use ddl_trainer::config::Overlap;
use ddl_trainer::console::eprint_line;
use ddl_trainer::memory::{compare, describe, Job, PlanFor};
use ddl_trainer::table::Layout;
use ddl_trainer_cli::plan::{default_link_bytes_per_s, Args};

fn main() -> ExitCode {
    ddl_cli::init_binary_signals();
    match run(&Args::parse()) {
        Ok(text) => {
            ddl_cli::write_stdout(&text);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprint_line(&format!("ddl-plan: error: {}", ddl_cli::error_chain(&*e)));
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> anyhow::Result<String> {
    let overlap =
        (args.overlap.parse::<Overlap>()).map_err(|m| anyhow::anyhow!("invalid --overlap: {m}"))?;
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
    let exchange = exchange_plan(args)?.unwrap_or_default();
    Ok(plan + &compare(&dp, &hp, job) + &exchange)
}

/// `--exchange Q`: the exchange's table for the flags' records, nodes, link and epochs; `None`
/// without it.
fn exchange_plan(args: &Args) -> anyhow::Result<Option<String>> {
    let link = default_link_bytes_per_s();
    let Some((mut setup, from)) = args.exchange.setup(args.nodes as usize, link)? else {
        return Ok(None);
    };
    setup.epoch_time = match args.epoch_s {
        Some(s) if !(s.is_finite() && s > 0.0) => {
            anyhow::bail!("--epoch-s {s} must be a positive number of seconds")
        }
        Some(seconds) => Some(EpochTime {
            seconds,
            link_spare_s: seconds,
        }),
        None => None,
    };
    Ok(Some(exchange_cost::plan(&setup)?.render(&from)))
}
