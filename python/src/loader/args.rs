//! What the arguments of `ddl._ddl.Loader` become: each checked, a refusal the ValueError
//! that names the argument.

use std::path::Path;

use ddl_loader::limits::{AugmentError, AugmentSetting, LimitError, Setting};
use ddl_loader::manifest::Manifest;
use ddl_loader::pipeline::{OnBadRecord, Output};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::loader_error;

/// The ValueError of argument `arg`, saying why.
pub(super) fn value_error(arg: &str, why: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!("{arg}: {why}"))
}

/// A refusal of the augmentation's checks as the ValueError of its argument.
pub(super) fn augment_error(e: AugmentError) -> PyErr {
    let name = match e.setting {
        AugmentSetting::Scale => "scale",
        AugmentSetting::Ratio => "ratio",
        AugmentSetting::Flip => "flip_p",
        AugmentSetting::EvalResizeRatio => "resize_ratio",
        AugmentSetting::Mean => "mean",
        AugmentSetting::Std => "std",
    };
    value_error(name, e)
}

/// A refusal of the loader's limits (shared with ddl-train and ddl-prof) as the ValueError of
/// the arguments that would lift it.
pub(super) fn limit_error(e: LimitError) -> PyErr {
    let names = e.named(|s| match s {
        Setting::Batch => "batch_size",
        Setting::ImageSize => "image_size",
        Setting::Workers => "workers",
        Setting::Prefetch => "prefetch",
        Setting::EvalResize => "resize",
    });
    value_error(&names, e)
}

/// Checks this process's place in the job: `node` of `nodes`, `rank_in_node` of
/// `ranks_in_node`.
pub(super) fn check_world(
    node: usize,
    nodes: usize,
    rank_in_node: usize,
    ranks_in_node: usize,
) -> PyResult<()> {
    if nodes * ranks_in_node == 0 {
        return Err(value_error("world size", "must be positive, got 0"));
    }
    if node >= nodes || rank_in_node >= ranks_in_node {
        return Err(value_error(
            "rank",
            format!(
                "node {node} of {nodes}, local rank {rank_in_node} of {ranks_in_node}: out of range"
            ),
        ));
    }
    Ok(())
}

/// The batch layout of the `dtype` argument.
pub(super) fn parse_dtype(dtype: &str) -> PyResult<Output> {
    match dtype {
        "float32" => Ok(Output::F32Nchw),
        "uint8" => Ok(Output::U8Nhwc),
        other => Err(value_error(
            "dtype",
            format!("{other:?} is not \"float32\" or \"uint8\""),
        )),
    }
}

/// The rule of the `on_bad_record` argument.
pub(super) fn parse_on_bad_record(on_bad_record: &str) -> PyResult<OnBadRecord> {
    match on_bad_record {
        "skip" => Ok(OnBadRecord::Skip),
        "replace" => Ok(OnBadRecord::Replace),
        "fail" => Ok(OnBadRecord::Fail),
        other => Err(value_error(
            "on_bad_record",
            format!("{other:?} is not \"skip\", \"replace\" or \"fail\""),
        )),
    }
}

/// The manifest in `path`, which must have `split`, with a shard for each of `nodes` when it
/// trains.
pub(super) fn load_manifest(
    path: &Path,
    split: &str,
    nodes: usize,
    train: bool,
) -> PyResult<Manifest> {
    let manifest = Manifest::load(path).map_err(loader_error)?;
    if !manifest.splits.contains_key(split) {
        let have: Vec<&str> = manifest.splits.keys().map(String::as_str).collect();
        return Err(value_error(
            "split",
            format!(
                "{}: no split {split:?} (the manifest has {})",
                path.display(),
                have.join(", ")
            ),
        ));
    }
    let shards = manifest.splits[split].shards.len();
    if nodes > shards && train {
        return Err(value_error(
            "world size",
            format!(
                "{nodes} nodes but split {split:?} of {} has {shards} shards: every node needs one",
                path.display()
            ),
        ));
    }
    Ok(manifest)
}
