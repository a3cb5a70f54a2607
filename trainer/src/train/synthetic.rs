//! `synthetic_data`: training on one random batch held on each device, without a loader,
//! evaluation or checkpoints. It times the model, the table and the allreduce alone, as a
//! PyTorch loop on data already on the GPU does (trainer/bench/torch_eager.py).

use std::sync::Arc;

use ddl_comm::{CostModel, Topology, Transport};

use crate::comm::Communicator;
use crate::config::Setting;
use crate::config::TrainConfig;
use crate::device;
use crate::error::{Result, TrainError};
use crate::metrics::{MetricsWriter, StepRecord};
use crate::schedule::{Decay, Schedule};
use crate::table::Table;
use crate::validate;

use super::rank_setup::{check_replica_counts, table_config};
use super::run::TrainSummary;
use crate::job::RankInfo;

/// Classes of the synthetic model unless `classes` says otherwise (ImageNet-1k's).
const DEFAULT_CLASSES: usize = 1000;
/// Steps of a synthetic "epoch" (`epochs` x this, unless `max_steps`).
const STEPS_PER_EPOCH: u64 = 100;

/// Trains on synthetic data on this rank (collective, as [`super::train`]).
pub(super) fn train(
    cfg: &TrainConfig,
    transport: Arc<dyn Transport>,
    topology: Topology,
    info: RankInfo,
) -> Result<TrainSummary> {
    check_flags(cfg)?;
    let rank = transport.rank();
    let world = transport.size();
    let devices = cfg.devices.resolve(info.rank_in_node, info.ranks_in_node)?;
    let comm = Communicator::new(
        transport,
        cfg.allreduce.clone(),
        cfg.gather.clone(),
        topology,
        CostModel::default(),
    )?;
    check_replica_counts(&comm, devices.len())?;
    device::configure_backend(&devices, cfg.deterministic);
    let global_replicas = devices.len() * world;
    let classes = cfg.classes.unwrap_or(DEFAULT_CLASSES) as i64;
    validate::head_split(cfg, classes as usize, global_replicas)?;
    let table_cfg = table_config(cfg, devices, classes, &info, (rank, world));
    let mut table = Table::new(table_cfg)?;
    table.attach_synthetic()?;
    let mut schedule = Schedule::new(
        cfg.base_lr,
        global_replicas * cfg.batch,
        STEPS_PER_EPOCH,
        cfg.epochs,
        cfg.warmup_epochs,
        Decay::Cosine,
    );
    if let Some(lr) = cfg.lr {
        schedule.peak = lr;
    }
    let mut metrics = match (&cfg.metrics, rank) {
        (Some(path), 0) => Some(MetricsWriter::open(path, false)?),
        _ => None,
    };
    let steps = cfg
        .max_steps
        .unwrap_or(u64::from(cfg.epochs) * STEPS_PER_EPOCH);
    for step in 0..steps {
        let lr = schedule.lr(step);
        let sent = comm.bytes_sent();
        let stats = table.step(lr, &comm)?;
        if !stats.loss.is_finite() {
            return Err(TrainError::NonFinite { step });
        }
        if let Some(m) = &mut metrics {
            let at = (step + 1, step / STEPS_PER_EPOCH, lr);
            m.write(&StepRecord::new(
                at,
                &stats,
                world,
                comm.bytes_sent() - sent,
            ))?;
        }
        super::tuning::report(
            &comm,
            step + 1,
            rank == 0 && cfg.verbose,
            metrics.as_mut(),
            cfg.save_cost_model.as_deref(),
        )?;
    }
    table.flush(&comm)?;
    Ok(TrainSummary {
        global_steps: steps,
        steps_run: steps,
        param_checksum: table.checksums()?[0],
        ..TrainSummary::default()
    })
}

/// The settings that need data have none to work on.
fn check_flags(cfg: &TrainConfig) -> Result<()> {
    validate::ranges(cfg)?;
    validate::compile(cfg)?;
    let needs_data = [
        (Setting::Data, !cfg.data.as_os_str().is_empty()),
        (Setting::CheckpointDir, cfg.checkpoint_dir.is_some()),
        (Setting::InitFrom, cfg.init_from.is_some()),
        (Setting::Export, cfg.export.is_some()),
        (Setting::DumpWeights, cfg.dump_weights.is_some()),
        (Setting::TraceRecords, cfg.trace_records.is_some()),
    ];
    if let Some((setting, _)) = needs_data.iter().find(|(_, given)| *given) {
        return Err(TrainError::config(
            *setting,
            format!(
                "cannot be used with {}, which trains on random data to time the model",
                Setting::SyntheticData
            ),
        ));
    }
    if cfg.classes == Some(0) || cfg.classes == Some(1) {
        return Err(TrainError::config(
            Setting::Classes,
            "needs at least 2 classes",
        ));
    }
    Ok(())
}
