//! ImageNet-22k end to end: `ddl-synth --layout tars` writes per-synset tars without a
//! validation split, `ddl-pack --val-fraction` holds one out, and `ddl-train` under a real
//! `mpirun -np 2` learns, measured on that held-out split (top-1 and top-5). In a file of its
//! own so that no other test competes for the cores.

use std::fs;

use ddl_tests::{command, demo_train, run_ok, scratch};
use serde_json::Value;

#[test]
fn held_out_22k_split_measures_learning_under_mpirun_np2() {
    let tmp = scratch("22k-learn");
    let tars = tmp.path().join("tars");
    let shards = tmp.path().join("shards");
    run_ok(command("ddl-synth").arg(&tars).args([
        "--layout",
        "tars",
        "--classes",
        "10",
        "--per-class",
        "120",
        "--seed",
        "1",
    ]));
    run_ok(command("ddl-pack").arg(&tars).arg("-o").arg(&shards).args([
        "--val-fraction",
        "0.15",
        "--shards",
        "4",
        "--max-short-side",
        "96",
        "--max-skip-fraction",
        "0.01",
    ]));
    let report: Value =
        serde_json::from_slice(&fs::read(shards.join("pack-report.json")).unwrap()).unwrap();
    let val_inputs = report["val_split"]["val_inputs"].as_u64().unwrap();
    assert!((100..=260).contains(&val_inputs), "{}", report["val_split"]);

    let metrics = tmp.path().join("metrics.jsonl");
    let last_epoch = demo_train(&shards, &metrics);
    // Every held-out image is evaluated (ten classes: chance is 10% top-1, 50% top-5).
    assert_eq!(
        last_epoch["val_images"].as_u64(),
        report["splits"]["val"]["records"].as_u64(),
        "{last_epoch}"
    );
    let top1 = last_epoch["val_top1"].as_f64().unwrap();
    let top5 = last_epoch["val_top5"].as_f64().unwrap();
    assert!(top1 >= 0.6, "val top-1 {top1}: {last_epoch}");
    assert!(
        top5 >= top1 && top5 >= 0.9,
        "val top-5 {top5}: {last_epoch}"
    );
}
