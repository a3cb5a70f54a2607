//! `ddl-plan --model M --classes N`: the parameter count, gradient buckets and model-state
//! memory of a ddl-train run, without data or devices, and for a job of `--ranks` x
//! `--replicas` x `--batch` the memory and bytes sent per step data-parallel and with the head
//! split over the replicas (`--head-parallel`), with the crossover global batch (see
//! `ddl_trainer::memory`); with `--exchange Q`, what the record exchange between `--nodes`
//! nodes sends at each epoch boundary (see `ddl_loader::exchange_cost`).

use std::process::ExitCode;

use clap::Parser;
use ddl_loader::exchange_cost::{self, EpochTime, ExchangeSetup, SplitRecords};
use ddl_trainer::config::Overlap;
use ddl_trainer::console::eprint_line;
use ddl_trainer::memory::{compare, describe, Job, PlanFor};
use ddl_trainer::table::Layout;
use ddl_trainer_cli::plan::Args;

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
    let exchange = match args.exchange {
        Some(q) => exchange_plan(args, q)?,
        None => String::new(),
    };
    Ok(plan + &compare(&dp, &hp, job) + &exchange)
}

/// `--exchange Q`: the exchange's table for the flags' records, nodes, link and epochs.
fn exchange_plan(args: &Args, fraction: f64) -> anyhow::Result<String> {
    if !(0.0..=1.0).contains(&fraction) {
        anyhow::bail!("--exchange {fraction} is outside 0..=1 (a fraction of each node's records)");
    }
    if !(args.link_gbps.is_finite() && args.link_gbps > 0.0) {
        anyhow::bail!("--link-gbps {} must be a positive speed", args.link_gbps);
    }
    let epoch_time = match args.epoch_s {
        Some(s) if !(s.is_finite() && s > 0.0) => {
            anyhow::bail!("--epoch-s {s} must be a positive number of seconds")
        }
        Some(seconds) => Some(EpochTime {
            seconds,
            link_spare_s: seconds,
        }),
        None => None,
    };
    let (records, record_bytes, from) = match (&args.data, args.records, args.record_bytes) {
        (Some(dir), _, _) => {
            let (records, bytes) = SplitRecords::of_manifest(dir, "train")?;
            (records, bytes, format!("{}, train", dir.display()))
        }
        (None, Some(n), Some(b)) => (
            SplitRecords::Total(n),
            b as f64,
            "--records, --record-bytes".into(),
        ),
        _ => anyhow::bail!("--exchange needs --data DIR, or --records and --record-bytes"),
    };
    let setup = ExchangeSetup {
        fraction,
        nodes: args.nodes as usize,
        records,
        record_bytes,
        seed: args.seed,
        link_bytes_per_s: args.link_gbps * 1e9 / 8.0,
        epochs: u64::from(args.epochs),
        epoch_time,
    };
    Ok(exchange_cost::plan(&setup)?.render(&from))
}
