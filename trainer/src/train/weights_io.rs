//! A run's model in and out: `init_from` loads weights with torchvision's names before the
//! first step, `export` writes the final model as a torchvision-compatible safetensors file
//! (see [`crate::weights`]).

use std::path::Path;

use crate::config::Setting;
use crate::error::{Result, TrainError};
use crate::flag::Named;
use crate::model::ModelKind;
use crate::weights::meta::ModelMeta;
use crate::weights::{self, file, Spec, StateDict, WeightsError};

use super::eval_at::EvalAt;
use super::run::Run;

impl Run<'_> {
    /// `init_from`: every replica starts from the weights and BatchNorm statistics of `path`
    /// (the classifier head from the seed instead with `reset_head`), momentum zero. Rank 0
    /// reads the file and broadcasts its bytes, so only rank 0 needs to see it; every rank then
    /// checks it the same way, so a bad file fails every rank before the first step, naming
    /// the key.
    pub(super) fn init_from(&mut self, path: &Path) -> Result<()> {
        let bytes = self.fetch_file(path)?;
        let (dict, metadata) = file::parse(&bytes, path)?;
        let model = self.cfg.model.name();
        // A ddl file names its architecture: say so rather than list mismatching shapes. Other
        // tools' metadata (anything that is not one of ddl's model names) is not ours to read.
        let named = metadata.get("model").map(String::as_str);
        if let Some(other) = named.filter(|m| ModelKind::from_name(m).is_some() && *m != model) {
            return Err(WeightsError::Metadata {
                path: path.to_path_buf(),
                key: "model".into(),
                message: format!(
                    "the file holds a {other}, this run trains {} {model}",
                    Setting::Model
                ),
            }
            .into());
        }
        let layout = self.table.layout().clone();
        let spec = Spec::of_variables(model, &layout.variables());
        dict.check(&spec, path, self.cfg.reset_head)?;
        // Every rank has the whole seeded model: the seed draws the same values everywhere.
        let initial = self.seeded()?;
        let reset = self.cfg.reset_head;
        let params: Vec<Vec<f32>> = layout
            .model_params()
            .zip(initial.params)
            .map(|(p, seeded)| match dict.f32_values(&p.name) {
                Some(v) if !(reset && weights::is_head(&p.name)) => v,
                _ => seeded,
            })
            .collect();
        let buffers: Vec<Vec<f32>> = layout
            .buffers
            .iter()
            .zip(initial.buffers)
            .map(|((name, _), seeded)| dict.f32_values(name).unwrap_or(seeded))
            .collect();
        self.set_whole(&params, &initial.momentum, &|_| Ok(buffers.clone()))?;
        self.batches_tracked_base = dict.batches_tracked();
        if self.is_root() && self.cfg.verbose {
            let head = if reset {
                format!(
                    ", classifier head re-initialised for {} classes",
                    self.plan.manifest.num_classes()
                )
            } else {
                String::new()
            };
            ddl_cli::outln!(
                "init-from: {} ({} tensors of {model}{head})",
                path.display(),
                dict.tensors.len()
            );
        }
        Ok(())
    }

    /// The bytes of the file `path` on every rank: rank 0 reads it and broadcasts them (or
    /// why it could not), so that every rank fails alike.
    fn fetch_file(&mut self, path: &Path) -> Result<Vec<u8>> {
        let read = if self.is_root() {
            Some(std::fs::read(path).map_err(|source| WeightsError::Io {
                path: path.to_path_buf(),
                source,
            }))
        } else {
            None
        };
        let payload = match &read {
            Some(Ok(bytes)) => [&[0u8][..], bytes].concat(),
            Some(Err(e)) => [&[1u8][..], e.to_string().as_bytes()].concat(),
            None => Vec::new(),
        };
        drop(read);
        let payload = self.comm.broadcast_bytes(payload)?;
        match payload.split_first() {
            Some((0, _)) => {
                let mut bytes = payload;
                bytes.drain(..1);
                Ok(bytes)
            }
            Some((_, message)) => Err(TrainError::FromRoot(
                String::from_utf8_lossy(message).into_owned(),
            )),
            None => Err(TrainError::FromRoot(format!(
                "{}: nothing received",
                Setting::InitFrom
            ))),
        }
    }

    /// `export`: writes the final model to `path` (rank 0), with the validation accuracy of
    /// exactly these weights in its metadata. Collective: when the last evaluation was not of
    /// the weights after `global` steps (a run cut short by `max_steps`, or one that trained
    /// no step), every rank evaluates them first.
    pub(super) fn export(&mut self, path: &Path, epoch: u64, global: u64) -> Result<()> {
        let evaluated = match self.last_eval.filter(|e| e.step == global) {
            Some(e) => Some(e),
            None => {
                let sums = self.evaluate(epoch)?.filter(|v| v.count > 0.0);
                let at = sums.map(|v| EvalAt {
                    step: global,
                    top1: Some(v.top1 / v.count),
                    top5: Some(v.top5 / v.count),
                });
                if let (Some(at), Some(v)) = (at, sums) {
                    if self.is_root() && self.cfg.verbose {
                        ddl_cli::outln!(
                            "final evaluation after global step {global}: val top-1 {:.2}%  \
                             top-5 {:.2}%  ({} images)",
                            at.top1.unwrap_or(0.0) * 100.0,
                            at.top5.unwrap_or(0.0) * 100.0,
                            v.count
                        );
                    }
                    self.last_eval = Some(at);
                }
                at
            }
        };
        let (_, whole) = self.whole()?;
        let Some(whole) = whole.filter(|_| self.is_root()) else {
            return Ok(());
        };
        let layout = self.table.layout();
        let model = self.cfg.model.name();
        let base = &self.batches_tracked_base;
        let vars = layout.variables();
        let dict = StateDict::from_ddl(
            &Spec::of_variables(model, &vars),
            &vars,
            &whole.params,
            &whole.buffers,
            &|bn| base.get(bn).copied().unwrap_or(0) + global as i64,
        );
        let meta = ModelMeta {
            model: model.to_string(),
            classes: self.class_names(),
            image_size: self.cfg.image_size,
            eval_resize: self.cfg.eval_resize_px(),
            mean: self.cfg.mean,
            std: self.cfg.std,
            ddl_version: env!("CARGO_PKG_VERSION").to_string(),
            flags: Some(serde_json::to_value(self.cfg).unwrap_or_default()),
            global_step: Some(global),
            val_top1: evaluated.and_then(|e| e.top1),
            val_top5: evaluated.and_then(|e| e.top5),
            batchnorm_statistics: Some(weights::EXPORTED_STATISTICS.to_string()),
        };
        file::write(path, &dict, &meta.to_map())?;
        if self.cfg.verbose {
            let pct = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.2}%", v * 100.0));
            ddl_cli::outln!(
                "export: {} ({model}, {} classes, {} tensors, val top-1 {} top-5 {})",
                path.display(),
                meta.classes.len(),
                dict.tensors.len(),
                pct(meta.val_top1),
                pct(meta.val_top5)
            );
        }
        Ok(())
    }

    /// The class names (WordNet ids) in label order.
    pub(super) fn class_names(&self) -> Vec<String> {
        self.plan
            .manifest
            .classes
            .iter()
            .map(|c| c.wnid.clone())
            .collect()
    }
}
