//! `ddl-prof SHARDS_DIR [--split train] [--threads 1,2,4] [--batch 256] [--image-size 224]
//! [--seconds 10] [--stage-seconds 2] [--eval] [--cold] [--json FILE] [--plot FILE.svg|.png]
//! [--trace FILE.json] [--gpu-rate 1200] [--node N --nodes P] [--on-bad-record replace]`: how
//! fast can this node feed its GPUs? Measures every input stage alone and the whole pipeline
//! for each thread count, then prints a verdict (see `ddl_tools::prof`). Every flag is checked
//! before anything is measured.
//!
//! `ddl-prof plot METRICS.jsonl -o curves.svg`: training curves from ddl-train's metrics file.
//!
//! Under `mpirun` (detected from the launcher's environment) every rank profiles its own
//! shards (node = rank, nodes = size) and rank 0 prints the per-node table and the slowest
//! node; `--json` then holds `{"schema_version": 1, "nodes": [report, ...]}` and every rank
//! other than 0 writes its trace to `FILE.rankN.json`.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use ddl_cli as cli;
use ddl_comm::World;
use ddl_comm::{collective, Transport};
use ddl_loader::dataset::Residency;
use ddl_loader::pipeline::OnBadRecord;
use ddl_tools::prof::{self, ProfConfig, Report};

/// Measure how fast this node feeds its GPUs: every input stage alone and the whole pipeline.
#[derive(Parser, Debug)]
#[command(
    name = "ddl-prof",
    version,
    after_help = "Also: ddl-prof plot METRICS.jsonl -o curves.svg",
    max_term_width = 100
)]
struct Args {
    /// Directory with manifest.json and the shards (ddl-pack's output).
    shards_dir: PathBuf,
    /// Split to profile.
    #[arg(
        long,
        value_name = "SPLIT",
        default_value = "train",
        help_heading = "Measurement"
    )]
    split: String,
    /// Comma-separated thread counts (default: 1, 2, 4, ... up to the cores).
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..), help_heading = "Measurement")]
    threads: Option<Vec<u64>>,
    /// Images per batch.
    #[arg(long, value_name = "N", default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..), help_heading = "Measurement")]
    batch: u64,
    /// Output side in pixels (at least 16, like ddl-train's --image-size).
    #[arg(long, value_name = "PX", default_value_t = 224,
          value_parser = clap::value_parser!(u32).range(i64::from(ddl_loader::limits::MIN_IMAGE_SIZE)..), help_heading = "Measurement")]
    image_size: u32,
    /// Seconds of each end-to-end measurement.
    #[arg(long, value_name = "S", default_value_t = 10.0, value_parser = positive_seconds, help_heading = "Measurement")]
    seconds: f64,
    /// Seconds of each stage measurement (default: seconds / 5, at least 0.5).
    #[arg(long, value_name = "S", value_parser = positive_seconds, help_heading = "Measurement")]
    stage_seconds: Option<f64>,
    /// Eval transform (resize + center crop) instead of random-resized crop + flip.
    #[arg(long, help_heading = "Measurement")]
    eval: bool,
    /// Read from storage, not from the page cache.
    ///
    /// Drops this node's shards from the page cache (posix_fadvise DONTNEED) before the read
    /// measurements and end-to-end runs.
    #[arg(long, help_heading = "Measurement")]
    cold: bool,
    /// Write every figure, with units, as JSON.
    #[arg(long, value_name = "FILE", help_heading = "Output")]
    json: Option<PathBuf>,
    /// Draw images/s against threads per stage (.svg or .png).
    #[arg(long, value_name = "FILE", help_heading = "Output")]
    plot: Option<PathBuf>,
    /// Write a Chrome trace (Perfetto, chrome://tracing) of the run.
    #[arg(long, value_name = "FILE", help_heading = "Output")]
    trace: Option<PathBuf>,
    /// Images/s one GPU consumes.
    #[arg(long, value_name = "RATE", default_value_t = 1200.0, value_parser = positive_rate, help_heading = "Measurement")]
    gpu_rate: f64,
    /// This node's index (ignored under mpirun: the rank).
    #[arg(long, value_name = "I", default_value_t = 0, help_heading = "Nodes")]
    node: usize,
    /// Number of nodes the shards are spread over (ignored under mpirun: the size).
    #[arg(long, value_name = "P", default_value_t = 1, help_heading = "Nodes")]
    nodes: usize,
    /// Seed of the record order, crops and flips.
    #[arg(
        long,
        value_name = "SEED",
        default_value_t = 0,
        help_heading = "Measurement"
    )]
    seed: u64,
    /// Queue depth of the pipeline (at least 1).
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..), help_heading = "Measurement")]
    prefetch: u64,
    /// Records copied to RAM for the decode, resize and normalize stages.
    #[arg(long, value_name = "N", default_value_t = 2048, value_parser = clap::value_parser!(u64).range(1..), help_heading = "Measurement")]
    sample_records: u64,
    /// What to do with a record whose checksum or decoding fails (as in ddl-train).
    ///
    /// Every bad record met is reported (count, then the first few with shard file and
    /// record).
    #[arg(long, value_name = "RULE", value_enum, default_value_t = OnBadRecord::Replace, help_heading = "Measurement")]
    on_bad_record: OnBadRecord,
    /// Do not print per-measurement progress.
    #[arg(long, short, help_heading = "Output")]
    quiet: bool,
}

/// `ddl-prof plot METRICS.jsonl -o curves.svg`.
#[derive(Parser, Debug)]
#[command(name = "ddl-prof plot")]
struct PlotArgs {
    /// ddl-train's metrics file (JSON lines).
    metrics: PathBuf,
    /// Output image (.svg or .png).
    #[arg(short, long, default_value = "curves.svg")]
    output: PathBuf,
}

fn main() -> ExitCode {
    cli::run("ddl-prof", || {
        let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
        if argv.get(1).is_some_and(|a| a == "plot") {
            return plot(cli::parse_from(argv.iter().skip(1)));
        }
        run(cli::parse())
    })
}

/// `ddl-prof plot`.
fn plot(args: PlotArgs) -> Result<()> {
    prof::check_plot_path(&args.output)?;
    let m = prof::plot_metrics(&args.metrics, &args.output)?;
    cli::stderr_line(&format!(
        "ddl-prof plot: {} step and {} epoch points -> {}",
        m.loss.len(),
        m.epoch_loss.len(),
        args.output.display()
    ));
    if !m.forward_wait_ms.is_empty() {
        let mut waits: Vec<f64> = m.forward_wait_ms.iter().map(|&(_, w)| w).collect();
        let median = ddl_comm::calibrate::median(&mut waits);
        cli::stderr_line(&format!(
            "ddl-prof plot: forward waited for communication {median:.1} ms per step (median of {} steps; max {:.1} ms)",
            waits.len(),
            waits.last().copied().unwrap_or(0.0)
        ));
    }
    Ok(())
}

/// A duration flag: a finite number of seconds above zero.
fn positive_seconds(s: &str) -> std::result::Result<f64, String> {
    positive(s, "seconds")
}

/// A rate flag: a finite number of images/s above zero.
fn positive_rate(s: &str) -> std::result::Result<f64, String> {
    positive(s, "images/s")
}

fn positive(s: &str, unit: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a positive number of {unit}")),
    }
}

/// Checks that the directory an output file goes to exists, so that a run is not lost at
/// its end.
fn check_output_dir(flag: &str, path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        bail!(
            "{flag} {}: directory {} does not exist; create it first",
            path.display(),
            dir.display()
        );
    }
    Ok(())
}

/// The one place where the flags become the profile's settings, checked before anything is
/// opened or measured (output directories included, so that a run is not lost at its end).
fn from_cli(args: &Args, under_mpi: bool) -> Result<ProfConfig> {
    let mut cfg = ProfConfig::new(&args.shards_dir);
    cfg.split = args.split.clone();
    if let Some(t) = &args.threads {
        cfg.threads = t.iter().map(|&t| t as usize).collect();
    }
    cfg.batch = args.batch as usize;
    cfg.image_size = args.image_size;
    cfg.seconds = args.seconds;
    cfg.stage_seconds = args.stage_seconds.unwrap_or((args.seconds / 5.0).max(0.5));
    cfg.eval = args.eval;
    cfg.cold = args.cold;
    cfg.gpu_rate = args.gpu_rate;
    cfg.seed = args.seed;
    cfg.prefetch = args.prefetch as usize;
    cfg.sample_records = args.sample_records as usize;
    cfg.on_bad_record = args.on_bad_record;
    // Under mpirun the rank and size replace --node and --nodes (set once MPI is up).
    cfg.residency = if under_mpi {
        Residency { node: 0, nodes: 1 }
    } else {
        Residency {
            node: args.node,
            nodes: args.nodes,
        }
    };
    cfg.validate()?;
    if let Some(p) = &args.plot {
        prof::check_plot_path(p)?;
        check_output_dir("--plot", p)?;
    }
    if let Some(p) = &args.json {
        check_output_dir("--json", p)?;
    }
    if let Some(p) = &args.trace {
        check_output_dir("--trace", p)?;
    }
    Ok(cfg)
}

/// Warnings (a bad record met by the pipeline) go to stderr, coloured only on a terminal;
/// RUST_LOG selects more.
fn init_logging() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
}

/// Under an MPI launcher: starts MPI and makes this rank's node the profiled one.
fn join_world(cfg: &mut ProfConfig) -> Result<World> {
    // Rank 0 waits for the others' reports: allow for the whole profile.
    let per_t = 8.0 * cfg.stage_seconds + cfg.seconds + 30.0;
    let timeout = Duration::from_secs_f64(per_t * cfg.threads.len() as f64 * 3.0 + 600.0);
    let w = World::init_with_timeout(timeout).context("MPI initialisation")?;
    cfg.residency = Residency {
        node: w.rank(),
        nodes: w.size(),
    };
    Ok(w)
}

fn run(args: Args) -> Result<()> {
    let under_mpi = cli::under_launcher();
    let mut cfg = from_cli(&args, under_mpi)?;
    init_logging();
    let world = if under_mpi {
        Some(join_world(&mut cfg)?)
    } else {
        None
    };
    let rank = world.as_ref().map_or(0, World::rank);
    if args.trace.is_some() {
        ddl_trace::set_pid(rank as u32);
        ddl_trace::set_thread_name("main");
        ddl_trace::enable();
    }
    let quiet = args.quiet || rank != 0;
    let report = prof::profile(&cfg, |line| {
        if !quiet {
            cli::stderr_line(line);
        }
    })?;
    if let Some(path) = &args.trace {
        let path = ddl_trace::rank_path(path, rank);
        let n = ddl_trace::write(&path)?;
        if rank == 0 {
            cli::stderr_line(&format!("trace: {n} spans -> {}", path.display()));
        }
    }
    let reports = match &world {
        Some(w) if w.size() > 1 => gather(w.transport().as_ref(), &report)?,
        _ => vec![report],
    };
    if rank == 0 {
        print_and_write(&args, &reports)?;
    }
    Ok(())
}

/// Rank 0's output: the table (and one row per node), `--json` and `--plot`.
fn print_and_write(args: &Args, reports: &[Report]) -> Result<()> {
    let report = &reports[0];
    cli::write_stdout(&prof::render_table(report));
    if reports.len() > 1 {
        ddl_cli::outln!();
        cli::write_stdout(&prof::render_nodes(reports));
    }
    if let Some(path) = &args.json {
        let text = if reports.len() > 1 {
            serde_json::to_string_pretty(&serde_json::json!({
                "schema_version": prof::SCHEMA_VERSION,
                "nodes": reports,
            }))?
        } else {
            serde_json::to_string_pretty(report)?
        };
        std::fs::write(path, text + "\n").with_context(|| format!("write {}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        prof::plot_scaling(report, path)?;
    }
    Ok(())
}

/// Sends every rank's report to rank 0; rank 0 returns all of them in rank order, the other
/// ranks only their own.
fn gather(t: &dyn Transport, mine: &Report) -> Result<Vec<Report>> {
    let Some(all) = collective::gather_bytes(t, serde_json::to_vec(mine)?)? else {
        return Ok(vec![mine.clone()]);
    };
    let others = all.iter().enumerate().skip(1).map(|(rank, body)| {
        serde_json::from_slice(body).with_context(|| format!("report of rank {rank}"))
    });
    std::iter::once(Ok(mine.clone())).chain(others).collect()
}
