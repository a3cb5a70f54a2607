//! Checks of the numeric flags and of the memory the input batches will take, before anything
//! is allocated: every error names its flag and says what is allowed.

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
        ("--batch", cfg.batch as u64),
        ("--epochs", u64::from(cfg.epochs)),
        ("--workers", cfg.workers as u64),
        ("--prefetch", cfg.prefetch as u64),
        ("--keep-checkpoints", cfg.keep_checkpoints as u64),
        ("--comm-timeout", cfg.comm_timeout_s),
    ];
    for (flag, value) in at_least_one {
        if value == 0 {
            return Err(TrainError::config(flag, "must be at least 1"));
        }
    }
    if cfg.image_size < 16 {
        return Err(TrainError::config(
            "--image-size",
            format!("{} is below 16 pixels", cfg.image_size),
        ));
    }
    if cfg.eval_resize != 0 && cfg.eval_resize < cfg.image_size {
        return Err(TrainError::config(
            "--eval-resize",
            format!(
                "{} is below --image-size {}: the center crop would not fit (0 = image size x 8/7)",
                cfg.eval_resize, cfg.image_size
            ),
        ));
    }
    Ok(())
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

/// Bytes of the loader's batch buffers on one rank: `replicas x (prefetch + 1) + min(workers,
/// 2)` buffers (see `ddl_loader::pipeline`) of `batch x 3 x size x size` values of
/// `bytes_per_value` bytes (4 for f32 on CPUs, 1 for u8 sent to GPUs).
pub fn batch_bytes(cfg: &TrainConfig, replicas: usize, bytes_per_value: u64) -> u64 {
    let buffers = (replicas * (cfg.prefetch + 1) + cfg.workers.min(2)) as u64;
    let side = u64::from(cfg.image_size);
    buffers
        .saturating_mul(cfg.batch as u64)
        .saturating_mul(3 * side * side)
        .saturating_mul(bytes_per_value)
}

/// Memory available for new allocations on this machine (`MemAvailable` of /proc/meminfo), if
/// the kernel says.
pub fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Fails when the batch buffers of the `ranks_on_node` ranks of this node (each with
/// `replicas` replicas) would not fit in `available` bytes.
pub fn batch_memory(
    cfg: &TrainConfig,
    replicas: usize,
    bytes_per_value: u64,
    ranks_on_node: usize,
    available: Option<u64>,
) -> Result<()> {
    let Some(available) = available else {
        return Ok(());
    };
    let per_rank = batch_bytes(cfg, replicas, bytes_per_value);
    let need = per_rank.saturating_mul(ranks_on_node as u64);
    if need <= available {
        return Ok(());
    }
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    Err(TrainError::config(
        "--image-size/--batch/--prefetch",
        format!(
            "the input batches of {ranks_on_node} rank(s) on this node need {need} bytes ({:.1} GiB: \
             {} replica(s) x ({} prefetched + 1) + {} in flight, each {} images of 3 x {} x {} x {bytes_per_value} \
             bytes), but only {available} bytes ({:.1} GiB) are available (MemAvailable); lower \
             --image-size, --batch or --prefetch",
            gib(need),
            replicas,
            cfg.prefetch,
            cfg.workers.min(2),
            cfg.batch,
            cfg.image_size,
            cfg.image_size,
            gib(available),
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_memory_names_flags_and_bytes() {
        let mut cfg = TrainConfig {
            image_size: 8192,
            batch: 32,
            prefetch: 4,
            workers: 2,
            ..TrainConfig::default()
        };
        // 1 replica: 5 + 2 buffers of 32 x 3 x 8192^2 f32.
        let want = 7 * 32 * 3 * 8192 * 8192 * 4u64;
        assert_eq!(batch_bytes(&cfg, 1, 4), want);
        let e = batch_memory(&cfg, 1, 4, 2, Some(1 << 34))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--image-size"), "{e}");
        assert!(e.contains(&(2 * want).to_string()), "{e}");
        assert!(e.contains("MemAvailable"), "{e}");
        cfg.image_size = 224;
        batch_memory(&cfg, 1, 4, 2, Some(1 << 34)).unwrap();
        batch_memory(&cfg, 1, 4, 2, None).unwrap();
    }
}
