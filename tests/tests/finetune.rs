//! Fine-tuning: a model trained on one `ddl-synth` set, exported, then started with
//! `--init-from --reset-head` on a set with another class count learns faster than the same run
//! from scratch. On the way, `ddl-predict` on the first set's val JPEGs scores about what the
//! run reported (the classes are in label order and the eval transform is the run's). In a file
//! of its own so that no other test competes for the cores.

use std::collections::HashMap;
use std::fs;
use std::path::Path;
use std::process::Command;

use ddl_tests::{command, run_ok, scratch, synth_and_pack, SynthSpec};
use ddl_trainer::weights::file;
use ddl_trainer::weights::meta::ModelMeta;
use serde_json::Value;

/// `ddl-train` alone (one rank, one CPU replica) on `shards` with the flags of every run here.
fn train(shards: &Path) -> Command {
    let mut cmd = command("ddl-train");
    cmd.arg("--data").arg(shards).args([
        "--model",
        "resnet_small",
        "--image-size",
        "32",
        "--batch",
        "32",
        "--devices",
        "cpu:1",
        "--workers",
        "1",
        "--warmup-epochs",
        "0",
        "--schedule",
        "cosine",
        "--lr",
        "0.2",
    ]);
    cmd
}

/// Val top-1 of every epoch of a `--metrics` file.
fn val_top1(metrics: &Path) -> Vec<f64> {
    fs::read_to_string(metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["type"] == "epoch")
        .map(|v| v["val_top1"].as_f64().unwrap())
        .collect()
}

/// The wnid of every val image of a ddl-synth tree, by file stem (`LOC_val_solution.csv`).
fn val_labels(tree: &Path) -> HashMap<String, String> {
    fs::read_to_string(tree.join("LOC_val_solution.csv"))
        .unwrap()
        .lines()
        .skip(1)
        .filter_map(|l| {
            let (id, pred) = l.split_once(',')?;
            Some((id.to_string(), pred.split_whitespace().next()?.to_string()))
        })
        .collect()
}

#[test]
fn init_from_reset_head_learns_faster_than_from_scratch() {
    let tmp = scratch("finetune");
    let a_dir = tmp.path().join("a");
    let b_dir = tmp.path().join("b");
    let a = synth_and_pack(
        &a_dir,
        &SynthSpec {
            classes: 10,
            per_class: 60,
            val_per_class: 10,
            seed: 1,
            shards: 2,
            max_short_side: 48,
        },
    );
    // Another class count (so other hues per class), other images, little training data.
    let b = synth_and_pack(
        &b_dir,
        &SynthSpec {
            classes: 6,
            per_class: 12,
            val_per_class: 20,
            seed: 2,
            shards: 2,
            max_short_side: 48,
        },
    );
    let model = tmp.path().join("a.safetensors");
    run_ok(
        train(&a)
            .args(["--epochs", "4", "--seed", "1"])
            .arg("--export")
            .arg(&model),
    );
    let (_, map) = file::read(&model).unwrap();
    let meta = ModelMeta::from_map(&map, &model).unwrap().unwrap();
    let reported = meta.val_top1.unwrap();
    assert!(
        reported >= 0.7,
        "the pretrained model: val top-1 {reported}"
    );

    // ddl-predict on set A's val JPEGs (not the packed copies) scores what the run reported,
    // up to the difference between the original and the packed pixels.
    let out = run_ok(
        command("ddl-predict")
            .arg("--model")
            .arg(&model)
            .arg(a_dir.join("imagenet/val"))
            .args(["--json", "--top", "1", "--device", "cpu"]),
    );
    let labels = val_labels(&a_dir.join("imagenet"));
    let (mut right, mut total) = (0, 0);
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let image = Path::new(v["image"].as_str().unwrap());
        let stem = image.file_stem().unwrap().to_string_lossy();
        total += 1;
        right += usize::from(v["top"][0]["class"] == labels[stem.as_ref()]);
    }
    assert_eq!(total, 100);
    let predicted = right as f64 / total as f64;
    assert!(
        (predicted - reported).abs() <= 0.1,
        "ddl-predict top-1 {predicted} on the JPEGs, the run reported {reported}"
    );

    // Set B, one epoch (3 steps): from scratch and from set A's model with a new head, for
    // three seeds (a run from scratch this short depends much on its seed: 20-77% here).
    let run_b = |name: &str, seed: u64, init: bool| {
        let metrics = tmp.path().join(format!("{name}-{seed}.jsonl"));
        let mut cmd = train(&b);
        cmd.args(["--epochs", "1", "--seed", &seed.to_string()])
            .arg("--metrics")
            .arg(&metrics);
        if init {
            cmd.arg("--init-from").arg(&model).arg("--reset-head");
        }
        run_ok(&mut cmd);
        val_top1(&metrics)[0]
    };
    let mut sums = (0.0, 0.0);
    for seed in [5, 6, 7] {
        let (scratch_top1, tuned_top1) =
            (run_b("scratch", seed, false), run_b("tuned", seed, true));
        assert!(
            tuned_top1 > scratch_top1,
            "seed {seed}, one epoch on 6 new classes: fine-tuned val top-1 {tuned_top1}, from \
             scratch {scratch_top1}"
        );
        sums = (sums.0 + scratch_top1, sums.1 + tuned_top1);
    }
    let (scratch_mean, tuned_mean) = (sums.0 / 3.0, sums.1 / 3.0);
    assert!(
        tuned_mean >= scratch_mean + 0.2,
        "mean val top-1 over 3 seeds after one epoch: fine-tuned {tuned_mean}, from scratch \
         {scratch_mean}"
    );
}
