//! `ddl-plan --model M --classes N`: the parameter count, gradient buckets and model-state
//! memory of a ddl-train run, without data or devices, and for a job of `--ranks` x
//! `--replicas` x `--batch` the memory and bytes sent per step data-parallel and with the head
//! split over the replicas (`--head-parallel`), with the crossover global batch (see
//! `ddl_trainer::memory`); with `--exchange Q`, what the record exchange between `--nodes`
//! nodes sends at each epoch boundary (see `ddl_loader::exchange_cost`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use ddl_comm::CostModel;
use ddl_loader::exchange_cost::{self, EpochTime, ExchangeSetup, SplitRecords};
use ddl_loader::units::parse_size;
use ddl_trainer::config::{Overlap, TrainConfig};
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
    /// Fraction of every node's records exchanged at each epoch boundary (as ddl-train's
    /// --exchange, 0 to 1): adds the records and bytes the exchange sends between the nodes.
    #[arg(long, value_name = "Q")]
    exchange: Option<f64>,
    /// Nodes of the job, between which --exchange moves records.
    #[arg(long, default_value_t = 1, requires = "exchange",
          value_parser = clap::value_parser!(u64).range(1..))]
    nodes: u64,
    /// Packed dataset whose train split --exchange is counted on (its manifest.json: the
    /// records of each shard and their average size).
    #[arg(long, value_name = "DIR", requires = "exchange")]
    data: Option<PathBuf>,
    /// Records of the train split, without --data: the exchange is then the expected one.
    #[arg(long, requires = "exchange", conflicts_with = "data",
          value_parser = clap::value_parser!(u64).range(1..))]
    records: Option<u64>,
    /// Average bytes of a record, without --data (e.g. 110KB; KiB/MiB and K/M are powers of
    /// 1024, KB/MB powers of 1000).
    #[arg(long, value_name = "SIZE", requires = "exchange", conflicts_with = "data",
          value_parser = parse_size)]
    record_bytes: Option<u64>,
    /// Each node's link, Gbit/s each way (default: InfiniBand EDR, as ddl-bench's minsky
    /// preset has it).
    #[arg(long, default_value_t = default_link_gbps(), requires = "exchange")]
    link_gbps: f64,
    /// Epochs of the run (as ddl-train's --epochs): the boundaries into epochs 1 to N - 1.
    #[arg(long, default_value_t = TrainConfig::default().epochs, requires = "exchange",
          value_parser = clap::value_parser!(u32).range(1..))]
    epochs: u32,
    /// Seed of the placement (as ddl-train's --seed).
    #[arg(long, default_value_t = TrainConfig::default().seed, requires = "exchange")]
    seed: u64,
    /// Seconds of one epoch, when known: says whether each boundary's exchange fits in the
    /// epoch before it (the allreduce's use of the links not counted).
    #[arg(long, value_name = "SECONDS", requires = "exchange")]
    epoch_s: Option<f64>,
}

/// The inter-node link of ddl-bench's `minsky` cost model, in Gbit/s.
fn default_link_gbps() -> f64 {
    8.0 / CostModel::minsky().inter.beta / 1e9
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
