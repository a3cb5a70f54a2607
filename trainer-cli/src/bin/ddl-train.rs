//! `ddl-train`: data-parallel training of an image classifier on packed shards.
//!
//! Runs as one process per node (or per GPU) under `mpirun`/`srun`, or alone (one rank,
//! without MPI).
//!
//! Its flags, lowered from the table of settings, and their conversion into a `TrainConfig` are
//! `ddl_trainer_cli::train`.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use ddl_comm::Transport;
use ddl_trainer::console::eprint_line;
use ddl_trainer::job::Job;
use ddl_trainer::signal::StopRequest;
use ddl_trainer::slurm::{self, MpirunKill};
use ddl_trainer::{TrainError, TrainSummary};
use ddl_trainer_cli::train::{command, Args};

fn main() -> anyhow::Result<()> {
    ddl_cli::init_binary_signals();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let Args {
        config: mut cfg,
        trace,
    } = Args::from_matches(&command().get_matches())?;
    // Before any thread starts: SIGTERM/SIGINT ask for a stop after the current step; a SIGBUS
    // in a shard mapping names the shard.
    let stop = StopRequest::install().context("installing the SIGTERM/SIGINT handlers")?;
    ddl_loader::fault::report_sigbus().context("installing the SIGBUS report")?;
    // Before MPI starts: whether Open MPI's launcher started this process.
    let mpirun = MpirunKill::from_env();
    let job = Job::start().context("starting the job")?;
    let transport: Arc<dyn Transport> = job.transport();
    let rank = transport.rank();
    let slurm = job.slurm().context("asking Slurm about the job")?;
    let asked = Instant::now();
    if trace.is_some() {
        ddl_trace::set_pid(rank as u32);
        ddl_trace::set_thread_name("main");
        ddl_trace::enable();
    }
    cfg.stop = stop;
    cfg.kill_timing = slurm.as_ref().map(|s| s.timing(asked, mpirun.as_ref()));
    // Under mpirun the ranks' output goes through daemons that Slurm stops with them: the last
    // lines go to the batch job's output file itself.
    let last_lines_to = slurm.and_then(|s| s.stderr).filter(|_| mpirun.is_some());
    let place = job.info();
    // An error resolving the devices is the run's to report, with the others.
    let devices = cfg
        .devices
        .resolve(place.rank_in_node, place.ranks_in_node)
        .unwrap_or_default();
    job.share_cores(devices.iter().filter(|d| !d.is_cuda()).count());
    let info = job.info();
    if info.rank_in_node == 0 {
        let replicas = devices.len().max(1);
        if let Some(line) = job.binding_warning(cfg.workers + replicas) {
            eprint_line(&format!("ddl-train: {line}"));
        }
    }
    match ddl_trainer::train(&cfg, transport, job.topology(), info) {
        Ok(summary) => {
            if let Some(path) = &trace {
                let path = ddl_trace::rank_path(path, rank);
                let n = ddl_trace::write(&path)?;
                if rank == 0 && cfg.verbose {
                    eprint_line(&format!("trace: {n} spans -> {}", path.display()));
                }
            }
            if rank == 0 && cfg.verbose {
                ddl_cli::outln!(
                    "done: {} global steps ({} in this run), replica-0 parameter crc32c {:08x}",
                    summary.global_steps,
                    summary.steps_run,
                    summary.param_checksum
                );
                if let Some(line) = bad_record_summary(&summary) {
                    ddl_cli::outln!("{line}");
                }
            }
            Ok(())
        }
        Err(e) => {
            if let TrainError::Preempted { signal, .. } = &e {
                // Every rank stopped after the same step: leave MPI together, no abort.
                let line = format!("ddl-train (rank {rank}): {e}");
                let appended = last_lines_to
                    .as_deref()
                    .is_some_and(|f| slurm::append_line(f, &line).is_ok());
                if !appended {
                    eprint_line(&line);
                }
                let code = signal.exit_code();
                drop(job);
                std::process::exit(code);
            }
            eprint_line(&format!("ddl-train (rank {rank}): error: {e}"));
            // Other ranks may be blocked in a collective: each learns why and the job ends.
            job.end_failed(&e.to_string(), 1)
        }
    }
}

/// The end-of-run line about bad records, if there were any.
fn bad_record_summary(summary: &TrainSummary) -> Option<String> {
    if summary.bad_records_train + summary.bad_records_eval == 0 {
        return None;
    }
    const LISTED: usize = 10;
    let mut names: Vec<String> = summary
        .bad_records
        .iter()
        .take(LISTED)
        .map(|b| format!("{} record {}", b.file.display(), b.record))
        .collect();
    if summary.bad_records.len() > LISTED {
        names.push(format!("... {} more", summary.bad_records.len() - LISTED));
    }
    Some(format!(
        "bad records: {} distinct, met {} time(s) in training and left out of evaluation {} \
         time(s): {}",
        summary.bad_records.len(),
        summary.bad_records_train,
        summary.bad_records_eval,
        names.join("; ")
    ))
}
