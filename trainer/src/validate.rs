//! Checks of the numeric settings and of the memory the input batches will take, before
//! anything is allocated: every error names its setting and says what is allowed.

use ddl_loader::limits::{
    self, AugmentError, AugmentSetting, AugmentSettings, Buffers, LimitError, Settings,
};
use ddl_loader::pipeline::Output;

use crate::config::Setting;
use crate::config::TrainConfig;
use crate::error::{Result, TrainError};

/// Largest `bucket_mb`: one bucket of 64 GiB is already more than any model's gradient.
const MAX_BUCKET_MB: f64 = 65536.0;

/// Checks the range of every numeric setting (finite, and within what the setting means).
pub fn ranges(cfg: &TrainConfig) -> Result<()> {
    let finite = |setting: Setting, x: f64| {
        if x.is_finite() {
            Ok(())
        } else {
            Err(TrainError::config(
                setting,
                format!("{x} is not a finite number"),
            ))
        }
    };
    let positive = |setting: Setting, x: f64| {
        finite(setting, x)?;
        if x > 0.0 {
            Ok(())
        } else {
            Err(TrainError::config(setting, format!("{x} must be above 0")))
        }
    };
    positive(Setting::BaseLr, cfg.base_lr)?;
    if let Some(lr) = cfg.lr {
        positive(Setting::Lr, lr)?;
    }
    finite(Setting::Momentum, cfg.momentum)?;
    if !(0.0..1.0).contains(&cfg.momentum) {
        return Err(TrainError::config(
            Setting::Momentum,
            format!("{} is outside [0, 1)", cfg.momentum),
        ));
    }
    finite(Setting::WeightDecay, cfg.weight_decay)?;
    if cfg.weight_decay < 0.0 {
        return Err(TrainError::config(
            Setting::WeightDecay,
            format!("{} is below 0", cfg.weight_decay),
        ));
    }
    positive(Setting::Gamma, cfg.gamma)?;
    if cfg.gamma > 1.0 {
        return Err(TrainError::config(
            Setting::Gamma,
            format!(
                "{} would raise the learning rate at each milestone; the decay factor is in (0, 1]",
                cfg.gamma
            ),
        ));
    }
    finite(Setting::WarmupEpochs, cfg.warmup_epochs)?;
    if cfg.warmup_epochs < 0.0 {
        return Err(TrainError::config(
            Setting::WarmupEpochs,
            format!("{} is below 0", cfg.warmup_epochs),
        ));
    }
    finite(Setting::LabelSmoothing, cfg.label_smoothing)?;
    if !(0.0..1.0).contains(&cfg.label_smoothing) {
        return Err(TrainError::config(
            Setting::LabelSmoothing,
            format!("{} is outside [0, 1)", cfg.label_smoothing),
        ));
    }
    finite(Setting::Exchange, cfg.exchange)?;
    if let Some(why) = ddl_loader::exchange_args::fraction_error(cfg.exchange) {
        return Err(TrainError::config(Setting::Exchange, why));
    }
    positive(Setting::BucketMb, cfg.bucket_mb)?;
    if cfg.bucket_mb > MAX_BUCKET_MB {
        return Err(TrainError::config(
            Setting::BucketMb,
            format!("{} is above {MAX_BUCKET_MB}", cfg.bucket_mb),
        ));
    }
    let at_least_one = [
        (Setting::Epochs, u64::from(cfg.epochs)),
        (Setting::KeepCheckpoints, cfg.keep_checkpoints as u64),
        (Setting::CommTimeoutS, cfg.comm_timeout_s),
    ];
    for (setting, value) in at_least_one {
        if value == 0 {
            return Err(TrainError::config(setting, "must be at least 1"));
        }
    }
    limits::check(&pipeline_settings(cfg)).map_err(limit_error)?;
    augment(cfg)
}

/// Checks the augmentation settings and the sizes of `image_size_schedule` (the limits of
/// `image_size`).
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
            TrainError::config(Setting::ImageSizeSchedule, format!("size {size}: {e}"))
        })?;
    }
    Ok(())
}

/// A refused augmentation value as the error of its setting.
fn augment_error(e: AugmentError) -> TrainError {
    let setting = match e.setting {
        AugmentSetting::Scale => Setting::CropScale,
        AugmentSetting::Ratio => Setting::CropRatio,
        AugmentSetting::Flip => Setting::FlipProb,
        AugmentSetting::EvalResizeRatio => Setting::EvalResizeRatio,
        AugmentSetting::Mean => Setting::Mean,
        AugmentSetting::Std => Setting::Std,
    };
    TrainError::config(setting, e.to_string())
}

/// `head_parallel` splits `classes` classes over `replicas` replicas (every replica of the
/// job): each needs a class, and every batch must have `batch` images, as many as the
/// allgather takes from every replica, which `on_bad_record` skip cannot promise.
pub fn head_split(cfg: &TrainConfig, classes: usize, replicas: usize) -> Result<()> {
    if !cfg.head_parallel {
        return Ok(());
    }
    if classes < replicas {
        return Err(TrainError::config(
            Setting::HeadParallel,
            format!(
                "splits {classes} classes over {replicas} replicas (every replica of every rank): \
                 each replica needs at least one class"
            ),
        ));
    }
    if cfg.on_bad_record == ddl_loader::pipeline::OnBadRecord::Skip {
        return Err(TrainError::config(
            Setting::OnBadRecord,
            format!(
                "skip makes batches shorter than {batch}, and {hp} gathers {batch} images \
                 from every replica: use replace or fail",
                batch = Setting::Batch,
                hp = Setting::HeadParallel
            ),
        ));
    }
    Ok(())
}

/// `compile` runs the step as one graph of the whole model over a whole batch, compiled for
/// that batch size: refused with the settings that need the model cut apart (`head_parallel`,
/// `overlap` backward) or batches of any size (`on_bad_record` skip).
pub fn compile(cfg: &TrainConfig) -> Result<()> {
    if !cfg.compile {
        let needs = |other: Setting, what: &str| {
            Err(TrainError::Config {
                settings: vec![other, Setting::Compile],
                message: format!("{what} the compiled step: add {}", Setting::Compile),
            })
        };
        if cfg.cuda_graphs {
            return needs(Setting::CudaGraphs, "CUDA graphs replay");
        }
        if !cfg.inductor_options.is_empty() {
            return needs(Setting::InductorOptions, "Inductor's options shape");
        }
        return Ok(());
    }
    for option in &cfg.inductor_options {
        let key = option.split_once('=').map(|(k, _)| k);
        let named = |k: &str| {
            !k.is_empty()
                && k.split('.').all(|part| {
                    part.chars()
                        .next()
                        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                        && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                })
        };
        if !key.is_some_and(named) {
            return Err(TrainError::config(
                Setting::InductorOptions,
                format!("{option:?}: expected KEY=VALUE, KEY a name of torch._inductor.config"),
            ));
        }
    }
    let refuse = |other: Setting, why: String| {
        Err(TrainError::Config {
            settings: vec![Setting::Compile, other],
            message: why,
        })
    };
    if cfg.head_parallel {
        return refuse(
            Setting::HeadParallel,
            "the compiled step computes the whole classifier on every replica, which \
             head-parallel splits over them: use one or the other"
                .into(),
        );
    }
    if cfg.overlap == Some(crate::config::Overlap::Backward) {
        return refuse(
            Setting::Overlap,
            format!(
                "the compiled step is one graph whose gradients are complete only at its \
                 end, so backward has no stages to reduce during: use {} pipeline (the \
                 default with {})",
                Setting::Overlap,
                Setting::Compile
            ),
        );
    }
    if cfg.on_bad_record == ddl_loader::pipeline::OnBadRecord::Skip {
        return refuse(
            Setting::OnBadRecord,
            format!(
                "skip makes batches shorter than {}, and the step is compiled for that \
                 size: use replace or fail",
                Setting::Batch
            ),
        );
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

/// The setting of the run that is the loader's `setting`.
fn of_loader(setting: limits::Setting) -> Setting {
    match setting {
        limits::Setting::Batch => Setting::Batch,
        limits::Setting::ImageSize => Setting::ImageSize,
        limits::Setting::Workers => Setting::Workers,
        limits::Setting::Prefetch => Setting::Prefetch,
        limits::Setting::EvalResize => Setting::EvalResize,
    }
}

/// A refusal of the loader's limits as the error of the settings that would lift it.
pub fn limit_error(e: LimitError) -> TrainError {
    let settings = match &e {
        LimitError::Memory { .. } => vec![Setting::ImageSize, Setting::Batch, Setting::Prefetch],
        other => vec![other
            .settings()
            .first()
            .map_or(Setting::Batch, |s| of_loader(*s))],
    };
    TrainError::Config {
        settings,
        message: e.to_string(),
    }
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
    // The largest batches of the run: progressive resizing may grow them past `image_size`.
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
    fn loader_limits_name_the_settings() {
        let cfg = TrainConfig {
            workers: 100_000,
            ..TrainConfig::default()
        };
        match ranges(&cfg).unwrap_err() {
            TrainError::Config { settings, message } => {
                assert_eq!(settings, [Setting::Workers]);
                assert!(message.contains("1024"), "{message}");
            }
            other => panic!("{other}"),
        }
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
        });
        assert!(
            matches!(&memory, TrainError::Config { settings, .. }
                if settings == &[Setting::ImageSize, Setting::Batch, Setting::Prefetch]),
            "{memory}"
        );
    }

    #[test]
    fn augmentation_settings_are_checked_and_named() {
        type Change = fn(&mut TrainConfig);
        let cases: [(Change, Setting); 7] = [
            (|c| c.crop_scale = [0.0, 1.0], Setting::CropScale),
            (|c| c.crop_ratio = [1.5, 1.0], Setting::CropRatio),
            (|c| c.flip_prob = -0.1, Setting::FlipProb),
            (|c| c.eval_resize_ratio = 0.5, Setting::EvalResizeRatio),
            (|c| c.std = [0.2, -1.0, 0.2], Setting::Std),
            (|c| c.mean = [f32::INFINITY, 0.0, 0.0], Setting::Mean),
            (
                |c| c.image_size_schedule = "0:160,3:8".parse().unwrap(),
                Setting::ImageSizeSchedule,
            ),
        ];
        for (change, want) in cases {
            let mut cfg = TrainConfig::default();
            change(&mut cfg);
            match ranges(&cfg).unwrap_err() {
                TrainError::Config { settings, .. } => assert_eq!(settings, [want]),
                other => panic!("{other}"),
            }
        }
        assert!(ranges(&TrainConfig::default()).is_ok());
    }
}
