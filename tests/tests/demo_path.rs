//! The demo's path end to end, as a user runs it: ddl-synth -> ddl-pack (+ --verify) ->
//! `mpirun -np 2 ddl-train` on CPU, checking what every stage leaves behind.

use std::fs;

use ddl_tests::{command, mpirun_train, run_ok, scratch, synth_and_pack, SynthSpec};
use ddl_trainer::checkpoint::{self, Checkpoint};
use serde_json::Value;

#[test]
fn synth_pack_verify_then_train_under_mpirun_np2() {
    let tmp = scratch("demo");
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
    run_ok(command("ddl-pack").arg("--verify").arg(&shards));

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
        // Two ranks exchange every step's gradient: that takes time.
        assert!(s["allreduce_s"].as_f64().unwrap() > 0.0, "{s}");
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
    // The epoch-end checkpoints (3 kept by default, 2 written): the last one resumes at the
    // start of epoch 2 after 12 steps, with every tensor of both ranks' replicas.
    let files = checkpoint::list(&ckpt).unwrap();
    assert_eq!(files.len(), 2, "{files:?}");
    let ck = Checkpoint::read(files.last().unwrap()).unwrap();
    assert_eq!(
        (ck.meta.epoch, ck.meta.step, ck.meta.global_step),
        (2, 0, 12)
    );
    assert_eq!((ck.meta.ranks, ck.meta.replicas), (2, 1));
    assert_eq!(ck.meta.model, "resnet_small");
    assert_eq!(ck.meta.classes, 4);
    assert_eq!(ck.meta.flags["seed"], 0);
    let count = |prefix: &str| {
        ck.meta
            .tensors
            .iter()
            .filter(|t| t.name.starts_with(prefix))
            .count()
    };
    let params = count("param/");
    assert!(params > 0);
    assert_eq!(count("momentum/"), params, "one momentum per parameter");
    assert!(count("buffer/0/0/") > 0, "rank 0's BatchNorm statistics");
    assert_eq!(count("buffer/1/0/"), count("buffer/0/0/"), "rank 1's too");
    for (t, v) in ck.meta.tensors.iter().zip(&ck.data) {
        assert_eq!(v.len(), t.numel(), "{}", t.name);
        assert!(v.iter().all(|x| x.is_finite()), "{} is not finite", t.name);
    }
    // Trained weights moved away from zero; rank 1's statistics saw other batches.
    let fc = ck.get("param/fc.weight").expect("param/fc.weight");
    assert!(fc.iter().any(|&x| x != 0.0));
    let mean0 = ck.get("buffer/0/0/bn1.running_mean").unwrap();
    let mean1 = ck.get("buffer/1/0/bn1.running_mean").unwrap();
    assert_ne!(mean0, mean1, "each rank's BatchNorm statistics are its own");
    // Rank 0 prints the per-epoch lines; the other rank prints none of them.
    assert_eq!(stdout.matches("top-1").count(), 2, "{stdout}");
}
