//! `ddl-predict`: a model loaded from a weights file classifies images, on the CPU or a GPU,
//! with the eval transform and the classes its metadata names.
//!
//! A file written by ddl (`ddl-train`'s `export`, `ddl-export`) says everything: architecture,
//! classes in label order, image size, eval resize, mean and std. A plain torchvision state
//! dict carries none of it: [`Overrides`] names the architecture (and optionally the sizes;
//! ImageNet's 224 / 256 otherwise), and its classes are the label numbers.

use std::path::Path;

use ddl_loader::eval_image::EvalTransform;
use ddl_loader::pipeline::{EVAL_RESIZE_RATIO, IMAGENET_MEAN, IMAGENET_STD};
use tch::{nn, Device, Kind, Tensor};

use crate::config::eval_resize_px;
use crate::config::Setting;
use crate::error::{Result, TrainError};
use crate::flag::Named;
use crate::model::{self, Model, ModelKind};
use crate::variables::Variables;
use crate::weights::meta::ModelMeta;
use crate::weights::{file, Spec, StateDict, WeightsError};

/// What to assume for a weights file without ddl's metadata (and what to check against one
/// with it).
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// The architecture (required for a file without metadata).
    pub arch: Option<ModelKind>,
    /// Input side in pixels (default: the metadata's, else 224).
    pub image_size: Option<u32>,
    /// Shorter side of the eval resize (default: the metadata's, else image size x 8/7).
    pub eval_resize: Option<u32>,
}

/// One class of a prediction.
#[derive(Clone, Debug, PartialEq)]
pub struct Prediction {
    /// Label (logit index).
    pub label: usize,
    /// Class name (WordNet id), or the label number for a file without class names.
    pub class: String,
    /// Softmax probability.
    pub probability: f32,
}

/// A model ready for inference.
pub struct Classifier {
    meta: ModelMeta,
    device: Device,
    model: Model,
    /// Owns the model's variables.
    _vs: nn::VarStore,
}

/// `device`: `auto` (the first GPU if there is one, else the CPU), `cpu`, `cuda` or `cuda:N`.
pub fn parse_device(spec: &str) -> Result<Device> {
    let gpus = tch::Cuda::device_count().max(0) as usize;
    let bad = |m: String| TrainError::config(Setting::Device, m);
    let index = match spec {
        "auto" => {
            return Ok(if gpus > 0 {
                Device::Cuda(0)
            } else {
                Device::Cpu
            })
        }
        "cpu" => return Ok(Device::Cpu),
        "cuda" => 0,
        other => other
            .strip_prefix("cuda:")
            .and_then(|i| i.parse::<usize>().ok())
            .ok_or_else(|| bad(format!("{other:?}: expected auto, cpu, cuda or cuda:N")))?,
    };
    if index >= gpus {
        return Err(bad(format!(
            "cuda:{index} requested but {gpus} CUDA device(s) visible"
        )));
    }
    Ok(Device::Cuda(index))
}

impl Classifier {
    /// Loads the model in `path` onto `device`, checking every tensor against the architecture
    /// (errors name the key).
    pub fn load(path: &Path, device: Device, overrides: &Overrides) -> Result<Classifier> {
        let (dict, map) = file::read(path)?;
        let metadata_error = |key: &str, message: String| WeightsError::Metadata {
            path: path.to_path_buf(),
            key: key.to_string(),
            message,
        };
        let mut meta = match ModelMeta::from_map(&map, path)? {
            Some(m) => m,
            None => assumed_meta(&dict, path, overrides)?,
        };
        if let Some(arch) = overrides.arch.filter(|a| a.name() != meta.model) {
            return Err(metadata_error(
                "model",
                format!("the file holds a {}, not a {arch}", meta.model),
            )
            .into());
        }
        if let Some(size) = overrides.image_size {
            meta.image_size = size;
            meta.eval_resize = eval_resize_px(size, 0, EVAL_RESIZE_RATIO);
        }
        if let Some(resize) = overrides.eval_resize {
            meta.eval_resize = resize;
        }
        let kind = ModelKind::from_name(&meta.model).ok_or_else(|| {
            metadata_error(
                "model",
                format!("{:?} is not a model ddl knows", meta.model),
            )
        })?;
        let vs = nn::VarStore::new(device);
        let classes = meta.classes.len() as i64;
        let model = model::build(kind, &vs.root(), classes, meta.image_size);
        dict.check(
            &Spec::of_variables(kind.name(), &Variables::of(&vs)),
            path,
            false,
        )?;
        copy_weights(&vs, &dict, path, kind)?;
        Ok(Classifier {
            meta,
            device,
            model,
            _vs: vs,
        })
    }

    /// The model's metadata (read from the file, or assumed for a file without it).
    pub fn meta(&self) -> &ModelMeta {
        &self.meta
    }

    /// The device the model runs on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The eval transform the model was trained and evaluated with.
    pub fn transform(&self) -> Result<EvalTransform> {
        let m = &self.meta;
        EvalTransform::new(m.image_size, m.eval_resize, m.mean, m.std).map_err(|e| {
            TrainError::Config {
                settings: vec![Setting::ImageSize, Setting::EvalResize],
                message: e.to_string(),
            }
        })
    }

    /// Logits (float32, on the CPU, `[n, classes]`) of `n` transformed images (`images`: n x 3
    /// x size x size floats, CHW each), in eval mode.
    pub fn logits(&self, images: &[f32], n: usize) -> Result<Tensor> {
        let s = i64::from(self.meta.image_size);
        let x = Tensor::f_from_slice(images)?
            .f_view([n as i64, 3, s, s])?
            .f_to_device(self.device)?;
        let _guard = tch::no_grad_guard();
        Ok(self
            .model
            .forward_t(&x, false)
            .f_to_kind(Kind::Float)?
            .f_to_device(Device::Cpu)?)
    }

    /// The `k` most probable classes of each row of `logits`, most probable first.
    pub fn top_k(&self, logits: &Tensor, k: usize) -> Result<Vec<Vec<Prediction>>> {
        let classes = self.meta.classes.len();
        let k = k.clamp(1, classes) as i64;
        let probs = logits.f_softmax(-1, Kind::Float)?;
        let (values, indices) = probs.f_topk(k, -1, true, true)?;
        let rows = logits.size()[0];
        let mut out = Vec::with_capacity(rows as usize);
        for r in 0..rows {
            let mut row = Vec::with_capacity(k as usize);
            for j in 0..k {
                let label = indices.f_int64_value(&[r, j])? as usize;
                row.push(Prediction {
                    label,
                    class: self.meta.classes[label].clone(),
                    probability: values.f_double_value(&[r, j])? as f32,
                });
            }
            out.push(row);
        }
        Ok(out)
    }
}

/// File extensions (lower case) that [`image_files`] takes from a folder.
pub const IMAGE_EXTENSIONS: [&str; 8] = ["jpg", "jpeg", "png", "bmp", "gif", "webp", "tif", "tiff"];

/// The images of `inputs`: a file as given, a folder searched recursively for files with an
/// image extension ([`IMAGE_EXTENSIONS`], any case), in name order.
pub fn image_files(inputs: &[std::path::PathBuf]) -> Result<Vec<std::path::PathBuf>> {
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) -> Result<()> {
        let mut entries: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| TrainError::io(dir, e))?
            .map(|e| e.map(|e| e.path()).map_err(|err| TrainError::io(dir, err)))
            .collect::<Result<_>>()?;
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, out)?;
            } else if path.extension().is_some_and(|e| {
                IMAGE_EXTENSIONS.contains(&e.to_string_lossy().to_ascii_lowercase().as_str())
            }) {
                out.push(path);
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    for input in inputs {
        if input.is_dir() {
            walk(input, &mut out)?;
        } else {
            out.push(input.clone());
        }
    }
    Ok(out)
}

/// What became of one image: its most probable classes, or why it could not be read.
pub type Outcome<'a> = std::result::Result<&'a [Prediction], &'a str>;

/// The transformed images and logits of the images a [`Classifier::classify_files`] call
/// classified, in order (for saving them as tensors).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Kept {
    /// The images classified.
    pub images: Vec<std::path::PathBuf>,
    /// Their transformed pixels, n x 3 x size x size.
    pub inputs: Vec<f32>,
    /// Their logits, n x classes.
    pub logits: Vec<f32>,
}

impl Classifier {
    /// Classifies `files`, `batch` at a time, calling `each` with every file and its `k` most
    /// probable classes (or why it could not be read) in file order. Returns the inputs and
    /// logits of the images classified when `keep` is set.
    pub fn classify_files(
        &self,
        files: &[std::path::PathBuf],
        batch: usize,
        k: usize,
        keep: bool,
        each: &mut dyn FnMut(&Path, Outcome<'_>),
    ) -> Result<Kept> {
        let mut transform = self.transform()?;
        let len = transform.image_len();
        let mut kept = Kept::default();
        for chunk in files.chunks(batch.max(1)) {
            let mut pixels = vec![0f32; chunk.len() * len];
            let mut ok = Vec::with_capacity(chunk.len());
            let mut failed: Vec<Option<String>> = vec![None; chunk.len()];
            for (i, path) in chunk.iter().enumerate() {
                let n = ok.len();
                let slot = &mut pixels[n * len..(n + 1) * len];
                let done = std::fs::read(path)
                    .map_err(|e| e.to_string())
                    .and_then(|bytes| transform.apply(&bytes, slot).map_err(|e| e.to_string()));
                match done {
                    Ok(()) => ok.push(i),
                    Err(e) => failed[i] = Some(e),
                }
            }
            pixels.truncate(ok.len() * len);
            let mut predictions = Vec::new();
            if !ok.is_empty() {
                let logits = self.logits(&pixels, ok.len())?;
                predictions = self.top_k(&logits, k)?;
                if keep {
                    let flat = logits.f_flatten(0, -1)?;
                    let numel = flat.numel();
                    let mut values = vec![0f32; numel];
                    flat.f_copy_data(&mut values, numel)?;
                    kept.logits.extend(values);
                    kept.inputs.extend_from_slice(&pixels);
                    kept.images.extend(ok.iter().map(|&i| chunk[i].clone()));
                }
            }
            let mut next = predictions.iter();
            for (path, why) in chunk.iter().zip(&failed) {
                match why {
                    Some(e) => each(path, Err(e)),
                    None => each(path, Ok(next.next().map_or(&[][..], Vec::as_slice))),
                }
            }
        }
        Ok(kept)
    }
}

/// The metadata of a state dict saved outside ddl: its architecture from `overrides.arch`,
/// its classes numbered from the head's rows, torchvision's eval transform.
fn assumed_meta(dict: &StateDict, path: &Path, overrides: &Overrides) -> Result<ModelMeta> {
    let metadata_error = |key: &str, message: String| WeightsError::Metadata {
        path: path.to_path_buf(),
        key: key.to_string(),
        message,
    };
    let arch = overrides.arch.ok_or_else(|| {
        metadata_error(
            "model",
            format!(
                "the file has no ddl metadata (a state dict saved outside ddl): \
                 name its architecture with {}",
                Setting::Arch
            ),
        )
    })?;
    let classes = dict
        .tensors
        .get("fc.weight")
        .and_then(|e| e.shape.first().copied())
        .ok_or_else(|| WeightsError::Missing {
            path: path.to_path_buf(),
            key: "fc.weight".into(),
            model: arch.name().into(),
            more: 0,
        })?;
    let size = overrides.image_size.unwrap_or(224);
    Ok(ModelMeta {
        model: arch.name().to_string(),
        classes: (0..classes).map(|i| i.to_string()).collect(),
        image_size: size,
        eval_resize: eval_resize_px(size, 0, EVAL_RESIZE_RATIO),
        mean: IMAGENET_MEAN,
        std: IMAGENET_STD,
        ddl_version: String::new(),
        flags: None,
        global_step: None,
        val_top1: None,
        val_top5: None,
        batchnorm_statistics: None,
    })
}

/// Copies every tensor of `dict` (checked against the model `kind`) into its variable of `vs`.
fn copy_weights(vs: &nn::VarStore, dict: &StateDict, path: &Path, kind: ModelKind) -> Result<()> {
    let _guard = tch::no_grad_guard();
    for (name, mut var) in vs.variables() {
        let entry = dict
            .tensors
            .get(&name)
            .ok_or_else(|| WeightsError::Missing {
                path: path.to_path_buf(),
                key: name.clone(),
                model: kind.name().into(),
                more: 0,
            })?;
        let values = entry.to_f32().unwrap_or_default();
        let host = Tensor::f_from_slice(&values)?.f_view(var.size().as_slice())?;
        var.f_copy_(&host)?;
    }
    Ok(())
}
