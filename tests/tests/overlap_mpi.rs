//! Under `mpirun -np 2` (2 ranks x 2 CPU replicas, BatchNorm model), `ddl-train --overlap
//! backward` (staged backward, each bucket allreduced while earlier stages are still in
//! backward) ends with weights bitwise identical to `--overlap pipeline` and `--overlap off`.

use std::fs;
use std::path::Path;

use ddl_tests::{mpirun_train, run_ok, scratch, synth_and_pack, SynthSpec};

fn train(shards: &Path, overlap: &str, weights: &Path) -> Vec<u8> {
    let mut cmd = mpirun_train(2, shards);
    cmd.args([
        "--image-size",
        "32",
        "--batch",
        "4",
        "--devices",
        "cpu:2",
        "--max-steps",
        "4",
        "--warmup-epochs",
        "0",
        "--bucket-mb",
        "0.01",
        "--check-replicas",
        "--no-eval",
        "--quiet",
        "--overlap",
        overlap,
    ])
    .arg("--dump-weights")
    .arg(weights);
    run_ok(&mut cmd);
    fs::read(weights).unwrap()
}

#[test]
fn backward_overlap_matches_pipeline_and_off_under_mpirun() {
    let tmp = scratch("overlap-mpi");
    let shards = synth_and_pack(
        tmp.path(),
        &SynthSpec {
            classes: 4,
            per_class: 16,
            val_per_class: 1,
            seed: 5,
            shards: 2,
            max_short_side: 40,
        },
    );
    let off = train(&shards, "off", &tmp.path().join("off.f32"));
    assert!(!off.is_empty());
    for mode in ["pipeline", "backward"] {
        let got = train(&shards, mode, &tmp.path().join(format!("{mode}.f32")));
        assert_eq!(got.len(), off.len(), "{mode}: weight files differ in size");
        let first_diff = got.iter().zip(&off).position(|(x, y)| x != y);
        assert_eq!(
            first_diff, None,
            "{mode}: weights differ from --overlap off"
        );
    }
}

/// The spans (name, start, end in µs, args) of a Chrome trace written by `--trace`.
fn spans(path: &Path) -> Vec<(String, f64, f64, serde_json::Value)> {
    let v: serde_json::Value = serde_json::from_slice(&fs::read(path).unwrap()).unwrap();
    let events = match &v {
        serde_json::Value::Array(a) => a.clone(),
        serde_json::Value::Object(o) => o["traceEvents"].as_array().unwrap().clone(),
        _ => panic!("not a trace: {}", path.display()),
    };
    events
        .into_iter()
        .filter(|e| e["ph"] == "X")
        .map(|e| {
            let ts = e["ts"].as_f64().unwrap();
            let end = ts + e["dur"].as_f64().unwrap();
            (
                e["name"].as_str().unwrap().to_string(),
                ts,
                end,
                e["args"].clone(),
            )
        })
        .collect()
}

/// For each step of rank 0's replica 0: how many bucket allreduces started before the backward
/// of the first stage (the last backward of the step) ended.
fn allreduces_during_backward(trace: &Path) -> Vec<usize> {
    let spans = spans(trace);
    let replica0 = |args: &serde_json::Value| args["replica"] == 0;
    let steps: Vec<(f64, f64)> = spans
        .iter()
        .filter(|(n, _, _, a)| n == "forward_backward" && replica0(a))
        .map(|(_, start, end, _)| (*start, *end))
        .collect();
    assert!(
        !steps.is_empty(),
        "no forward_backward spans in {}",
        trace.display()
    );
    steps
        .iter()
        .map(|&(start, end)| {
            let backward_end = spans
                .iter()
                .filter(|(n, s, _, a)| {
                    n == "backward" && a["stage"] == 0 && replica0(a) && *s >= start && *s <= end
                })
                .map(|(_, _, e, _)| *e)
                .next()
                .expect("a backward span of stage 0 in every step");
            spans
                .iter()
                .filter(|(n, s, _, _)| n == "allreduce" && *s >= start && *s < backward_end)
                .count()
        })
        .collect()
}

/// `--overlap backward` really overlaps: in rank 0's Chrome trace, buckets' allreduces start
/// while the replica is still in backward (before its first stage's backward ends); with
/// `--overlap off` none does (the one bucket waits for the whole backward).
#[test]
fn backward_overlap_starts_allreduces_during_backward_in_the_trace() {
    let tmp = scratch("overlap-trace");
    let shards = synth_and_pack(
        tmp.path(),
        &SynthSpec {
            classes: 4,
            per_class: 8,
            val_per_class: 1,
            seed: 6,
            shards: 2,
            max_short_side: 40,
        },
    );
    let traced = |overlap: &str| {
        let trace = tmp.path().join(format!("{overlap}.json"));
        let mut cmd = mpirun_train(2, &shards);
        cmd.args([
            "--image-size",
            "32",
            "--batch",
            "4",
            "--devices",
            "cpu:1",
            "--max-steps",
            "3",
            "--no-eval",
            "--quiet",
            "--overlap",
            overlap,
        ])
        .arg("--trace")
        .arg(&trace);
        run_ok(&mut cmd);
        allreduces_during_backward(&trace)
    };
    let backward = traced("backward");
    assert_eq!(backward.len(), 3, "one forward_backward per step");
    assert!(
        backward.iter().any(|&n| n > 0),
        "no allreduce started during backward with --overlap backward: {backward:?}"
    );
    let off = traced("off");
    assert_eq!(off, vec![0; 3], "--overlap off cannot overlap");
}
