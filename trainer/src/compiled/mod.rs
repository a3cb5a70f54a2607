//! The training step compiled ahead of time by Inductor (`compile`).
//!
//! Eager libtorch runs every batch-norm, ReLU and residual add of a ResNet as its own
//! memory-bound kernel; Inductor fuses them. `step.py` (run by the Python whose torch is the
//! libtorch this process loaded, [`python`]) builds the same network in PyTorch, exports the
//! joint forward + backward graph of one step and compiles it with AOTInductor into a package
//! that libtorch's own loader runs from here ([`StepPackage`]). The package computes with the
//! replica's own tensors, bound without a copy: the parameters (views of the flat weights), the
//! BatchNorm buffers (updated in place) and the flat gradient buffer (written whole), so
//! the buckets, the allreduce, the optimizer, checkpoints and evaluation see what they see
//! in an eager step.
//!
//! A compile takes minutes, so packages are kept in a cache ([`prepare`]): one entry per
//! [`StepKey`] (model, classes, per-replica batch, image size, precision, layout, device and
//! architecture, torch, the flat layout and the script itself). A later run with the same key
//! loads the entry; one whose key, torch or checksum does not match is compiled again, never
//! run.

mod cache;
mod cuda;
mod entry;
mod graph;
mod package;
mod python;
mod step;

use std::path::PathBuf;

use crate::error::Result;

pub use entry::Entry;
pub(crate) use graph::GraphLibrary;
pub use package::StepPackage;
pub use step::{StepKey, StepSpec};

/// Where the steps are compiled, for which sizes and by which Python.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompileSettings {
    /// The cache folder (`compile_cache`).
    pub cache: PathBuf,
    /// Every train image size of the run: one step each, all compiled before the first step.
    pub image_sizes: Vec<u32>,
    /// Print what is compiled or loaded, and how long it took.
    pub verbose: bool,
    /// Let Inductor fold small 1-D constants into the code (tests of the check that refuses
    /// such a package).
    pub fold_small_constants: bool,
    /// Options of Inductor's compile, `KEY=VALUE` (`inductor_options`).
    pub inductor_options: Vec<String>,
    /// Replay each step from a CUDA graph (`cuda_graphs`).
    pub cuda_graphs: bool,
    /// The Python that compiles (`DDL_PYTHON`); none: the one the loaded torch belongs to.
    pub python: Option<PathBuf>,
}

/// The default cache folder: `$XDG_CACHE_HOME/ddl/compiled`, else `~/.cache/ddl/compiled`.
pub fn default_cache_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("ddl").join("compiled")
}

/// The cache entry of `spec`: found in `settings.cache`, or compiled into it (`progress` is
/// told what is compiled, and when it is done how long it took).
pub fn prepare(
    spec: &StepSpec,
    settings: &CompileSettings,
    progress: &mut dyn FnMut(&str),
) -> Result<Entry> {
    let python = python::find(settings.python.as_deref())?;
    let key = spec.key(&python.torch_version)?;
    cache::get_or_build(&settings.cache, &key, &python, spec, progress)
}
