//! What a rank sets up before its first step: its table's configuration and the check that
//! every rank has as many replicas.

use std::path::PathBuf;

use super::checkpoints::{bytes_to_u64s, u64s_to_bytes};
use crate::comm::Communicator;
use crate::compiled::{self, CompileSettings};
use crate::config::Setting;
use crate::config::{auto_overlap, comm_order, TrainConfig};
use crate::error::{Result, TrainError};
use crate::job::RankInfo;
use crate::optim::SgdConfig;
use crate::table::TableConfig;

/// The table of rank `rank` of `ranks` (placed as `info` says) with replicas on `devices`,
/// training a model of `classes` classes as `cfg` says (`overlap` auto resolved).
pub(super) fn table_config(
    cfg: &TrainConfig,
    devices: Vec<tch::Device>,
    classes: i64,
    info: &RankInfo,
    (rank, ranks): (usize, usize),
) -> TableConfig {
    let nodes = info.nodes;
    let global_replicas = devices.len() * ranks;
    let gpus = devices.iter().any(|d| d.is_cuda());
    let overlap = cfg
        .overlap
        .unwrap_or_else(|| auto_overlap(gpus, nodes, global_replicas, cfg.compile));
    TableConfig {
        devices,
        model: cfg.model,
        classes,
        image_size: cfg.image_size,
        mean: cfg.mean,
        std: cfg.std,
        seed: cfg.seed,
        sgd: SgdConfig {
            momentum: cfg.momentum,
            nesterov: cfg.nesterov,
            weight_decay: cfg.weight_decay,
        },
        precision: cfg.precision,
        label_smoothing: cfg.label_smoothing,
        bucket_bytes: (cfg.bucket_mb * 1024.0 * 1024.0) as usize,
        overlap,
        comm_order: comm_order(cfg.comm_order, overlap, ranks, cfg.precision).0,
        channels_last: cfg.channels_last,
        global_replicas,
        ranks,
        synthetic_batch: cfg.synthetic_data.then_some(cfg.batch),
        batch: cfg.batch,
        rank,
        head_parallel: cfg.head_parallel,
        yield_to_comm: info.oversubscribed && !gpus,
        compile: cfg.compile.then(|| CompileSettings {
            cache: cfg
                .compile_cache
                .clone()
                .unwrap_or_else(compiled::default_cache_dir),
            image_sizes: train_sizes(cfg),
            verbose: cfg.verbose,
            fold_small_constants: false,
            inductor_options: cfg.inductor_options.clone(),
            cuda_graphs: cfg.cuda_graphs,
            python: std::env::var_os("DDL_PYTHON").map(PathBuf::from),
        }),
    }
}

/// Every train image size of the run, in the order its epochs meet them.
pub(super) fn train_sizes(cfg: &TrainConfig) -> Vec<u32> {
    let mut sizes: Vec<u32> = Vec::new();
    for size in (0..u64::from(cfg.epochs.max(1))).map(|e| cfg.train_size(e)) {
        if !sizes.contains(&size) {
            sizes.push(size);
        }
    }
    sizes
}

/// Every rank must have the same number of replicas: the sampler and the average assume it.
pub(super) fn check_replica_counts(comm: &Communicator, replicas: usize) -> Result<()> {
    let counts = comm.allgather_bytes(u64s_to_bytes(&[replicas as u64]))?;
    if counts.iter().any(|c| bytes_to_u64s(c) != [replicas as u64]) {
        let all: Vec<u64> = counts.iter().flat_map(|c| bytes_to_u64s(c)).collect();
        return Err(TrainError::config(
            Setting::Devices,
            format!("ranks have different replica counts {all:?}"),
        ));
    }
    Ok(())
}
