//! The checks and derived settings of a run: every flag parsed and checked against the data and
//! the job before anything expensive happens.

use ddl_loader::dataset::Residency;
use ddl_loader::manifest::Manifest;
use ddl_loader::pipeline::Output;
use tch::Device;

use crate::config::Setting;
use crate::config::{ResidencyMode, TrainConfig};
use crate::error::{Result, TrainError};
use crate::schedule::{Decay, DecayKind};
use crate::validate;
use crate::weights;

use crate::job::RankInfo;

/// Validated, derived settings.
pub(super) struct Plan {
    pub(super) decay: Decay,
    pub(super) residency: Residency,
    pub(super) ranks_in_node: usize,
    pub(super) rank_in_node: usize,
    pub(super) devices: Vec<Device>,
    pub(super) manifest: Manifest,
    /// crc32c of the manifest's classes and train split: what a checkpoint's data must match.
    pub(super) data_fingerprint: u32,
}

/// Checks the configuration before anything expensive happens; every error names its setting.
pub(super) fn plan(cfg: &TrainConfig, rank: usize, world: usize, info: RankInfo) -> Result<Plan> {
    validate::ranges(cfg)?;
    validate::compile(cfg)?;
    let decay = check_settings(cfg, rank)?;
    let (manifest, train_shards) = load_manifest(cfg)?;
    let (residency, ranks_in_node, rank_in_node) = residency(cfg, rank, world, info, train_shards)?;
    let devices = cfg.devices.resolve(info.rank_in_node, info.ranks_in_node)?;
    validate::head_split(cfg, manifest.num_classes(), devices.len() * world)?;
    // GPUs get uint8 batches (normalised on the device), CPUs float32.
    let output = if devices.iter().any(|d| d.is_cuda()) {
        Output::U8Nhwc
    } else {
        Output::F32Nchw
    };
    validate::batch_memory(cfg, devices.len(), output, info.ranks_in_node)?;
    let data_fingerprint = manifest.fingerprint("train");
    Ok(Plan {
        decay,
        residency,
        ranks_in_node,
        rank_in_node,
        devices,
        manifest,
        data_fingerprint,
    })
}

/// The checks of the settings among themselves (and of the files rank 0 reads or writes):
/// the learning-rate decay they give.
fn check_settings(cfg: &TrainConfig, rank: usize) -> Result<Decay> {
    if cfg.classes.is_some() {
        return Err(TrainError::config(
            Setting::Classes,
            format!(
                "only with {}: a run on data has the classes of its manifest",
                Setting::SyntheticData
            ),
        ));
    }
    let decay = match cfg.schedule {
        DecayKind::Step => {
            if cfg.milestones.windows(2).any(|w| w[0] >= w[1]) {
                return Err(TrainError::config(
                    Setting::Milestones,
                    "epochs must be strictly increasing",
                ));
            }
            Decay::Step {
                milestones: cfg.milestones.clone(),
                gamma: cfg.gamma,
            }
        }
        DecayKind::Cosine => Decay::Cosine,
    };
    if cfg.resume && cfg.checkpoint_dir.is_none() {
        return Err(TrainError::config(
            Setting::Resume,
            format!("needs {}", Setting::CheckpointDir),
        ));
    }
    if cfg.restart && cfg.checkpoint_dir.is_none() {
        return Err(TrainError::config(
            Setting::Restart,
            format!("needs {}", Setting::CheckpointDir),
        ));
    }
    if cfg.restart && cfg.resume {
        return Err(TrainError::config(
            Setting::Restart,
            format!(
                "starts over, {} continues: give one of them",
                Setting::Resume
            ),
        ));
    }
    if cfg.reset_head && cfg.init_from.is_none() {
        return Err(TrainError::config(
            Setting::ResetHead,
            format!("needs {}", Setting::InitFrom),
        ));
    }
    // Only rank 0 writes the model.
    if let Some(path) = cfg.export.as_ref().filter(|_| rank == 0) {
        weights::file::check_destination(path)
            .map_err(|m| TrainError::config(Setting::Export, m))?;
    }
    // Rank 0 reads the file and hands it to the others (see `Run::init_from`).
    if let Some(path) = cfg.init_from.as_ref().filter(|_| rank == 0) {
        if !path.is_file() {
            return Err(TrainError::config(
                Setting::InitFrom,
                format!("{} is not a file", path.display()),
            ));
        }
    }
    Ok(decay)
}

/// The manifest of the data and its number of train shards.
fn load_manifest(cfg: &TrainConfig) -> Result<(Manifest, usize)> {
    if !cfg.data.is_dir() {
        return Err(TrainError::config(
            Setting::Data,
            format!("{} is not a directory", cfg.data.display()),
        ));
    }
    if !cfg.data.join(ddl_loader::manifest::MANIFEST_FILE).is_file() {
        return Err(TrainError::config(
            Setting::Data,
            format!(
                "{} has no {} (pack it with ddl-pack)",
                cfg.data.display(),
                ddl_loader::manifest::MANIFEST_FILE
            ),
        ));
    }
    let manifest =
        Manifest::load(&cfg.data).map_err(|e| TrainError::config(Setting::Data, e.to_string()))?;
    if manifest.num_classes() < 2 {
        return Err(TrainError::config(
            Setting::Data,
            "the manifest lists fewer than 2 classes",
        ));
    }
    let train_shards = manifest
        .splits
        .get("train")
        .map(|s| s.shards.len())
        .unwrap_or(0);
    if train_shards == 0 {
        return Err(TrainError::config(
            Setting::Data,
            "the manifest has no train split",
        ));
    }
    Ok((manifest, train_shards))
}

/// Which node's share of the data this rank reads, with its node's rank count and its index
/// there (every rank its own node under `residency` rank).
fn residency(
    cfg: &TrainConfig,
    rank: usize,
    world: usize,
    info: RankInfo,
    train_shards: usize,
) -> Result<(Residency, usize, usize)> {
    let (residency, ranks_in_node, rank_in_node) = match cfg.residency {
        ResidencyMode::Node => (
            Residency {
                node: info.node,
                nodes: info.nodes,
            },
            info.ranks_in_node,
            info.rank_in_node,
        ),
        ResidencyMode::Rank => (
            Residency {
                node: rank,
                nodes: world,
            },
            1,
            0,
        ),
    };
    if residency.nodes > train_shards {
        return Err(TrainError::config(
            Setting::Residency,
            format!(
                "{} nodes (ranks with {} rank) but only {train_shards} train shards: every node needs one; \
                 repack with more shards or use fewer ranks",
                residency.nodes,
                Setting::Residency
            ),
        ));
    }
    Ok((residency, ranks_in_node, rank_in_node))
}
