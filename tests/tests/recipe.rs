//! `ddl-train`'s recipe flags: progressive resizing (`--image-size-schedule`) changes the
//! train images' size at the epoch boundary, and a run resumed from checkpoints taken before
//! and after the change ends with the uninterrupted run's weights, bitwise; the augmentation
//! flags refuse bad values naming the flag, and `--resume` refuses another schedule.

use std::fs;
use std::path::Path;
use std::process::Command;

use ddl_tests::{command, printed, run, run_ok, scratch, synth_and_pack, SynthSpec};

/// One rank alone (no mpirun): 64 images / batch 8 = 8 steps per epoch, 2 epochs, 32 px in
/// epoch 0 and 48 px from epoch 1.
fn train(shards: &Path, dir: &Path, weights: &str, extra: &[&str]) -> Command {
    let mut cmd = command("ddl-train");
    cmd.arg("--data").arg(shards).args([
        "--model",
        "resnet_small",
        "--workers",
        "1",
        "--devices",
        "cpu:1",
        "--batch",
        "8",
        "--epochs",
        "2",
        "--warmup-epochs",
        "1",
        "--image-size",
        "32",
        "--no-eval",
    ]);
    cmd.arg("--checkpoint-dir")
        .arg(dir.join("ckpt"))
        .arg("--dump-weights")
        .arg(dir.join(weights))
        .args(extra);
    cmd
}

fn epoch_sizes(metrics: &Path) -> Vec<u64> {
    fs::read_to_string(metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["type"] == "epoch")
        .map(|v| {
            v["image_size"]
                .as_u64()
                .expect("image_size in the epoch line")
        })
        .collect()
}

#[test]
fn progressive_resizing_changes_the_size_at_the_boundary_and_resumes_bitwise() {
    let tmp = scratch("recipe");
    let shards = synth_and_pack(
        tmp.path(),
        &SynthSpec {
            classes: 4,
            per_class: 16,
            val_per_class: 1,
            seed: 5,
            shards: 1,
            max_short_side: 64,
        },
    );
    let schedule = ["--image-size-schedule", "1:48"];
    let whole = tmp.path().join("whole");
    let metrics = whole.join("m.jsonl");
    let m = metrics.to_str().unwrap();
    run_ok(&mut train(
        &shards,
        &whole,
        "w.f32",
        &[&schedule[..], &["--metrics", m]].concat(),
    ));
    assert_eq!(epoch_sizes(&metrics), [32, 48]);
    let reference = fs::read(whole.join("w.f32")).unwrap();

    // The same run without the schedule trains on other pixels in epoch 1.
    let fixed = tmp.path().join("fixed");
    run_ok(&mut train(&shards, &fixed, "w.f32", &[]));
    assert_ne!(fs::read(fixed.join("w.f32")).unwrap(), reference);

    // Stopped in epoch 0 (32 px), resumed and stopped in epoch 1 (48 px), resumed to the end.
    let parts = tmp.path().join("parts");
    for stop in [["--max-steps", "4"], ["--max-steps", "12"]] {
        let resume: &[&str] = if stop[1] == "4" { &[] } else { &["--resume"] };
        run_ok(&mut train(
            &shards,
            &parts,
            "w.f32",
            &[&schedule[..], &stop, resume].concat(),
        ));
    }
    let out = run_ok(&mut train(
        &shards,
        &parts,
        "w.f32",
        &[&schedule[..], &["--resume"]].concat(),
    ));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("done: 16 global steps (4 in this run)"),
        "{}",
        printed(&out)
    );
    assert!(
        fs::read(parts.join("w.f32")).unwrap() == reference,
        "resumed weights differ from the uninterrupted run's"
    );

    // Another schedule is another run: refused, naming the flag and both values.
    let other = ["--image-size-schedule", "1:40", "--resume"];
    let out = run(&mut train(&shards, &parts, "w.f32", &other));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{}", printed(&out));
    assert!(
        err.contains("--image-size-schedule 1:48 (this run: 1:40)"),
        "{err}"
    );
}

#[test]
fn bad_recipe_flags_name_the_flag() {
    let tmp = scratch("recipe-flags");
    let cases: [(&[&str], &str); 7] = [
        (&["--crop-scale", "0,1"], "--crop-scale"),
        (&["--crop-scale", "0.5"], "--crop-scale"),
        (&["--crop-ratio", "2,1"], "--crop-ratio"),
        (&["--flip-prob", "2"], "--flip-prob"),
        (&["--std", "0.2,0,0.2"], "--std"),
        (&["--eval-resize-ratio", "0.9"], "--eval-resize-ratio"),
        (
            &["--image-size-schedule", "3:64,2:96"],
            "--image-size-schedule",
        ),
    ];
    for (flags, name) in cases {
        let out = run(&mut train(tmp.path(), tmp.path(), "w.f32", flags));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(name),
            "{flags:?}: {err}"
        );
    }
}

#[test]
fn mean_and_std_reach_the_input() {
    let tmp = scratch("recipe-norm");
    let shards = synth_and_pack(
        tmp.path(),
        &SynthSpec {
            classes: 4,
            per_class: 8,
            val_per_class: 1,
            seed: 6,
            shards: 1,
            max_short_side: 48,
        },
    );
    let weights = |name: &str, extra: &[&str]| {
        let dir = tmp.path().join(name);
        let steps = ["--max-steps", "2"];
        run_ok(&mut train(
            &shards,
            &dir,
            "w.f32",
            &[&steps[..], extra].concat(),
        ));
        fs::read(dir.join("w.f32")).unwrap()
    };
    let imagenet = weights("default", &[]);
    let spelled = ["--mean", "0.485,0.456,0.406", "--std", "0.229,0.224,0.225"];
    assert_eq!(
        weights("spelled", &spelled),
        imagenet,
        "the defaults are ImageNet's"
    );
    let other = ["--mean", "0.5,0.5,0.5", "--std", "0.25,0.25,0.25"];
    assert_ne!(weights("other", &other), imagenet);
}
