//! End to end on one rank with two CPU replicas: the small ResNet learns easy classes, the
//! metrics file has one line per step and per epoch with the documented fields, and the
//! replicas stay identical (checked every epoch).

use crate::common;

use std::sync::Arc;

use ddl_comm::{thread_group, Topology, Transport};
use ddl_trainer::{train, RankInfo};

#[test]
fn resnet_small_learns_and_reports() {
    let tmp = ddl_testkit::scratch("learn");
    let dir = tmp.path();
    let data = dir.join("data");
    common::make_dataset(&data, 4, 48, 12, 2, 2, 40);
    let mut cfg = common::config(&data, "resnet_small", 8, "cpu:2");
    cfg.epochs = 4;
    cfg.eval = true;
    cfg.warmup_epochs = 1.0;
    cfg.schedule = ddl_trainer::schedule::DecayKind::Cosine;
    cfg.label_smoothing = 0.1;
    cfg.nesterov = true;
    cfg.check_replicas = true;
    cfg.metrics = Some(dir.join("m.jsonl"));
    let t: Arc<dyn Transport> = Arc::new(thread_group(1).pop().unwrap());
    let summary = train(&cfg, t, Topology::new(1, 1), RankInfo::single()).unwrap();
    // 192 records / (2 replicas x 8) = 12 steps per epoch.
    assert_eq!(summary.global_steps, 48);
    let text = std::fs::read_to_string(dir.join("m.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let steps: Vec<&serde_json::Value> = lines.iter().filter(|l| l["type"] == "step").collect();
    let epochs: Vec<&serde_json::Value> = lines.iter().filter(|l| l["type"] == "epoch").collect();
    assert_eq!(steps.len(), 48);
    assert_eq!(epochs.len(), 4);
    for s in &steps {
        for k in [
            "step",
            "epoch",
            "loss",
            "lr",
            "images_per_s",
            "data_wait_s",
            "compute_s",
            "allreduce_s",
        ] {
            assert!(s[k].is_number(), "step line lacks {k}: {s}");
        }
    }
    // Warmup: the rate rises over the first epoch (12 steps), then decays.
    let lr: Vec<f64> = steps.iter().map(|s| s["lr"].as_f64().unwrap()).collect();
    assert!(lr[0] < lr[11] && lr[11] > lr[47]);
    for e in &epochs {
        for k in [
            "train_loss",
            "val_loss",
            "val_top1",
            "val_top5",
            "epoch_s",
            "images_per_s",
            "data_wait_frac",
        ] {
            assert!(e[k].is_number(), "epoch line lacks {k}: {e}");
        }
    }
    let first = epochs[0]["train_loss"].as_f64().unwrap();
    let last = epochs[3]["train_loss"].as_f64().unwrap();
    let top1 = epochs[3]["val_top1"].as_f64().unwrap();
    assert!(last < first, "train loss did not fall: {first} -> {last}");
    assert_eq!(
        epochs[3]["val_images"].as_u64(),
        Some(48),
        "every val record once"
    );
    assert!(top1 >= 0.75, "val top-1 only {top1}");
    assert_eq!(
        epochs[3]["val_top5"].as_f64().unwrap(),
        1.0,
        "4 classes: top-5 is always right"
    );
}
