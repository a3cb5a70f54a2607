//! When a write fails: ddl-plan and ddl-train whose standard output is a full disk end with
//! one line and status 1 (no panic), and ddl-train whose checkpoint passes the file-size limit
//! (`ulimit -f`) says so and leaves no partial file, instead of SIGXFSZ killing it silently.

use std::process::Command;

use ddl_tests::{bin, command, printed, run, scratch};

/// `ddl-train` on its synthetic data: resnet_small, 3 classes, 16 px, batch 2, one CPU
/// replica, `steps` steps.
fn synthetic_train(steps: u64) -> Command {
    let mut cmd = command("ddl-train");
    cmd.args([
        "--synthetic-data",
        "--model",
        "resnet_small",
        "--classes",
        "3",
    ])
    .args(["--image-size", "16", "--batch", "2", "--devices", "cpu:1"])
    .args(["--max-steps", &steps.to_string()]);
    cmd
}

#[test]
fn a_full_disk_on_stdout_ends_ddl_plan_and_ddl_train_with_one_line() {
    let out = command("ddl-plan")
        .args(["--model", "resnet18", "--classes", "10", "--ranks", "2"])
        .stdout(ddl_testkit::full_disk())
        .output()
        .unwrap();
    ddl_testkit::assert_ended_on_full_disk("ddl-plan", &out);
    let out = synthetic_train(2)
        .stdout(ddl_testkit::full_disk())
        .output()
        .unwrap();
    ddl_testkit::assert_ended_on_full_disk("ddl-train", &out);
}

#[test]
fn a_checkpoint_past_the_file_size_limit_is_reported_and_removed() {
    let tmp = scratch("file-size-limit");
    let data = tmp.path().join("data");
    // Shards of a small generated tree, so that the run checkpoints (synthetic data does not).
    let shards = ddl_tests::synth_and_pack(
        &data,
        &ddl_tests::SynthSpec {
            classes: 2,
            per_class: 8,
            val_per_class: 1,
            seed: 3,
            shards: 1,
            max_short_side: 40,
        },
    );
    let ck = tmp.path().join("ck");
    // 64 KiB: the metrics and logs fit, a checkpoint of resnet_small (about 2.8 MB) does not.
    let out = run(Command::new("bash")
        .arg("-c")
        .arg("ulimit -f 64 && exec \"$@\"")
        .arg("bash")
        .arg(bin("ddl-train"))
        .arg("--data")
        .arg(&shards)
        .args([
            "--model",
            "resnet_small",
            "--image-size",
            "32",
            "--batch",
            "4",
        ])
        .args([
            "--devices",
            "cpu:1",
            "--workers",
            "1",
            "--max-steps",
            "1",
            "--no-eval",
        ])
        .arg("--checkpoint-dir")
        .arg(&ck));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", printed(&out));
    assert!(
        err.contains("file-size limit") && err.contains("ulimit -f") && err.contains("--resume"),
        "{err}"
    );
    let left: Vec<_> = std::fs::read_dir(&ck)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().contains("ckpt-"))
        .collect();
    assert!(left.is_empty(), "partial checkpoint files left: {left:?}");
}
