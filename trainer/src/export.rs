//! `ddl-export`: the model of any ddl-train checkpoint as a torchvision-compatible safetensors
//! file, the same file `ddl-train`'s `export` writes at the end of a run (see
//! [`crate::weights`]).
//!
//! A checkpoint holds the BatchNorm running statistics of every replica of every rank; the file
//! gets rank 0's replica 0, the ones ddl-train evaluates with
//! ([`weights::EXPORTED_STATISTICS`]).

use std::path::{Path, PathBuf};

use ddl_loader::manifest::Manifest;
use ddl_loader::pipeline::{IMAGENET_MEAN, IMAGENET_STD};

use crate::checkpoint::{self, Checkpoint};
use crate::config::eval_resize_px;
use crate::config::Setting;
use crate::error::{Result, TrainError};
use crate::flag::Named;
use crate::model::ModelKind;
use crate::variables::Variables;
use crate::weights::meta::ModelMeta;
use crate::weights::{self, file, Spec, StateDict};

/// What [`export_checkpoint`] wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct Exported {
    /// The checkpoint file read.
    pub checkpoint: PathBuf,
    /// The metadata written with the weights.
    pub meta: ModelMeta,
    /// Number of tensors written.
    pub tensors: usize,
}

/// Writes the model of the checkpoint `from` (a checkpoint file, or a checkpoint directory:
/// its newest intact checkpoint) to `to`. The class names come from the checkpoint, or, for a
/// checkpoint that predates them, from the manifest in `data` (default: the `data` the run
/// was given).
pub fn export_checkpoint(from: &Path, to: &Path, data: Option<&Path>) -> Result<Exported> {
    file::check_destination(to).map_err(|m| TrainError::config(Setting::Output, m))?;
    let (path, ck) = if from.is_dir() {
        checkpoint::newest_valid(from)?
            .checkpoint
            .ok_or_else(|| TrainError::Checkpoint {
                path: from.to_path_buf(),
                message: "no intact checkpoint in this directory".into(),
            })?
    } else {
        (from.to_path_buf(), Checkpoint::read(from)?)
    };
    let bad = |message: String| TrainError::Checkpoint {
        path: path.clone(),
        message,
    };
    let m = &ck.meta;
    let kind = ModelKind::from_name(&m.model)
        .ok_or_else(|| bad(format!("unknown model {:?}", m.model)))?;
    let flag = |name: &str| {
        m.flags[name]
            .as_u64()
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| bad(format!("no {name} among the run's flags")))
    };
    let image_size = flag("image_size")?;
    // Checkpoints that predate the flag were written with 8/7.
    let ratio = m.flags["eval_resize_ratio"]
        .as_f64()
        .unwrap_or(ddl_loader::pipeline::EVAL_RESIZE_RATIO);
    let eval_resize = eval_resize_px(image_size, flag("eval_resize")?, ratio);
    let classes = match &m.class_names {
        Some(names) => names.clone(),
        None => class_names_from_manifest(data, &m.flags, m.classes).map_err(bad)?,
    };
    if classes.len() as i64 != m.classes {
        return Err(bad(format!(
            "{} classes, but {} class names",
            m.classes,
            classes.len()
        )));
    }
    let vars = Variables::of_model(kind, m.classes, image_size);
    let params = ck
        .tensors(vars.params.iter().map(|(n, _)| format!("param/{n}")))
        .map_err(bad)?;
    let buffers = ck
        .tensors(vars.buffers.iter().map(|(n, _)| format!("buffer/0/0/{n}")))
        .map_err(bad)?;
    let spec = Spec::of_variables(kind.name(), &vars);
    for ((name, shape), v) in vars.params.iter().zip(&params) {
        if v.len() != shape.iter().product::<i64>() as usize {
            return Err(bad(format!(
                "tensor param/{name} has {} values, {kind} needs shape {shape:?}",
                v.len()
            )));
        }
    }
    let global = m.global_step as i64;
    let base = &m.batches_tracked_base;
    let dict = StateDict::from_ddl(&spec, &vars, &params, &buffers, &|bn| {
        base.get(bn).copied().unwrap_or(0) + global
    });
    let meta = ModelMeta {
        model: kind.name().to_string(),
        classes,
        image_size,
        eval_resize,
        mean: channels(&m.flags["mean"]).unwrap_or(IMAGENET_MEAN),
        std: channels(&m.flags["std"]).unwrap_or(IMAGENET_STD),
        ddl_version: env!("CARGO_PKG_VERSION").to_string(),
        flags: Some(m.flags.clone()),
        global_step: Some(m.global_step),
        val_top1: m.val_top1,
        val_top5: m.val_top5,
        batchnorm_statistics: Some(weights::EXPORTED_STATISTICS.to_string()),
    };
    file::write(to, &dict, &meta.to_map())?;
    Ok(Exported {
        checkpoint: path,
        meta,
        tensors: dict.tensors.len(),
    })
}

/// The wnids of the manifest in `data`, or in the run's `data` when `data` is `None`.
fn class_names_from_manifest(
    data: Option<&Path>,
    flags: &serde_json::Value,
    classes: i64,
) -> std::result::Result<Vec<String>, String> {
    let dir = match data {
        Some(d) => d.to_path_buf(),
        None => flags["data"].as_str().map(PathBuf::from).ok_or_else(|| {
            format!(
                "the checkpoint predates class names and records no {data}: pass {data}",
                data = Setting::Data
            )
        })?,
    };
    let manifest = Manifest::load(&dir).map_err(|e| {
        format!("the checkpoint predates class names, and the run's data cannot give them ({e}): pass {} SHARDS", Setting::Data)
    })?;
    if manifest.num_classes() as i64 != classes {
        return Err(format!(
            "{} lists {} classes, the checkpoint has {classes}",
            dir.display(),
            manifest.num_classes()
        ));
    }
    Ok(manifest.classes.into_iter().map(|c| c.wnid).collect())
}

/// A run's mean or std setting from its recorded settings (absent in checkpoints that
/// predate them: the ImageNet values they were trained with).
fn channels(v: &serde_json::Value) -> Option<[f32; 3]> {
    let a = v.as_array()?;
    let c: Vec<f32> = a
        .iter()
        .filter_map(|x| x.as_f64())
        .map(|x| x as f32)
        .collect();
    c.try_into().ok()
}
