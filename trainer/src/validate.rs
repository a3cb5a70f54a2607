//! Checks of the numeric flags and of the memory the input batches will take, before anything
//! is allocated: every error names its flag and says what is allowed.

use ddl_loader::limits::{
    self, AugmentError, AugmentSetting, AugmentSettings, Buffers, LimitError, Setting, Settings,
};
use ddl_loader::pipeline::Output;

use crate::config::TrainConfig;
use crate::error::{Result, TrainError};

/// Largest `--bucket-mb`: one bucket of 64 GiB is already more than any model's gradient.
const MAX_BUCKET_MB: f64 = 65536.0;

/// Checks the range of every numeric flag (finite, and within what the flag means).
pub fn ranges(cfg: &TrainConfig) -> Result<()> {
    let finite = |flag: &'static str, x: f64| {
        if x.is_finite() {
            Ok(())
        } else {
            Err(TrainError::config(
                flag,
                format!("{x} is not a finite number"),
            ))
        }
    };
    let positive = |flag: &'static str, x: f64| {
        finite(flag, x)?;
        if x > 0.0 {
            Ok(())
        } else {
            Err(TrainError::config(flag, format!("{x} must be above 0")))
        }
    };
    positive("--base-lr", cfg.base_lr)?;
    if let Some(lr) = cfg.lr {
        positive("--lr", lr)?;
    }
    finite("--momentum", cfg.momentum)?;
    if !(0.0..1.0).contains(&cfg.momentum) {
        return Err(TrainError::config(
            "--momentum",
            format!("{} is outside [0, 1)", cfg.momentum),
        ));
    }
    finite("--weight-decay", cfg.weight_decay)?;
    if cfg.weight_decay < 0.0 {
        return Err(TrainError::config(
            "--weight-decay",
            format!("{} is below 0", cfg.weight_decay),
        ));
    }
    positive("--gamma", cfg.gamma)?;
    if cfg.gamma > 1.0 {
        return Err(TrainError::config(
            "--gamma",
            format!(
                "{} would raise the learning rate at each milestone; the decay factor is in (0, 1]",
                cfg.gamma
            ),
        ));
    }
    finite("--warmup-epochs", cfg.warmup_epochs)?;
    if cfg.warmup_epochs < 0.0 {
        return Err(TrainError::config(
            "--warmup-epochs",
            format!("{} is below 0", cfg.warmup_epochs),
        ));
    }
    finite("--label-smoothing", cfg.label_smoothing)?;
    if !(0.0..1.0).contains(&cfg.label_smoothing) {
        return Err(TrainError::config(
            "--label-smoothing",
            format!("{} is outside [0, 1)", cfg.label_smoothing),
        ));
    }
    positive("--bucket-mb", cfg.bucket_mb)?;
    if cfg.bucket_mb > MAX_BUCKET_MB {
        return Err(TrainError::config(
            "--bucket-mb",
            format!("{} is above {MAX_BUCKET_MB}", cfg.bucket_mb),
        ));
    }
    let at_least_one = [
        ("--epochs", u64::from(cfg.epochs)),
        ("--keep-checkpoints", cfg.keep_checkpoints as u64),
        ("--comm-timeout", cfg.comm_timeout_s),
    ];
    for (flag, value) in at_least_one {
        if value == 0 {
            return Err(TrainError::config(flag, "must be at least 1"));
        }
    }
    limits::check(&pipeline_settings(cfg)).map_err(limit_error)?;
    augment(cfg)
}

/// Checks the augmentation flags and the sizes of `--image-size-schedule` (the limits of
/// `--image-size`).
fn augment(cfg: &TrainConfig) -> Result<()> {
    limits::check_augment(&AugmentSettings {
        train: cfg.train_augment(),
        eval_resize_ratio: cfg.eval_resize_ratio,
        mean: cfg.mean,
        std: cfg.std,
    })
    .map_err(augment_error)?;
    for size in cfg.image_size_schedule.sizes() {
        let settings = Settings {
            image_size: size,
            eval_resize: 0,
            ..pipeline_settings(cfg)
        };
        limits::check(&settings).map_err(|e| {
            TrainError::config("--image-size-schedule", format!("size {size}: {e}"))
        })?;
    }
    Ok(())
}

/// A refused augmentation value as the error of its flag.
fn augment_error(e: AugmentError) -> TrainError {
    let flag = match e.setting {
        AugmentSetting::Scale => "--crop-scale",
        AugmentSetting::Ratio => "--crop-ratio",
        AugmentSetting::Flip => "--flip-prob",
        AugmentSetting::EvalResizeRatio => "--eval-resize-ratio",
        AugmentSetting::Mean => "--mean",
        AugmentSetting::Std => "--std",
    };
    TrainError::config(flag, e.to_string())
}

/// `--head-parallel` splits `classes` classes over `replicas` replicas (every replica of the
/// job): each needs a class, and every batch must have `--batch` images, as many as the
/// allgather takes from every replica, which `--on-bad-record skip` cannot promise.
pub fn head_split(cfg: &TrainConfig, classes: usize, replicas: usize) -> Result<()> {
    if !cfg.head_parallel {
        return Ok(());
    }
    if classes < replicas {
        return Err(TrainError::config(
            "--head-parallel",
            format!(
                "splits {classes} classes over {replicas} replicas (every replica of every rank): \
                 each replica needs at least one class"
            ),
        ));
    }
    if cfg.on_bad_record == ddl_loader::pipeline::OnBadRecord::Skip {
        return Err(TrainError::config(
            "--on-bad-record",
            "skip makes batches shorter than --batch, and --head-parallel gathers --batch images \
             from every replica: use replace or fail",
        ));
    }
    Ok(())
}

/// The loader's settings of a run (their limits are the loader's, shared with ddl-prof and
/// `ddl.Loader`).
pub fn pipeline_settings(cfg: &TrainConfig) -> Settings {
    Settings {
        batch: cfg.batch,
        image_size: cfg.image_size,
        workers: cfg.workers,
        prefetch: cfg.prefetch,
        eval_resize: cfg.eval_resize,
    }
}

/// The flag of a loader setting.
fn flag(setting: Setting) -> &'static str {
    match setting {
        Setting::Batch => "--batch",
        Setting::ImageSize => "--image-size",
        Setting::Workers => "--workers",
        Setting::Prefetch => "--prefetch",
        Setting::EvalResize => "--eval-resize",
    }
}

/// A refusal of the loader's limits as the error of the flags that would lift it.
pub fn limit_error(e: LimitError) -> TrainError {
    let flags = match &e {
        LimitError::Memory { .. } => "--image-size/--batch/--prefetch",
        other => other.settings().first().map_or("--batch", |s| flag(*s)),
    };
    TrainError::config(flags, e.to_string())
}

/// Fails when the batch buffers of the `ranks_on_node` ranks of this node (each with
/// `replicas` replicas, batches of `output`) would not fit in the memory available.
pub fn batch_memory(
    cfg: &TrainConfig,
    replicas: usize,
    output: Output,
    ranks_on_node: usize,
) -> Result<()> {
    let buffers = Buffers {
        replicas,
        ranks_on_node,
        output,
    };
    // The largest batches of the run: progressive resizing may grow them past --image-size.
    let largest = Settings {
        image_size: cfg
            .image_size_schedule
            .sizes()
            .fold(cfg.image_size, u32::max),
        ..pipeline_settings(cfg)
    };
    limits::check_memory(&largest, buffers, limits::available_memory()).map_err(limit_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loader_limits_name_the_flags() {
        let cfg = TrainConfig {
            workers: 100_000,
            ..TrainConfig::default()
        };
        let e = ranges(&cfg).unwrap_err().to_string();
        assert!(e.contains("--workers") && e.contains("1024"), "{e}");
        let memory = limit_error(LimitError::Memory {
            need: 2,
            available: 1,
            ranks_on_node: 1,
            replicas: 1,
            prefetch: 4,
            in_flight: 2,
            batch: 32,
            image_size: 8192,
            bytes_per_value: 4,
        })
        .to_string();
        assert!(
            memory.contains("--image-size/--batch/--prefetch"),
            "{memory}"
        );
    }

    #[test]
    fn augmentation_flags_are_checked_and_named() {
        let refused = |f: fn(&mut TrainConfig)| {
            let mut cfg = TrainConfig::default();
            f(&mut cfg);
            ranges(&cfg).unwrap_err().to_string()
        };
        type Change = fn(&mut TrainConfig);
        let cases: [(Change, &str); 7] = [
            (|c| c.crop_scale = [0.0, 1.0], "--crop-scale"),
            (|c| c.crop_ratio = [1.5, 1.0], "--crop-ratio"),
            (|c| c.flip_prob = -0.1, "--flip-prob"),
            (|c| c.eval_resize_ratio = 0.5, "--eval-resize-ratio"),
            (|c| c.std = [0.2, -1.0, 0.2], "--std"),
            (|c| c.mean = [f32::INFINITY, 0.0, 0.0], "--mean"),
            (
                |c| c.image_size_schedule = "0:160,3:8".parse().unwrap(),
                "--image-size-schedule",
            ),
        ];
        for (f, flag) in cases {
            let e = refused(f);
            assert!(e.contains(flag), "{flag}: {e}");
        }
        assert!(ranges(&TrainConfig::default()).is_ok());
    }
}
