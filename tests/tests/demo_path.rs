//! The demo's path end to end, as a user runs it: ddl-synth -> ddl-pack (+ --verify) ->
//! `mpirun -np 2 ddl-train` on CPU, checking what every stage leaves behind.

use std::fs;
use std::process::Command;

use ddl_tests::{bin, mpirun_train, run_ok, synth_and_pack, Scratch, SynthSpec};
use serde_json::Value;

#[test]
fn synth_pack_verify_then_train_under_mpirun_np2() {
    let tmp = Scratch::new("demo");
    let shards = synth_and_pack(
        tmp.path(),
        &SynthSpec {
            classes: 4,
            per_class: 24,
            val_per_class: 6,
            seed: 5,
            shards: 4,
            max_short_side: 64,
        },
    );
    run_ok(Command::new(bin("ddl-pack")).arg("--verify").arg(&shards));

    let manifest: Value =
        serde_json::from_slice(&fs::read(shards.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["classes"].as_array().unwrap().len(), 4);

    let metrics = tmp.path().join("metrics.jsonl");
    let ckpt = tmp.path().join("ckpt");
    let out = run_ok(
        mpirun_train(2, &shards)
            .args([
                "--image-size",
                "32",
                "--batch",
                "8",
                "--devices",
                "cpu:1",
                "--epochs",
                "2",
                "--warmup-epochs",
                "0.5",
                "--base-lr",
                "0.2",
            ])
            .arg("--metrics")
            .arg(&metrics)
            .arg("--checkpoint-dir")
            .arg(&ckpt),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);

    let lines: Vec<Value> = fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad metrics line {l}: {e}")))
        .collect();
    let epochs: Vec<&Value> = lines.iter().filter(|v| v["type"] == "epoch").collect();
    let steps: Vec<&Value> = lines.iter().filter(|v| v["type"] == "step").collect();
    assert_eq!(epochs.len(), 2, "one epoch line per epoch:\n{stdout}");
    // 96 training images, 2 ranks x 1 replica x batch 8 -> 6 steps per epoch.
    assert_eq!(steps.len(), 12, "one step line per step:\n{stdout}");
    for s in &steps {
        for key in [
            "loss",
            "lr",
            "images_per_s",
            "data_wait_s",
            "compute_s",
            "allreduce_s",
        ] {
            let x = s[key]
                .as_f64()
                .unwrap_or_else(|| panic!("step line lacks {key}: {s}"));
            assert!(x.is_finite() && x >= 0.0, "{key} = {x}");
        }
    }
    for e in &epochs {
        let top1 = e["val_top1"].as_f64().unwrap();
        let top5 = e["val_top5"].as_f64().unwrap();
        assert!(
            (0.0..=1.0).contains(&top1) && top1 <= top5 && top5 <= 1.0,
            "{e}"
        );
        assert!(e["train_loss"].as_f64().unwrap().is_finite());
    }
    assert!(
        fs::read_dir(&ckpt).unwrap().count() > 0,
        "no checkpoint written"
    );
    // Rank 0 prints the per-epoch lines; the other rank prints none of them.
    assert_eq!(stdout.matches("top-1").count(), 2, "{stdout}");
}
