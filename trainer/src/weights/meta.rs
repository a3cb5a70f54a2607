//! ddl's metadata in a weights file: what a user (or `ddl-predict`) needs to run the model
//! without ddl's checkpoint or data: the architecture, the classes in label order, the eval
//! transform, and where the weights came from.
//!
//! Safetensors metadata is a map of strings to strings; lists and numbers are stored as JSON
//! text. In Python: `json.loads(safe_open(path, "pt").metadata()["classes"])`.

use std::path::Path;

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::file::Metadata;
use super::WeightsError;

/// Metadata of a model written by ddl.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelMeta {
    /// Architecture, as `model` names it (`resnet50`).
    pub model: String,
    /// Class names (WordNet ids) in label order: logit `i` is class `classes[i]`.
    pub classes: Vec<String>,
    /// Square input side in pixels of training and evaluation.
    pub image_size: u32,
    /// Shorter side of the eval resize before the center crop of `image_size`.
    pub eval_resize: u32,
    /// Channel means (RGB, 0-1 scale) of the input normalisation.
    pub mean: [f32; 3],
    /// Channel standard deviations (RGB, 0-1 scale).
    pub std: [f32; 3],
    /// Version of ddl that wrote the file.
    pub ddl_version: String,
    /// The training run's flags (`ddl-train`'s configuration as JSON), if known.
    pub flags: Option<Value>,
    /// Optimizer steps the weights were trained for.
    pub global_step: Option<u64>,
    /// Validation top-1 accuracy of exactly these weights and statistics, if measured.
    pub val_top1: Option<f64>,
    /// Validation top-5 accuracy, if measured.
    pub val_top5: Option<f64>,
    /// Whose BatchNorm statistics the file holds (e.g. "rank 0, replica 0").
    pub batchnorm_statistics: Option<String>,
}

impl ModelMeta {
    /// The metadata as safetensors stores it. `format: pt` marks the tensors as PyTorch's
    /// layout for tools that check it.
    pub fn to_map(&self) -> Metadata {
        let mut m = Metadata::new();
        let mut put = |k: &str, v: String| {
            m.insert(k.to_string(), v);
        };
        put("format", "pt".into());
        put("model", self.model.clone());
        put("classes", json(&self.classes));
        put("num_classes", self.classes.len().to_string());
        put("image_size", self.image_size.to_string());
        put("eval_resize", self.eval_resize.to_string());
        put("mean", json(&self.mean));
        put("std", json(&self.std));
        put("ddl_version", self.ddl_version.clone());
        if let Some(f) = &self.flags {
            put("flags", f.to_string());
        }
        if let Some(s) = self.global_step {
            put("global_step", s.to_string());
        }
        if let Some(v) = self.val_top1 {
            put("val_top1", v.to_string());
        }
        if let Some(v) = self.val_top5 {
            put("val_top5", v.to_string());
        }
        if let Some(b) = &self.batchnorm_statistics {
            put("batchnorm_statistics", b.clone());
        }
        m
    }

    /// ddl's metadata in `map`, or `None` when the file carries none (no `model` key, e.g. a
    /// state dict saved from torchvision). A ddl file with a missing or bad field is an error
    /// naming the field; `path` only names the file in errors.
    pub fn from_map(map: &Metadata, path: &Path) -> Result<Option<ModelMeta>, WeightsError> {
        let Some(model) = map.get("model") else {
            return Ok(None);
        };
        let f = Fields { map, path };
        let image_size: u32 = f.required("image_size")?;
        let eval_resize: u32 = f.required("eval_resize")?;
        if image_size == 0 || eval_resize < image_size {
            return Err(f.bad(
                "eval_resize",
                format!("{eval_resize} for image size {image_size}: must be at least the size"),
            ));
        }
        let classes: Vec<String> = f.required("classes")?;
        if classes.is_empty() {
            return Err(f.bad("classes", "empty".into()));
        }
        Ok(Some(ModelMeta {
            model: model.clone(),
            classes,
            image_size,
            eval_resize,
            mean: f.required("mean")?,
            std: f.required("std")?,
            ddl_version: map.get("ddl_version").cloned().unwrap_or_default(),
            flags: f.optional("flags")?,
            global_step: f.optional("global_step")?,
            val_top1: f.optional("val_top1")?,
            val_top5: f.optional("val_top5")?,
            batchnorm_statistics: map.get("batchnorm_statistics").cloned(),
        }))
    }
}

/// JSON text of a metadata value.
fn json<T: serde::Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// Typed reads of the JSON-text fields of a file's metadata.
struct Fields<'a> {
    map: &'a Metadata,
    path: &'a Path,
}

impl Fields<'_> {
    fn bad(&self, key: &str, message: String) -> WeightsError {
        WeightsError::Metadata {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            message,
        }
    }

    fn optional<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, WeightsError> {
        self.map
            .get(key)
            .map(|text| {
                serde_json::from_str(text).map_err(|e| self.bad(key, format!("{text:?}: {e}")))
            })
            .transpose()
    }

    fn required<T: DeserializeOwned>(&self, key: &str) -> Result<T, WeightsError> {
        self.optional(key)?
            .ok_or_else(|| self.bad(key, "missing (ddl writes it with the model)".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ModelMeta {
        ModelMeta {
            model: "resnet18".into(),
            classes: vec!["n01440764".into(), "n01443537".into()],
            image_size: 224,
            eval_resize: 256,
            mean: [0.485, 0.456, 0.406],
            std: [0.229, 0.224, 0.225],
            ddl_version: "0.1.0".into(),
            flags: Some(serde_json::json!({"seed": 3})),
            global_step: Some(120),
            val_top1: Some(0.75),
            val_top5: None,
            batchnorm_statistics: Some("rank 0, replica 0".into()),
        }
    }

    #[test]
    fn round_trip_and_readable_values() {
        let m = sample().to_map();
        assert_eq!(m["classes"], r#"["n01440764","n01443537"]"#);
        assert_eq!(m["image_size"], "224");
        assert_eq!(m["val_top1"], "0.75");
        assert!(!m.contains_key("val_top5"));
        let back = ModelMeta::from_map(&m, Path::new("f")).unwrap().unwrap();
        assert_eq!(back, sample());
    }

    #[test]
    fn foreign_files_have_none_and_bad_fields_are_named() {
        assert_eq!(
            ModelMeta::from_map(&Metadata::new(), Path::new("f")).unwrap(),
            None
        );
        let mut m = sample().to_map();
        m.insert("mean".into(), "[0.5, 0.5]".into());
        let e = ModelMeta::from_map(&m, Path::new("f"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("f: metadata mean:"), "{e}");
        let mut m = sample().to_map();
        m.remove("classes");
        let e = ModelMeta::from_map(&m, Path::new("f"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("metadata classes: missing"), "{e}");
    }
}
