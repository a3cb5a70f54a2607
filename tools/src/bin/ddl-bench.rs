//! ddl-bench: allreduce bandwidth table (run under mpirun), cost-model calibration and
//! large-scale simulation.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::LazyLock;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use ddl_cli as cli;
use ddl_comm::cost::PRESETS;
use ddl_comm::World;
use ddl_comm::{Algorithm, CostModel};
use ddl_loader::exchange_args::ExchangeFlags;
use ddl_loader::exchange_cost::{self, EpochTime, ExchangePlan};
use ddl_sim::bucket_schedule::{self, ScheduleSetup};
use ddl_sim::{resnet, StepModel};
use ddl_tools::bench;

/// Benchmark ddl's allreduce algorithms, calibrate their cost model and simulate large jobs.
///
/// `allreduce` and `calibrate` run under mpirun (one process per rank); `predict` and `sim`
/// compute from a cost model, measured by `calibrate` or a preset.
#[derive(Parser)]
#[command(name = "ddl-bench", version, max_term_width = 100)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Allreduce table per algorithm and size, nccl-tests style (run under mpirun).
    Allreduce {
        /// Algorithms, comma-separated; by default those `auto` chooses among.
        #[arg(long, value_name = "LIST", default_value = DEFAULT_ALGOS.as_str(),
              long_help = ALGOS_HELP.as_str(), help_heading = "Benchmark")]
        algos: String,
        /// Element type of the buffers.
        ///
        /// f16 and bf16 are summed in f32 and rounded once.
        #[arg(long, value_enum, default_value_t = bench::Dtype::F32, help_heading = "Benchmark")]
        dtype: bench::Dtype,
        /// Smallest message, at least 4 bytes (one f32).
        ///
        /// Bytes (4096) or with a unit (4KiB): KiB/MiB/GiB and K/M/G are powers of 1024,
        /// KB/MB/GB powers of 1000.
        #[arg(long, value_name = "SIZE", default_value = "4KiB",
              value_parser = bench::parse_message_bytes, help_heading = "Benchmark")]
        min_bytes: usize,
        /// Largest message, at least --min-bytes (units as for --min-bytes).
        #[arg(long, value_name = "SIZE", default_value = "256MiB",
              value_parser = bench::parse_message_bytes, help_heading = "Benchmark")]
        max_bytes: usize,
        /// Size multiplier between rows (at least 2).
        #[arg(long, value_name = "K", default_value_t = 4,
              value_parser = clap::value_parser!(u64).range(2..), help_heading = "Benchmark")]
        step_factor: u64,
        /// Untimed calls per size.
        #[arg(
            long,
            value_name = "N",
            default_value_t = 5,
            help_heading = "Benchmark"
        )]
        warmup: usize,
        /// Timed calls per size from 64 MiB up, more below (at least 1).
        ///
        /// Below 64 MiB, iters x 64 MiB / size calls, at most 10,000; the mean per call of the
        /// slowest rank is reported.
        #[arg(long, value_name = "N", default_value_t = 20,
              value_parser = clap::value_parser!(u64).range(1..), help_heading = "Benchmark")]
        iters: u64,
        /// Operation timeout in seconds (at least 1).
        #[arg(long, value_name = "S", default_value_t = 120,
              value_parser = clap::value_parser!(u64).range(1..), help_heading = "Benchmark")]
        timeout_s: u64,
        /// Cost model for `auto`, from `calibrate`; adds the predicted times.
        ///
        /// Each row gets the predicted time and measured / predicted.
        #[arg(long, value_name = "FILE", help_heading = "Cost model")]
        model_file: Option<PathBuf>,
        /// One JSON object per row instead of the table.
        #[arg(long, help_heading = "Output")]
        json: bool,
    },
    /// Measure the cost model of this layout for `--allreduce auto` (run under mpirun).
    ///
    /// Measures alpha/beta per tier (ping-pong), gamma (f32 add), a beta curve per tier (ring
    /// allreduce times up to --max-bytes) and every algorithm `auto` chooses between (4 KiB x
    /// 4^k up to --max-bytes, taking turns); writes JSON. Run it under the same mpirun layout
    /// as the jobs whose `auto` it should steer.
    Calibrate {
        /// Output file.
        #[arg(short, long, value_name = "FILE", default_value = "model.json")]
        output: PathBuf,
        /// Largest allreduce timed, at least 4 bytes.
        ///
        /// Units as for `allreduce --min-bytes`: KiB/MiB/GiB are powers of 1024, KB/MB/GB
        /// powers of 1000.
        #[arg(long, value_name = "SIZE", default_value = "64MiB",
              value_parser = bench::parse_message_bytes)]
        max_bytes: usize,
        /// Sweeps over all sizes; per size the median.
        ///
        /// Each sweep times the ring curves and every candidate of `auto`.
        #[arg(long, value_name = "N", default_value_t = 5,
              value_parser = clap::value_parser!(u64).range(1..))]
        passes: u64,
        /// Compute threads per rank for the contention measurement (0 skips it).
        ///
        /// Threads standing in for the rank's CPU replicas (ddl-train's --devices cpu:N) while
        /// the contention of compute and allreduce on the same cores is measured, for `sim
        /// --cpu-replicas`.
        #[arg(long, value_name = "N", default_value_t = 1)]
        compute_threads: usize,
    },
    /// Predict one allreduce's time from a cost model.
    ///
    /// Prints a JSON line: algo, resolved = what `auto` would run, bytes, ranks, time_us.
    Predict {
        /// Algorithm (as for `allreduce --algos`).
        #[arg(long, value_name = "NAME", long_help = ALGO_HELP.as_str(), help_heading = "Allreduce")]
        algo: String,
        /// Message size, at least 4 bytes (e.g. 4MiB).
        ///
        /// Units as for `allreduce --min-bytes`: KiB/MiB/GiB are powers of 1024, KB/MB/GB
        /// powers of 1000.
        #[arg(long, value_name = "SIZE", value_parser = bench::parse_message_bytes,
              help_heading = "Allreduce")]
        bytes: usize,
        /// Nodes.
        #[arg(long, value_name = "N", default_value_t = 1,
              value_parser = clap::value_parser!(u64).range(1..), help_heading = "Allreduce")]
        nodes: u64,
        /// Ranks per node.
        #[arg(long, value_name = "N", default_value_t = 1,
              value_parser = clap::value_parser!(u64).range(1..), help_heading = "Allreduce")]
        ranks_per_node: u64,
        #[command(flatten)]
        cost: CostFlags,
    },
    /// Simulate a large job: per-step allreduce time and scaling of each algorithm.
    ///
    /// Predicts per-step allreduce time and scaling efficiency of each algorithm, and the step
    /// of `--overlap backward` under `--comm-order fifo` and `priority`.
    Sim(SimArgs),
}

/// Where `predict` and `sim` take their cost model from.
#[derive(clap::Args)]
#[command(next_help_heading = "Cost model")]
struct CostFlags {
    /// A preset cost model, by name (`--help` lists them).
    #[arg(long, value_name = "NAME", long_help = PRESETS_HELP.as_str(),
          conflicts_with = "model_file")]
    preset: Option<String>,
    /// Cost model measured by `calibrate`.
    #[arg(long, value_name = "FILE")]
    model_file: Option<PathBuf>,
}

/// `ddl-bench sim`'s flags.
#[derive(clap::Args)]
struct SimArgs {
    /// Nodes.
    #[arg(long, value_name = "N", default_value_t = 64, help_heading = "Job")]
    nodes: usize,
    /// GPUs (ranks) per node.
    #[arg(long, value_name = "N", default_value_t = 4, help_heading = "Job")]
    gpus_per_node: usize,
    #[arg(long, value_name = "NAME", default_value = "resnet50", help_heading = "Job",
          help = format!("The network: {}", bench::SIM_MODELS.join(", ")))]
    model: String,
    /// Classes of the model's head (21841 for ImageNet-22k).
    ///
    /// Its parameters: backbone + features x classes + classes.
    #[arg(long, value_name = "N", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(2..), help_heading = "Job")]
    classes: u64,
    /// Images per GPU per step.
    ///
    /// The hybrid rows exchange the features of the global batch.
    #[arg(long, value_name = "N", default_value_t = 32,
          value_parser = clap::value_parser!(u64).range(1..), help_heading = "Job")]
    batch: u64,
    /// Side of the square images, pixels.
    ///
    /// The schedule splits the compute over the stages by their multiply-accumulates at this
    /// size.
    #[arg(long, value_name = "PX", default_value_t = 224,
          value_parser = clap::value_parser!(u32).range(16..), help_heading = "Job")]
    image_size: u32,
    /// Compute time of one training step per GPU, ms.
    ///
    /// By default DDL's 150 ms ResNet-50 step on a P100, scaled by the model's forward cost
    /// with its head.
    #[arg(long, value_name = "MS", help_heading = "Job")]
    step_compute_ms: Option<f64>,
    /// Fraction of the allreduce hidden behind backward compute (0..1).
    #[arg(
        long,
        value_name = "F",
        default_value_t = 0.0,
        help_heading = "Schedule"
    )]
    overlap: f64,
    /// Largest gradient bucket of the schedule, MiB (ddl-train's --bucket-mb).
    #[arg(
        long,
        value_name = "MIB",
        default_value_t = 25.0,
        help_heading = "Schedule"
    )]
    bucket_mb: f64,
    /// The priority order's chunk (ddl-train's --comm-order priority:CHUNK_BYTES).
    ///
    /// Units as for `allreduce --min-bytes`.
    #[arg(long, value_name = "SIZE", default_value = "4MiB",
          value_parser = bench::parse_message_bytes, help_heading = "Schedule")]
    chunk_bytes: usize,
    /// The schedule's allreduce (ddl-train's --allreduce); `auto` picks one per size.
    #[arg(long, value_name = "NAME", default_value = "auto",
          long_help = ALGO_HELP.as_str(), help_heading = "Schedule")]
    allreduce: String,
    /// The replicas compute on the cores that communicate (CPU replicas).
    ///
    /// The schedule slows each by the other as the model file's `contention` says (measured
    /// by `calibrate`). Without it they are separate resources, as with GPUs.
    #[arg(long, help_heading = "Schedule")]
    cpu_replicas: bool,
    #[command(flatten)]
    cost: CostFlags,
    /// JSON lines instead of the table.
    #[arg(long, help_heading = "Output")]
    json: bool,
    #[command(flatten, next_help_heading = "Record exchange")]
    exchange: ExchangeFlags,
}

/// The model from a file, a preset, or the first preset by default.
fn load_model(cost: CostFlags) -> Result<StepModel> {
    Ok(match (cost.preset, cost.model_file) {
        (_, Some(p)) => StepModel::load(&p)?,
        (Some(name), None) => StepModel::separate(CostModel::preset(&name)?),
        (None, None) => StepModel::separate((PRESETS[0].model)()),
    })
}

/// `allreduce --algos`'s default: every algorithm of the registry that `auto` may choose.
static DEFAULT_ALGOS: LazyLock<String> = LazyLock::new(|| {
    let names: Vec<&str> = Algorithm::DECLARED
        .iter()
        .filter(|d| d.auto)
        .map(|d| d.name)
        .collect();
    names.join(",")
});

/// `allreduce --algos`'s long help: the registry's algorithms with their help lines.
static ALGOS_HELP: LazyLock<String> = LazyLock::new(|| {
    format!(
        "Comma-separated algorithms, each as one of:\n{}\nBy default those `auto` chooses \
         among.",
        Algorithm::help()
    )
});

/// `predict --algo` and `sim --allreduce`'s long help: the registry's algorithms.
static ALGO_HELP: LazyLock<String> =
    LazyLock::new(|| format!("The algorithm, as one of:\n{}", Algorithm::help()));

/// `--preset`'s long help: comm's presets with what each models.
static PRESETS_HELP: LazyLock<String> = LazyLock::new(|| {
    let lines: Vec<String> = PRESETS
        .iter()
        .map(|p| format!("  - {}: {}", p.name, p.help))
        .collect();
    format!(
        "A preset cost model, by name, one of:\n{}\n\nWithout it or --model-file: {}.",
        lines.join("\n"),
        PRESETS[0].name
    )
});

/// `--algos`: a comma-separated list of algorithms.
fn parse_algos(list: &str) -> Result<Vec<Algorithm>> {
    Ok(list
        .split(',')
        .map(|a| a.parse::<Algorithm>())
        .collect::<Result<Vec<_>, _>>()?)
}

fn main() -> ExitCode {
    cli::run("ddl-bench", || run(cli::parse()))
}

fn run(cli: Cli) -> Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match cli.cmd {
        Cmd::Allreduce {
            algos,
            dtype,
            min_bytes,
            max_bytes,
            step_factor,
            warmup,
            iters,
            json,
            model_file,
            timeout_s,
        } => {
            let predict = model_file.is_some();
            let opts = bench::AllreduceOpts {
                algos: parse_algos(&algos)?,
                min_bytes,
                max_bytes,
                factor: step_factor as usize,
                warmup,
                iters: iters as usize,
                model: model_file
                    .map_or_else(|| Ok(CostModel::default()), |p| CostModel::load(&p))?,
                predict,
                dtype,
            };
            // Every flag is checked before MPI starts: a refusal is one line per rank.
            opts.validate()?;
            // One thread calls MPI and no other runs: the level of the C loop it is compared with.
            let world = World::init_single_threaded(Duration::from_secs(timeout_s))?;
            if let Err(e) = bench::allreduce(&world, &opts, json, &mut out) {
                abort_with(&world, &e);
            }
        }
        Cmd::Calibrate {
            output,
            max_bytes,
            passes,
            compute_threads,
        } => {
            let world = World::init_single_threaded(bench::DEFAULT_BENCH_TIMEOUT)?;
            let passes = passes as usize;
            match ddl_sim::calibrate::calibrate(&world, max_bytes, passes, compute_threads) {
                Ok(model) => {
                    if world.rank() == 0 {
                        model.save(&output)?;
                        writeln!(out, "{}", serde_json::to_string_pretty(&model)?)?;
                        writeln!(out, "# written to {}", output.display())?;
                    }
                }
                Err(e) => abort_with(&world, &e.into()),
            }
        }
        Cmd::Predict {
            algo,
            bytes,
            nodes,
            ranks_per_node,
            cost,
        } => {
            let cost = load_model(cost)?.cost;
            let algo: Algorithm = algo.parse()?;
            let topo = ddl_comm::Topology::new(nodes as usize, ranks_per_node as usize);
            let t = cost.predict(&algo, bytes, topo);
            let line = serde_json::json!({
                "algo": algo.to_string(),
                "resolved": cost.choose(bytes, topo).to_string(),
                "bytes": bytes,
                "ranks": topo.ranks(),
                "time_us": t * 1e6,
            });
            writeln!(out, "{line}")?;
        }
        Cmd::Sim(args) => sim(args, &mut out)?,
    }
    Ok(())
}

/// `ddl-bench sim`: the algorithms' table, then the schedule's.
fn sim(args: SimArgs, out: &mut dyn Write) -> Result<()> {
    let SimArgs {
        nodes,
        gpus_per_node,
        model,
        classes,
        step_compute_ms,
        batch,
        cost,
        overlap,
        image_size,
        bucket_mb,
        chunk_bytes,
        allreduce,
        cpu_replicas,
        json,
        exchange,
    } = args;
    let algorithm: Algorithm = allreduce
        .parse()
        .with_context(|| format!("--allreduce {allreduce:?}"))?;
    let bench::Backbone {
        params: backbone,
        features,
        ..
    } = bench::backbone(&model).with_context(|| {
        format!(
            "--model {model:?} is not one of {}",
            bench::SIM_MODELS.join(", ")
        )
    })?;
    let step_compute_ms = step_compute_ms
        .or_else(|| bench::default_step_compute_ms(&model, classes))
        .expect("a known model has a default step time");
    let shape = bench::SimModel {
        backbone,
        features,
        classes,
        batch: batch as usize,
    };
    if nodes == 0 || gpus_per_node == 0 || step_compute_ms.is_nan() || step_compute_ms <= 0.0 {
        bail!("--nodes, --gpus-per-node and --step-compute-ms must be positive");
    }
    if !(0.0..=1.0).contains(&overlap) {
        bail!("--overlap {overlap} is outside 0..=1 (a fraction of the allreduce)");
    }
    if !(bucket_mb.is_finite() && bucket_mb > 0.0) {
        bail!("--bucket-mb {bucket_mb} is not a positive number of MiB");
    }
    let StepModel { cost, contention } = load_model(cost)?;
    if cpu_replicas && !contention.measured() {
        bail!(
            "--cpu-replicas needs the contention measured by `ddl-bench calibrate` (--model-file \
             of a calibration with --compute-threads 1 or more); this model has none ({})",
            cost.source
        );
    }
    let rows = bench::simulate(&cost, nodes, gpus_per_node, shape, step_compute_ms, overlap);
    let stages =
        resnet::stages(&model, classes, image_size).expect("every model sim knows has its stages");
    let schedule_setup = ScheduleSetup {
        stages: &stages,
        compute_ms: step_compute_ms,
        bucket_bytes: (bucket_mb * (1u64 << 20) as f64) as usize,
        chunk_bytes,
        topo: ddl_comm::Topology::new(nodes, gpus_per_node),
        contention: if cpu_replicas {
            contention
        } else {
            ddl_sim::Contention::SEPARATE
        },
        algorithm: &algorithm,
    };
    let schedule = bucket_schedule::simulate_schedule(&cost, &schedule_setup);
    let fifo = &schedule[0];
    let step = (fifo.step_ms / 1e3, fifo.allreduce_ms / 1e3);
    let images_per_step = nodes * gpus_per_node * batch as usize;
    let exchange = exchange_plan(&exchange, &cost, nodes, images_per_step, step)?;
    if json {
        for r in &rows {
            writeln!(out, "{}", serde_json::to_string(r)?)?;
        }
        for r in &schedule {
            writeln!(out, "{}", serde_json::to_string(r)?)?;
        }
        if let Some((plan, _)) = &exchange {
            for b in &plan.boundaries {
                writeln!(out, "{}", serde_json::to_string(b)?)?;
            }
        }
    } else {
        let setup = bench::SimSetup {
            nodes,
            gpus: gpus_per_node,
            model: &model,
            shape,
            overlap,
        };
        bench::print_sim(out, &rows, &setup, &cost)?;
        bucket_schedule::print_schedule(out, &schedule, &schedule_setup, image_size)?;
        if let Some((plan, from)) = &exchange {
            write!(out, "{}", plan.render(from))?;
        }
    }
    Ok(())
}

/// `sim --exchange Q`: the exchange of the flags' records between `nodes` nodes (over the cost
/// model's link unless `--link-gbps`), an epoch being the steps that `images_per_step` images
/// per step take of the records, each `(seconds, seconds of allreduce)` long (`step`: the
/// schedule's `fifo` row). Returns the plan and where its records came from; `None` without
/// `--exchange`.
fn exchange_plan(
    flags: &ExchangeFlags,
    cost: &CostModel,
    nodes: usize,
    images_per_step: usize,
    step: (f64, f64),
) -> Result<Option<(ExchangePlan, String)>> {
    let Some((mut setup, from)) = flags.setup(nodes, 1.0 / cost.inter.beta)? else {
        return Ok(None);
    };
    let steps = (setup.records.total() / images_per_step as u64) as f64;
    let (step_s, allreduce_s) = step;
    setup.epoch_time = Some(EpochTime {
        seconds: steps * step_s,
        link_spare_s: steps * (step_s - allreduce_s).max(0.0),
    });
    Ok(Some((exchange_cost::plan(&setup)?, from)))
}

/// Reports `e` for this rank in one write (so that the lines of several ranks do not
/// interleave mid-line) and aborts the job.
fn abort_with(world: &World, e: &anyhow::Error) -> ! {
    cli::write_stderr(&cli::error_line("ddl-bench", e));
    world.abort(1)
}
