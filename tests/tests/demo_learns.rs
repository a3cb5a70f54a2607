//! The demo learns: `make demo`'s configuration under a real `mpirun -np 2` reaches high
//! validation accuracy. In a file of its own so that no other test competes for the cores.

use ddl_tests::{demo_train, scratch, synth_and_pack, SynthSpec};

/// The demo itself (10 ddl-synth classes, resnet_small on CPU, `mpirun -np 2`, four epochs)
/// learns: validation top-1 ends far above the 10% of chance.
#[test]
fn demo_learns_ten_classes_under_mpirun_np2() {
    let tmp = scratch("demo-learn");
    let shards = synth_and_pack(
        tmp.path(),
        &SynthSpec {
            classes: 10,
            per_class: 160,
            val_per_class: 30,
            seed: 1,
            shards: 4,
            max_short_side: 96,
        },
    );
    let metrics = tmp.path().join("metrics.jsonl");
    let last_epoch = demo_train(&shards, &metrics);
    let top1 = last_epoch["val_top1"].as_f64().unwrap();
    assert!(
        top1 >= 0.8,
        "val top-1 {top1} after the demo's 4 epochs: {last_epoch}"
    );
    // How long the replicas waited on the loader depends on the machine's load: a benchmark
    // figure (BENCHMARKS.md, ddl-train), not something a test can assert. It must be a
    // fraction.
    let wait = last_epoch["data_wait_frac"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&wait), "data-wait {wait} of step time");
}
