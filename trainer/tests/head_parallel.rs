//! `--head-parallel` on ranks simulated by threads: the data-parallel trajectory within rounding
//! (every step's loss, the final weights, the evaluation), on an even and an uneven split of
//! the head, with and without label smoothing; evaluation of the same weights identical to
//! the data-parallel one; checkpoints that resume bitwise, that ddl-export writes whole, that a
//! data-parallel run of the same layout continues, and that refuse another layout.

use crate::common;

use std::path::{Path, PathBuf};

use ddl_trainer::config::Overlap;
use ddl_trainer::metrics::EpochRecord;
use ddl_trainer::weights::{file, meta::ModelMeta};
use ddl_trainer::{Setting, TrainConfig, TrainError};

type Weights = Vec<(String, Vec<f32>)>;

/// What a run leaves: its final weights, every step's loss, its epochs.
struct Ran {
    weights: Weights,
    losses: Vec<f64>,
    epochs: Vec<EpochRecord>,
}

fn run(cfg: &TrainConfig, ranks: usize, dir: &Path, name: &str) -> Ran {
    let mut cfg = cfg.clone();
    let dump = dir.join(format!("{name}.bin"));
    let metrics = dir.join(format!("{name}.jsonl"));
    cfg.dump_weights = Some(dump.clone());
    cfg.metrics = Some(metrics.clone());
    let summary = common::run_ranks(&cfg, ranks);
    let losses = std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["type"] == "step")
        .map(|v| v["loss"].as_f64().unwrap())
        .collect();
    Ran {
        weights: ddl_testkit::read_dump(&dump),
        losses,
        epochs: summary.epochs,
    }
}

fn dataset(dir: &Path) -> PathBuf {
    let data = dir.join("data");
    // 7 classes: 4 replicas get 2, 2, 2 and 1; 3 get 3, 2 and 2.
    common::make_dataset(&data, 7, 24, 4, 2, 1, 36);
    data
}

fn config(data: &Path, devices: &str) -> TrainConfig {
    let mut cfg = common::config(data, "resnet_small", 4, devices);
    cfg.overlap = Some(Overlap::Backward);
    cfg.bucket_mb = 0.01;
    cfg.eval = true;
    cfg
}

#[test]
fn the_split_head_follows_the_data_parallel_trajectory() {
    let tmp = ddl_testkit::scratch("head-parallel");
    let data = dataset(tmp.path());
    for (ranks, devices, smoothing) in [(2, "cpu:2", 0.0), (3, "cpu:1", 0.1)] {
        let mut cfg = config(&data, devices);
        cfg.label_smoothing = smoothing;
        let what = format!("{ranks} ranks x {devices}, label smoothing {smoothing}");
        let dp = run(&cfg, ranks, tmp.path(), &format!("dp-{ranks}"));
        cfg.head_parallel = true;
        let hp = run(&cfg, ranks, tmp.path(), &format!("hp-{ranks}"));
        assert!(dp.losses.len() >= 10, "{what}: {} steps", dp.losses.len());
        assert_eq!(hp.losses.len(), dp.losses.len());
        for (step, (a, b)) in hp.losses.iter().zip(&dp.losses).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs(),
                "{what}: step {step} loss {a} vs {b}"
            );
        }
        let (all, head) = ddl_testkit::relative_difference(&hp.weights, &dp.weights, "fc.");
        assert!(
            all <= 1e-5 && head <= 1e-5,
            "{what}: weights {all}, head {head}"
        );
        let (e, d) = (&hp.epochs[0], &dp.epochs[0]);
        assert_eq!((e.val_top1, e.val_top5), (d.val_top1, d.val_top5), "{what}");
        assert_eq!(e.val_images, Some(28), "{what}");
        let (a, b) = (e.val_loss.unwrap(), d.val_loss.unwrap());
        assert!((a - b).abs() <= 1e-5 * b, "{what}: val loss {a} vs {b}");
        // The comparison is sensitive: the data-parallel run had moved far from its start.
        let mut start = config(&data, devices);
        start.max_steps = Some(0);
        let init = run(&start, ranks, tmp.path(), &format!("init-{ranks}"));
        assert!(
            ddl_testkit::relative_difference(&init.weights, &dp.weights, "fc.").1 > 1e-2,
            "{what}: nothing learnt"
        );
    }
}

/// The val top-1 / top-5 and loss the run with `cfg` records in its `--export` file.
fn exported_eval(cfg: &TrainConfig, ranks: usize, path: &Path) -> (f64, f64) {
    let mut cfg = cfg.clone();
    cfg.export = Some(path.to_path_buf());
    common::run_ranks(&cfg, ranks);
    let (_, metadata) = file::read(path).unwrap();
    let m = ModelMeta::from_map(&metadata, path).unwrap().unwrap();
    (m.val_top1.unwrap(), m.val_top5.unwrap())
}

#[test]
fn evaluation_of_the_same_weights_is_the_data_parallel_one() {
    let tmp = ddl_testkit::scratch("head-parallel-eval");
    let data = dataset(tmp.path());
    // Weights that classify some images and not others: one epoch of training.
    let trained = tmp.path().join("trained.safetensors");
    let mut cfg = config(&data, "cpu:1");
    cfg.export = Some(trained.clone());
    common::run_ranks(&cfg, 1);
    for (ranks, devices) in [(2, "cpu:2"), (3, "cpu:1")] {
        let mut cfg = config(&data, devices);
        cfg.init_from = Some(trained.clone());
        cfg.max_steps = Some(0);
        let dp = exported_eval(&cfg, ranks, &tmp.path().join(format!("dp-{ranks}.st")));
        cfg.head_parallel = true;
        let hp = exported_eval(&cfg, ranks, &tmp.path().join(format!("hp-{ranks}.st")));
        assert_eq!(hp, dp, "{ranks} ranks x {devices}");
        assert!(
            dp.0 > 0.2 && dp.0 < 1.0,
            "top-1 {}: the check would be vacuous",
            dp.0
        );
    }
}

#[test]
fn checkpoints_resume_bitwise_and_only_on_their_layout() {
    let tmp = ddl_testkit::scratch("head-parallel-resume");
    let data = dataset(tmp.path());
    let mut cfg = config(&data, "cpu:2");
    cfg.head_parallel = true;
    cfg.epochs = 2;
    cfg.eval = false;
    let whole = run(&cfg, 2, tmp.path(), "whole");
    // The same run stopped after 4 steps, then resumed from its checkpoint.
    let ckpt = tmp.path().join("ckpt");
    let mut first = cfg.clone();
    first.checkpoint_dir = Some(ckpt.clone());
    first.max_steps = Some(4);
    let stopped = run(&first, 2, tmp.path(), "first");
    // The checkpoint holds the whole head: ddl-export writes it as a data-parallel one.
    let exported = tmp.path().join("stopped.safetensors");
    let step4 = ckpt.join(ddl_trainer::checkpoint::file_name(4));
    ddl_trainer::export::export_checkpoint(&step4, &exported, None).unwrap();
    let (dict, _) = file::read(&exported).unwrap();
    for name in ["fc.weight", "fc.bias"] {
        let dumped = &stopped.weights.iter().find(|(n, _)| n == name).unwrap().1;
        assert!(
            dict.f32_values(name).as_ref() == Some(dumped),
            "{name} exported"
        );
    }
    // The same layout may switch the split off: a warning, not a refusal.
    let mut plain = first.clone();
    plain.head_parallel = false;
    plain.resume = true;
    plain.max_steps = Some(6);
    plain.checkpoint_dir = Some(tmp.path().join("ckpt-plain"));
    copy_dir(&ckpt, plain.checkpoint_dir.as_ref().unwrap());
    let summary = common::run_ranks(&plain, 2);
    assert_eq!(summary.steps_run, 2);
    assert!(
        summary
            .warnings
            .iter()
            .any(|w| w.starts_with("--head-parallel true (this run: false)")),
        "{:?}",
        summary.warnings
    );
    let mut second = first.clone();
    second.max_steps = None;
    second.resume = true;
    let resumed = run(&second, 2, tmp.path(), "resumed");
    assert_eq!(resumed.losses.len(), whole.losses.len() - 4);
    assert!(resumed.weights == whole.weights, "resumed weights differ");
    // Another layout is refused, naming both splits, even with --allow-new-layout.
    let mut other = second.clone();
    other.devices = "cpu:1".parse().unwrap();
    other.allow_new_layout = true;
    let results = common::try_all(&other, 3);
    let text = common::first_error(&results)
        .expect("a head-parallel checkpoint resumed on 3 ranks x 1 replica")
        .to_string();
    assert!(
        text.contains("ranks 2 (this run: 3)")
            && text.contains("4 replicas (classes 2, 2, 2, 1) in the checkpoint")
            && text.contains("over 3 replicas (classes 3, 2, 2) in this run"),
        "{text}"
    );
}

#[test]
fn a_split_that_leaves_a_replica_without_classes_is_refused() {
    let tmp = ddl_testkit::scratch("head-parallel-flags");
    let data = tmp.path().join("data");
    common::make_dataset(&data, 3, 8, 0, 2, 0, 36);
    let mut cfg = common::config(&data, "resnet_small", 2, "cpu:2");
    cfg.head_parallel = true;
    let results = common::try_all(&cfg, 2);
    for r in results {
        match r {
            Err(TrainError::Config { settings, message }) => {
                assert_eq!(settings, [Setting::HeadParallel]);
                assert!(
                    message.contains("splits 3 classes over 4 replicas"),
                    "{message}"
                );
            }
            other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
        }
    }
}

/// Copies the files of `from` into a new directory `to`.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}
