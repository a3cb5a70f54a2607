//! Models in and out of ddl: a model's weights exactly as torchvision's `state_dict()` holds
//! them, and `.safetensors` files of them ([`mod@file`]) with ddl's metadata ([`meta`]).
//!
//! ddl's variable names are torchvision's (`conv1.weight`, `layer1.0.bn1.running_var`,
//! `layer2.0.downsample.0.weight`, `fc.bias`, ...), so a [`StateDict`] of a torchvision
//! architecture has the keys, shapes and dtypes of
//! `torchvision.models.resnetNN(num_classes=C).state_dict()`:
//!
//! - every parameter and BatchNorm running statistic as float32, convolution weights in NCHW
//!   (`[out, in, kh, kw]`) whatever the training layout: values are copied out of the replica in
//!   logical order, so `channels_last` changes nothing in the file;
//! - each BatchNorm's `num_batches_tracked` as an int64 scalar. tch's BatchNorm keeps no such
//!   counter, so ddl writes what torch's would hold: the number of training batches the exported
//!   statistics were updated with, i.e. the run's global step count plus the count the
//!   `init_from` file carried (0 for a run from scratch). torch only reads the counter when a
//!   BatchNorm has `momentum=None`, which torchvision's ResNets do not; it is there so that
//!   `load_state_dict(strict=True)` finds every key, and it round-trips an imported file bitwise.
//!
//! The ddl-only models (`resnet_small`, `convnet_nobn`) are exported the same way under their own
//! names. Which replica's BatchNorm statistics a file holds is decided by the writer: ddl-train
//! and ddl-export write rank 0's replica 0, the statistics ddl-train evaluates with (see
//! [`crate::export`]).

pub mod error;
pub mod file;
mod head;
pub mod meta;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use safetensors::Dtype;

use crate::model::ModelKind;
use crate::variables::{Variable, Variables};

pub use error::WeightsError;
pub use head::is_head;

/// Whose BatchNorm running statistics ddl-train's `export` and ddl-export write, as the
/// metadata says it. Every replica keeps its own statistics (each normalises its own batches),
/// all estimates of the same moments; ddl writes rank 0's replica 0 because those are the
/// statistics ddl-train's evaluation runs with, so the file reproduces the val top-1/top-5 it
/// reports (and its metadata records). An average over the replicas would be a model no
/// evaluation has measured.
pub const EXPORTED_STATISTICS: &str = "rank 0, replica 0 (the statistics ddl-train evaluates with)";

/// Suffix of the counter torch's BatchNorm keeps beside its running statistics.
pub const BATCHES_TRACKED: &str = "num_batches_tracked";

/// What a key holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A trainable parameter.
    Param,
    /// A BatchNorm running statistic (`running_mean`, `running_var`).
    Buffer,
    /// A BatchNorm's `num_batches_tracked` (int64 scalar).
    BatchesTracked,
}

/// One key of a model's state dict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeySpec {
    /// torchvision's key, e.g. `layer1.0.bn1.running_var`.
    pub name: String,
    /// Shape (empty for a scalar).
    pub shape: Vec<usize>,
    /// dtype in torchvision's state dict.
    pub dtype: Dtype,
    /// What it holds.
    pub role: Role,
}

/// Every key of a model's state dict, in torchvision's order (module registration order:
/// `conv1.weight`, `bn1.weight`, `bn1.bias`, `bn1.running_mean`, `bn1.running_var`,
/// `bn1.num_batches_tracked`, `layer1.0.conv1.weight`, ...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spec {
    /// Model name (for messages).
    pub model: String,
    /// The keys.
    pub keys: Vec<KeySpec>,
}

impl Spec {
    /// The state-dict keys of a model whose variables are `vars`.
    pub fn of_variables(model: &str, vars: &Variables) -> Spec {
        let buffers: BTreeMap<&str, &Vec<i64>> =
            vars.buffers.iter().map(|(n, s)| (n.as_str(), s)).collect();
        let dims = |s: &[i64]| s.iter().map(|&d| d.max(0) as usize).collect::<Vec<_>>();
        // Modules in the order their first variable was created; inside a module torch
        // registers weight before bias (tch creates a linear's or convolution's bias first).
        let mut modules: Vec<(&str, Vec<&Variable>)> = Vec::new();
        for p in &vars.params {
            let prefix = p.0.rsplit_once('.').map_or("", |(m, _)| m);
            match modules.iter_mut().find(|(m, _)| *m == prefix) {
                Some((_, ps)) => ps.push(p),
                None => modules.push((prefix, vec![p])),
            }
        }
        let rank = |p: &&Variable| match p.0.rsplit('.').next() {
            Some("weight") => 0,
            Some("bias") => 1,
            _ => 2,
        };
        let mut keys = Vec::new();
        let mut placed = BTreeSet::new();
        for (prefix, mut ps) in modules {
            ps.sort_by_key(rank);
            for (name, shape) in ps {
                keys.push(KeySpec {
                    name: name.clone(),
                    shape: dims(shape),
                    dtype: Dtype::F32,
                    role: Role::Param,
                });
            }
            // A BatchNorm registers running_mean, running_var and num_batches_tracked after
            // its parameters.
            let mean = format!("{prefix}.running_mean");
            if !buffers.contains_key(mean.as_str()) {
                continue;
            }
            for stat in ["running_mean", "running_var"] {
                let name = format!("{prefix}.{stat}");
                if let Some(shape) = buffers.get(name.as_str()) {
                    keys.push(KeySpec {
                        name: name.clone(),
                        shape: dims(shape),
                        dtype: Dtype::F32,
                        role: Role::Buffer,
                    });
                    placed.insert(name);
                }
            }
            keys.push(KeySpec {
                name: format!("{prefix}.{BATCHES_TRACKED}"),
                shape: Vec::new(),
                dtype: Dtype::I64,
                role: Role::BatchesTracked,
            });
        }
        // Buffers of no BatchNorm (none in ddl's models) go last, under their own names.
        for (name, shape) in &vars.buffers {
            if !placed.contains(name) {
                keys.push(KeySpec {
                    name: name.clone(),
                    shape: dims(shape),
                    dtype: Dtype::F32,
                    role: Role::Buffer,
                });
            }
        }
        Spec {
            model: model.to_string(),
            keys,
        }
    }

    /// The state-dict keys of `kind` for `classes` classes at `image_size` (builds the model
    /// on the CPU once).
    pub fn of_model(kind: ModelKind, classes: i64, image_size: u32) -> Spec {
        Spec::of_variables(kind.name(), &Variables::of_model(kind, classes, image_size))
    }

    /// The key called `name`.
    pub fn get(&self, name: &str) -> Option<&KeySpec> {
        self.keys.iter().find(|k| k.name == name)
    }
}

/// One tensor of a state dict: dtype, shape and little-endian bytes, as a safetensors file
/// stores them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Element type.
    pub dtype: Dtype,
    /// Shape (empty for a scalar).
    pub shape: Vec<usize>,
    /// Little-endian element bytes in row-major order.
    pub data: Vec<u8>,
}

impl Entry {
    /// A float32 tensor of `shape` holding `values` (row-major).
    pub fn f32(shape: Vec<usize>, values: &[f32]) -> Entry {
        Entry {
            dtype: Dtype::F32,
            shape,
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    /// An int64 scalar.
    pub fn i64_scalar(value: i64) -> Entry {
        Entry {
            dtype: Dtype::I64,
            shape: Vec::new(),
            data: value.to_le_bytes().to_vec(),
        }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The values of a float32 tensor (`None` for another dtype).
    pub fn to_f32(&self) -> Option<Vec<f32>> {
        (self.dtype == Dtype::F32).then(|| {
            self.data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        })
    }

    /// The value of a one-element int64 tensor (`None` otherwise).
    pub fn to_i64(&self) -> Option<i64> {
        let bytes: [u8; 8] = self.data.as_slice().try_into().ok()?;
        (self.dtype == Dtype::I64).then(|| i64::from_le_bytes(bytes))
    }
}

/// A model's weights by torchvision key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StateDict {
    /// The tensors by key.
    pub tensors: BTreeMap<String, Entry>,
}

impl StateDict {
    /// The state dict of a model laid out as `spec`, from ddl's values: `params` in the order
    /// of `vars.params`, `buffers` in the order of `vars.buffers` (as a replica's state or a
    /// checkpoint holds them); `batches_tracked(bn)` gives the `num_batches_tracked` of the
    /// BatchNorm whose prefix is `bn` (e.g. `layer1.0.bn1`).
    pub fn from_ddl(
        spec: &Spec,
        vars: &Variables,
        params: &[Vec<f32>],
        buffers: &[Vec<f32>],
        batches_tracked: &dyn Fn(&str) -> i64,
    ) -> StateDict {
        let values: BTreeMap<&str, &Vec<f32>> = (vars.params.iter().zip(params))
            .chain(vars.buffers.iter().zip(buffers))
            .map(|((name, _), v)| (name.as_str(), v))
            .collect();
        let mut tensors = BTreeMap::new();
        for k in &spec.keys {
            let entry = match k.role {
                Role::BatchesTracked => {
                    let bn = k
                        .name
                        .strip_suffix(BATCHES_TRACKED)
                        .and_then(|p| p.strip_suffix('.'))
                        .unwrap_or(&k.name);
                    Entry::i64_scalar(batches_tracked(bn))
                }
                Role::Param | Role::Buffer => match values.get(k.name.as_str()) {
                    Some(v) => Entry::f32(k.shape.clone(), v),
                    None => continue,
                },
            };
            tensors.insert(k.name.clone(), entry);
        }
        StateDict { tensors }
    }

    /// Checks the dict against `spec` as torch's `load_state_dict(strict=True)` would, with
    /// torchvision's dtypes: every key present with its shape and dtype, no other key. A
    /// missing `num_batches_tracked` is accepted (torch accepts it too: state dicts saved
    /// before the counter existed lack it). With `skip_head` the classifier head ([`is_head`])
    /// is not checked at all (`reset_head`: it is re-initialised). Errors name the key and
    /// `path`.
    pub fn check(&self, spec: &Spec, path: &Path, skip_head: bool) -> Result<(), WeightsError> {
        let wanted = |k: &&KeySpec| !(skip_head && is_head(&k.name));
        let mut missing = Vec::new();
        for k in spec.keys.iter().filter(wanted) {
            let Some(e) = self.tensors.get(&k.name) else {
                if k.role != Role::BatchesTracked {
                    missing.push(&k.name);
                }
                continue;
            };
            if e.dtype != k.dtype {
                return Err(WeightsError::Dtype {
                    path: path.to_path_buf(),
                    key: k.name.clone(),
                    found: e.dtype,
                    expected: k.dtype,
                });
            }
            // torch saves num_batches_tracked as a 0-d tensor; accept a 1-element one too.
            let shape_ok = e.shape == k.shape || (k.role == Role::BatchesTracked && e.numel() == 1);
            if !shape_ok {
                return Err(WeightsError::Shape {
                    path: path.to_path_buf(),
                    key: k.name.clone(),
                    model: spec.model.clone(),
                    found: e.shape.clone(),
                    expected: k.shape.clone(),
                });
            }
        }
        if let Some(first) = missing.first() {
            return Err(WeightsError::Missing {
                path: path.to_path_buf(),
                key: first.to_string(),
                model: spec.model.clone(),
                more: missing.len() - 1,
            });
        }
        let known: BTreeSet<&str> = spec.keys.iter().map(|k| k.name.as_str()).collect();
        let unexpected: Vec<&String> = self
            .tensors
            .keys()
            .filter(|k| !(known.contains(k.as_str()) || (skip_head && is_head(k))))
            .collect();
        if let Some(first) = unexpected.first() {
            return Err(WeightsError::Unexpected {
                path: path.to_path_buf(),
                key: first.to_string(),
                model: spec.model.clone(),
                more: unexpected.len() - 1,
            });
        }
        Ok(())
    }

    /// The float32 values of `key`, if present and float32.
    pub fn f32_values(&self, key: &str) -> Option<Vec<f32>> {
        self.tensors.get(key).and_then(Entry::to_f32)
    }

    /// The `num_batches_tracked` of every BatchNorm that has one, by BatchNorm prefix.
    pub fn batches_tracked(&self) -> BTreeMap<String, i64> {
        self.tensors
            .iter()
            .filter_map(|(k, e)| {
                let bn = k.strip_suffix(BATCHES_TRACKED)?.strip_suffix('.')?;
                Some((bn.to_string(), e.to_i64()?))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> Spec {
        Spec::of_model(ModelKind::Resnet18, 10, 64)
    }

    #[test]
    fn resnet18_keys_are_torchvisions() {
        let s = spec();
        // torchvision.models.resnet18(num_classes=10).state_dict(): 122 keys.
        assert_eq!(s.keys.len(), 122);
        let names: Vec<&str> = s.keys.iter().take(7).map(|k| k.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "conv1.weight",
                "bn1.weight",
                "bn1.bias",
                "bn1.running_mean",
                "bn1.running_var",
                "bn1.num_batches_tracked",
                "layer1.0.conv1.weight"
            ]
        );
        let k = s.get("layer2.0.downsample.1.num_batches_tracked").unwrap();
        assert_eq!((k.dtype, k.shape.len()), (Dtype::I64, 0));
        assert_eq!(s.get("conv1.weight").unwrap().shape, [64, 3, 7, 7]);
        assert_eq!(s.get("fc.weight").unwrap().shape, [10, 512]);
        assert_eq!(s.keys.last().unwrap().name, "fc.bias");
        let nobn = Spec::of_model(ModelKind::ConvnetNobn, 3, 32);
        assert!(nobn.keys.iter().all(|k| k.role == Role::Param));
    }

    fn full(spec: &Spec) -> StateDict {
        let tensors = spec
            .keys
            .iter()
            .map(|k| {
                let e = if k.dtype == Dtype::I64 {
                    Entry::i64_scalar(3)
                } else {
                    Entry::f32(k.shape.clone(), &vec![0.5; k.shape.iter().product()])
                };
                (k.name.clone(), e)
            })
            .collect();
        StateDict { tensors }
    }

    #[test]
    fn check_names_the_key() {
        let s = spec();
        let p = Path::new("w.safetensors");
        let good = full(&s);
        good.check(&s, p, false).unwrap();
        assert_eq!(good.batches_tracked()["layer1.0.bn2"], 3);

        let mut d = good.clone();
        d.tensors.remove("layer3.1.bn2.running_var");
        let e = d.check(&s, p, false).unwrap_err().to_string();
        assert!(e.contains("tensor layer3.1.bn2.running_var missing"), "{e}");
        // num_batches_tracked may be absent (older state dicts).
        let mut d = good.clone();
        d.tensors.remove("bn1.num_batches_tracked");
        d.check(&s, p, false).unwrap();

        let mut d = good.clone();
        d.tensors.get_mut("layer1.0.conv2.weight").unwrap().shape = vec![64, 64, 1, 9];
        let e = d.check(&s, p, false).unwrap_err().to_string();
        assert!(
            e.contains("layer1.0.conv2.weight has shape [64, 64, 1, 9]"),
            "{e}"
        );
        assert!(e.contains("needs [64, 64, 3, 3]"), "{e}");

        let mut d = good.clone();
        d.tensors.get_mut("bn1.running_mean").unwrap().dtype = Dtype::F16;
        let e = d.check(&s, p, false).unwrap_err().to_string();
        assert!(e.contains("bn1.running_mean is F16"), "{e}");

        let mut d = good.clone();
        d.tensors
            .insert("layer5.0.conv1.weight".into(), Entry::i64_scalar(1));
        let e = d.check(&s, p, false).unwrap_err().to_string();
        assert!(
            e.contains("layer5.0.conv1.weight is not part of resnet18"),
            "{e}"
        );

        // Another class count: the head is named, with the flag that fixes it; skipped with it.
        let other = Spec::of_model(ModelKind::Resnet18, 4, 64);
        let e = good.check(&other, p, false).unwrap_err().to_string();
        assert!(e.contains("fc.weight has shape [10, 512]"), "{e}");
        assert!(e.contains("--reset-head"), "{e}");
        good.check(&other, p, true).unwrap();
        let mut headless = good.clone();
        headless.tensors.retain(|k, _| !is_head(k));
        headless.check(&other, p, true).unwrap();
    }

    #[test]
    fn from_ddl_uses_variables_order_and_counts() {
        let vars = Variables::of_model(ModelKind::ResnetSmall, 3, 32);
        let s = Spec::of_variables("resnet_small", &vars);
        let numel = |shape: &[i64]| shape.iter().product::<i64>() as usize;
        let params: Vec<Vec<f32>> = (vars.params.iter().enumerate())
            .map(|(i, (_, shape))| vec![i as f32; numel(shape)])
            .collect();
        let buffers: Vec<Vec<f32>> = (vars.buffers.iter().enumerate())
            .map(|(i, (_, shape))| vec![-(i as f32); numel(shape)])
            .collect();
        let d = StateDict::from_ddl(&s, &vars, &params, &buffers, &|bn| {
            if bn == "bn1" {
                7
            } else {
                1
            }
        });
        assert_eq!(d.tensors.len(), s.keys.len());
        d.check(&s, Path::new("x"), false).unwrap();
        let i = vars
            .params
            .iter()
            .position(|(n, _)| n == "fc.bias")
            .unwrap();
        assert_eq!(d.f32_values("fc.bias").unwrap(), params[i]);
        let j = vars
            .buffers
            .iter()
            .position(|(n, _)| n == "layer2.1.bn1.running_var")
            .unwrap();
        assert_eq!(
            d.f32_values("layer2.1.bn1.running_var").unwrap(),
            buffers[j]
        );
        assert_eq!(d.batches_tracked()["bn1"], 7);
        assert_eq!(d.batches_tracked()["layer3.0.downsample.1"], 1);
    }
}
