//! What `ddl-prof` profiles and how long ([`ProfConfig`]), with its checks.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Result};
use ddl_loader::dataset::Residency;
use ddl_loader::decode::DecodeMode;
use ddl_loader::limits::{self, Buffers, LimitError, Setting, Settings};
use ddl_loader::pipeline::OnBadRecord;
use ddl_loader::transform::{
    Augment, Output, TrainAugment, TransformConfig, Transformer, IMAGENET_MEAN, IMAGENET_STD,
};

/// What to profile and how long.
#[derive(Clone, Debug)]
pub struct ProfConfig {
    /// Directory with `manifest.json` and the shards.
    pub dir: PathBuf,
    /// Split to read (`train`).
    pub split: String,
    /// Thread counts to measure, ascending; the largest gives the verdict.
    pub threads: Vec<usize>,
    /// Images per batch.
    pub batch: usize,
    /// Output side in pixels.
    pub image_size: u32,
    /// Duration of each end-to-end measurement.
    pub seconds: f64,
    /// Duration of each stage measurement (per stage and thread count).
    pub stage_seconds: f64,
    /// Eval transform (resize shorter side to `image_size * 8 / 7`, center crop) instead of
    /// the train transform (random-resized crop + flip).
    pub eval: bool,
    /// Drop this node's shards from the page cache before each read measurement and each
    /// end-to-end run, so both read from storage.
    pub cold: bool,
    /// Images/s one GPU consumes, for the verdict.
    pub gpu_rate: f64,
    /// Which node's shards to profile.
    pub residency: Residency,
    /// Seed of the record order, crops and flips.
    pub seed: u64,
    /// Queue depth of the pipeline and of the `queue` stage.
    pub prefetch: usize,
    /// Records copied to RAM for the decode, resize and normalize stages.
    pub sample_records: usize,
    /// What to do with a bad record (see the module documentation).
    pub on_bad_record: OnBadRecord,
}

impl ProfConfig {
    /// Defaults for `dir`: train split, threads 1, 2, 4, ... up to the available cores,
    /// batch 256, 224 pixels, 10 s end to end and 2 s per stage, 1,200 images/s per GPU.
    pub fn new(dir: &Path) -> ProfConfig {
        ProfConfig {
            dir: dir.to_path_buf(),
            split: "train".to_string(),
            threads: default_threads(),
            batch: 256,
            image_size: 224,
            seconds: 10.0,
            stage_seconds: 2.0,
            eval: false,
            cold: false,
            gpu_rate: 1200.0,
            residency: Residency { node: 0, nodes: 1 },
            seed: 0,
            prefetch: 2,
            sample_records: 2048,
            on_bad_record: OnBadRecord::Replace,
        }
    }

    /// Checks every setting before anything is opened or measured; errors name the flag. The
    /// pipeline's settings and the memory of its batches have the loader's limits, as in
    /// ddl-train: each thread count is a pipeline's workers.
    pub fn validate(&self) -> Result<()> {
        if self.threads.is_empty() {
            bail!("--threads: give at least one thread count");
        }
        for &workers in &self.threads {
            let settings = Settings {
                batch: self.batch,
                image_size: self.image_size,
                workers,
                prefetch: self.prefetch,
                eval_resize: 0,
            };
            let buffers = Buffers {
                replicas: 1,
                ranks_on_node: 1,
                output: Output::F32Nchw,
            };
            limits::check(&settings)
                .and_then(|()| limits::check_memory(&settings, buffers, limits::available_memory()))
                .map_err(|e| anyhow!("{}: {e}", limit_flags(&e)))?;
        }
        if self.split.is_empty() {
            bail!("--split must name a split (e.g. train)");
        }
        for (flag, v) in [
            ("--seconds", self.seconds),
            ("--stage-seconds", self.stage_seconds),
            ("--gpu-rate", self.gpu_rate),
        ] {
            if !(v.is_finite() && v > 0.0) {
                bail!("{flag} {v} must be a positive number");
            }
        }
        if self.sample_records == 0 {
            bail!("--sample-records must be at least 1");
        }
        if self.residency.nodes == 0 || self.residency.node >= self.residency.nodes {
            bail!(
                "--node {} must be below --nodes {}",
                self.residency.node,
                self.residency.nodes
            );
        }
        Transformer::new(self.transform(Output::F32Nchw, DecodeMode::Region))
            .map_err(|e| anyhow!("--image-size {}: {e}", self.image_size))?;
        Ok(())
    }

    pub(super) fn augment(&self) -> Augment {
        if self.eval {
            Augment::Eval {
                resize: self.image_size * 8 / 7,
            }
        } else {
            Augment::Train
        }
    }

    pub(super) fn transform(&self, output: Output, decode: DecodeMode) -> TransformConfig {
        TransformConfig {
            size: self.image_size,
            augment: self.augment(),
            output,
            mean: IMAGENET_MEAN,
            std: IMAGENET_STD,
            seed: self.seed,
            train: TrainAugment::default(),
            decode,
        }
    }
}

/// Powers of two up to the available cores, plus the core count itself.
pub fn default_threads() -> Vec<usize> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut t: Vec<usize> = std::iter::successors(Some(1usize), |x| Some(x * 2))
        .take_while(|&x| x <= cores)
        .collect();
    if t.last() != Some(&cores) {
        t.push(cores);
    }
    t
}

/// The ddl-prof flags that would lift a refusal of the loader's limits.
fn limit_flags(e: &LimitError) -> String {
    e.named(|s| match s {
        Setting::Batch => "--batch",
        Setting::ImageSize => "--image-size",
        Setting::Workers => "--threads",
        Setting::Prefetch => "--prefetch",
        Setting::EvalResize => "--eval",
    })
}
