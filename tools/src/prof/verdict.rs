//! The verdict: the node's sustained rate, the bottleneck stage and the GPUs it feeds.

use std::collections::BTreeMap;

use anyhow::{Context, Result};

use super::render::fmt_rate;
use super::report::{EndToEndRow, StageRow, Verdict};
use super::stage::Stage;

/// Computes the verdict from the rows at the largest thread count.
pub fn verdict(stages: &[StageRow], e2e: &[EndToEndRow], gpu_rate: f64) -> Result<Verdict> {
    let last = e2e
        .iter()
        .max_by_key(|r| r.threads)
        .context("no end-to-end measurement")?;
    let t = last.threads;
    let mut time_share = BTreeMap::new();
    let mut inv_sum = 0.0;
    let mut worst: Option<(Stage, f64)> = None;
    for stage in Stage::PIPELINE {
        let Some(r) = stages.iter().find(|r| r.stage == stage && r.threads == t) else {
            continue;
        };
        let rate = r.images_per_s.max(1e-9);
        inv_sum += 1.0 / rate;
        time_share.insert(stage, 1.0 / rate);
        if worst.is_none_or(|(_, w)| rate < w) {
            worst = Some((stage, rate));
        }
    }
    let (bottleneck, bottleneck_rate) = worst.context("no pipeline stage measured")?;
    for v in time_share.values_mut() {
        *v /= inv_sum;
    }
    let node = last.images_per_s;
    let exact = if gpu_rate > 0.0 { node / gpu_rate } else { 0.0 };
    let gpus = exact.floor() as u64;
    let line = format!(
        "verdict: this node sustains {} images/s end to end with {t} threads; bottleneck: {} \
         ({} images/s alone, {:.0}% of per-image time); feeds {gpus} GPU{} at {} images/s each \
         ({exact:.2})",
        fmt_rate(node),
        bottleneck,
        fmt_rate(bottleneck_rate),
        100.0 * time_share.get(&bottleneck).copied().unwrap_or(0.0),
        if gpus == 1 { "" } else { "s" },
        fmt_rate(gpu_rate),
    );
    Ok(Verdict {
        threads: t,
        node_images_per_s: node,
        bottleneck,
        bottleneck_images_per_s: bottleneck_rate,
        predicted_images_per_s: 1.0 / inv_sum.max(1e-12),
        time_share,
        gpu_rate_images_per_s: gpu_rate,
        gpus_fed: gpus,
        gpus_fed_exact: exact,
        line,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn srow(stage: Stage, threads: usize, rate: f64) -> StageRow {
        StageRow {
            stage,
            threads,
            images: 100,
            seconds: 1.0,
            images_per_s: rate,
            bytes_per_s: rate * 1000.0,
            bytes_basis: stage.bytes_basis().to_string(),
            method: "measured".to_string(),
            storage_bytes: None,
        }
    }

    fn erow(threads: usize, rate: f64) -> EndToEndRow {
        EndToEndRow {
            threads,
            images: 1000,
            batches: 10,
            seconds: 1.0,
            images_per_s: rate,
            speedup: 1.0,
            efficiency: 1.0,
            worker_busy_frac: 0.9,
            skipped: 0,
        }
    }

    #[test]
    fn verdict_picks_slowest_pipeline_stage_at_max_threads() {
        let mut stages = Vec::new();
        for (t, k) in [(1, 1.0), (4, 3.5)] {
            stages.push(srow(Stage::Read, t, 50_000.0 * k));
            stages.push(srow(Stage::Check, t, 80_000.0 * k));
            // decode_full is slower but not part of the pipeline.
            stages.push(srow(Stage::DecodeFull, t, 500.0 * k));
            stages.push(srow(Stage::DecodeRegion, t, 1_000.0 * k));
            stages.push(srow(Stage::CropResize, t, 4_000.0 * k));
            stages.push(srow(Stage::Normalize, t, 9_000.0 * k));
            stages.push(srow(Stage::Queue, t, 1e6 * k));
        }
        let v = verdict(&stages, &[erow(1, 700.0), erow(4, 2_600.0)], 1200.0).unwrap();
        assert_eq!(v.threads, 4);
        assert_eq!(v.bottleneck, Stage::DecodeRegion);
        assert_eq!(v.bottleneck_images_per_s, 3_500.0);
        assert_eq!(v.gpus_fed, 2);
        assert!((v.gpus_fed_exact - 2600.0 / 1200.0).abs() < 1e-12);
        let share: f64 = v.time_share.values().sum();
        assert!((share - 1.0).abs() < 1e-9);
        assert!(v.predicted_images_per_s < 3_500.0);
        assert!(
            v.line.contains("decode_region") && v.line.contains("2,600"),
            "{}",
            v.line
        );
        // A slow read becomes the bottleneck.
        stages.push(srow(Stage::Read, 4, 0.0));
        stages.retain(|r| !(r.stage == Stage::Read && r.threads == 4 && r.images_per_s > 0.0));
        let v = verdict(&stages, &[erow(4, 100.0)], 1200.0).unwrap();
        assert_eq!(v.bottleneck, Stage::Read);
        assert_eq!(v.gpus_fed, 0);
    }
}
