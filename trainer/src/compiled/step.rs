//! One compiled step: what it is compiled for ([`StepSpec`]), the key of its cache entry
//! ([`StepKey`]) and the script and sources it is compiled with.

use serde::{Deserialize, Serialize};
use tch::Device;

use super::cuda;
use crate::device::Precision;
use crate::error::Result;
use crate::model::ModelKind;
use crate::table::buckets::Layout;

/// The compile script, written into each entry it compiles.
pub(super) const SCRIPT: &str = include_str!("step.py");
/// The sources the script compiles the CUDA graph library from, written beside it.
pub(super) const GRAPH_SOURCES: [(&str, &str); 2] = [
    ("graph.cpp", include_str!("graph.cpp")),
    ("guarded.h", include_str!("../device/guarded.h")),
];

/// What a compiled step is for: two runs share a package exactly when their keys are equal.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepKey {
    /// Network.
    pub model: String,
    /// Output classes.
    pub classes: i64,
    /// Images per replica.
    pub batch: usize,
    /// Square input side in pixels.
    pub image_size: u32,
    /// The image size the model was built for (the stem of `resnet_small` depends on it).
    pub model_image_size: u32,
    /// The arithmetic it runs in (`fp32` on the CPU, whatever was asked).
    pub precision: String,
    /// Channels-last images and weights.
    pub channels_last: bool,
    /// Label smoothing of the loss.
    pub label_smoothing: f64,
    /// `cpu`, or `cuda <name> sm_<arch>`.
    pub device: String,
    /// The torch version that compiles and runs it.
    pub torch: String,
    /// crc32c of the flat layout (names, shapes, offsets) the gradients are written in.
    pub layout: u32,
    /// crc32c of the compile script and the graph library's sources.
    pub script: u32,
    /// Inductor's options other than the script's own, `KEY=VALUE`.
    #[serde(default)]
    pub inductor_options: Vec<String>,
}

impl StepKey {
    /// The entry's folder name: readable, and unique by the key's checksum.
    pub(super) fn dir_name(&self) -> String {
        let json = serde_json::to_vec(self).expect("a key serializes");
        let device = match self.device.rsplit_once(" sm_") {
            Some((_, arch)) => format!("cuda-sm{arch}"),
            None => "cpu".into(),
        };
        format!(
            "{}-c{}-b{}-{}px-{}-{}-{device}-{:08x}",
            self.model,
            self.classes,
            self.batch,
            self.image_size,
            self.precision,
            if self.channels_last { "nhwc" } else { "nchw" },
            crc32c::crc32c(&json)
        )
    }

    /// The fields in which `other` differs from this key, with both values.
    pub(super) fn differences(&self, other: &StepKey) -> Vec<String> {
        let (a, b) = (serde_json::json!(self), serde_json::json!(other));
        let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
            return Vec::new();
        };
        a.iter()
            .filter(|(k, v)| b.get(*k) != Some(v))
            .map(|(k, v)| format!("{k} {} instead of {v}", b.get(k).unwrap_or(&v.clone())))
            .collect()
    }
}

/// One step to compile: the model and how it trains, on one device.
#[derive(Clone, Copy, Debug)]
pub struct StepSpec<'a> {
    /// Network.
    pub model: ModelKind,
    /// Output classes.
    pub classes: i64,
    /// Images per replica.
    pub batch: usize,
    /// Square input side.
    pub image_size: u32,
    /// The image size the model was built for.
    pub model_image_size: u32,
    /// Arithmetic (f32 on the CPU whatever is asked, as an eager step).
    pub precision: Precision,
    /// Channels-last images and weights.
    pub channels_last: bool,
    /// Label smoothing.
    pub label_smoothing: f64,
    /// Where the gradients go.
    pub layout: &'a Layout,
    /// The replicas' device (the first of them for CUDA: one architecture per rank).
    pub device: Device,
    /// Let Inductor fold small 1-D constants into the code, as it does by default (for the
    /// tests of the check that refuses such a package).
    pub fold_small_constants: bool,
    /// Inductor's options, `KEY=VALUE`.
    pub inductor_options: &'a [String],
    /// Refuse the first this many attempts before compiling them, as if their packages
    /// disagreed with eager (for the tests of the compile's fallback).
    pub refuse_first_packages: u32,
}

impl StepSpec<'_> {
    pub(super) fn precision(&self) -> &'static str {
        match (self.device, self.precision) {
            (Device::Cuda(_), Precision::Bf16) => "bf16",
            (Device::Cuda(_), Precision::Fp16) => "fp16",
            _ => "fp32",
        }
    }

    /// The key of this step for `torch`.
    pub(super) fn key(&self, torch: &str) -> Result<StepKey> {
        let device = match self.device {
            Device::Cuda(i) => format!("cuda {}", cuda::describe(i)?),
            _ => "cpu".into(),
        };
        Ok(StepKey {
            model: self.model.name().into(),
            classes: self.classes,
            batch: self.batch,
            image_size: self.image_size,
            model_image_size: self.model_image_size,
            precision: self.precision().into(),
            channels_last: self.channels_last,
            label_smoothing: self.label_smoothing,
            device,
            torch: torch.into(),
            layout: crc32c::crc32c(self.layout_json().to_string().as_bytes()),
            script: GRAPH_SOURCES
                .iter()
                .fold(crc32c::crc32c(SCRIPT.as_bytes()), |crc, (_, text)| {
                    crc32c::crc32c_append(crc, text.as_bytes())
                })
                ^ u32::from(self.fold_small_constants)
                ^ (self.refuse_first_packages << 1),
            inductor_options: self.inductor_options.to_vec(),
        })
    }

    pub(super) fn layout_json(&self) -> serde_json::Value {
        let l = self.layout;
        serde_json::json!({
            "params": l.params.iter().map(|p| serde_json::json!({
                "name": p.name, "shape": p.shape, "offset": p.offset})).collect::<Vec<_>>(),
            "buffers": l.buffers.iter().map(|(n, s)| serde_json::json!({
                "name": n, "shape": s})).collect::<Vec<_>>(),
            "total": l.total,
        })
    }

    /// The spec the compile script reads.
    pub(super) fn script_spec(&self, key: &StepKey) -> serde_json::Value {
        let mut spec = self.layout_json();
        let device = match self.device {
            Device::Cuda(i) => format!("cuda:{i}"),
            _ => "cpu".into(),
        };
        let fields = serde_json::json!({
            "model": key.model, "classes": key.classes, "batch": key.batch,
            "image_size": key.image_size, "model_image_size": key.model_image_size,
            "precision": key.precision,
            "channels_last": key.channels_last, "label_smoothing": key.label_smoothing,
            "device": device, "torch_version": key.torch,
            "inline_small_constants": self.fold_small_constants,
            "inductor_options": key.inductor_options,
            "refuse_first_packages": self.refuse_first_packages,
        });
        if let (Some(s), Some(f)) = (spec.as_object_mut(), fields.as_object()) {
            s.extend(f.clone());
        }
        spec
    }

    /// What the progress line calls this step.
    pub(super) fn describe(&self, key: &StepKey) -> String {
        format!(
            "{} step ({} classes, batch {}, {} px, {}, {}, {})",
            key.model,
            key.classes,
            key.batch,
            key.image_size,
            key.precision,
            if key.channels_last {
                "channels-last"
            } else {
                "NCHW"
            },
            key.device
        )
    }
}
