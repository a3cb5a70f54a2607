//! `ddl-train --compile` as users run it: under `mpirun -np 2` (2 ranks x 2 CPU replicas,
//! BatchNorm model) it keeps every replica of both ranks on the same weights (`--check-replicas`
//! fails the run otherwise), and its weights follow those of the eager run from the same start;
//! with a Python that has no torch it fails saying so.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use ddl_tests::{command, mpirun_train, printed, run, run_ok, scratch, synth_and_pack, SynthSpec};

/// The weights after 4 steps of 2 ranks x 2 replicas with `flags`, dumped to `weights`.
fn train(shards: &Path, flags: &[&str], weights: &Path) -> Vec<f32> {
    let mut cmd = mpirun_train(2, shards);
    cmd.args([
        "--image-size",
        "32",
        "--batch",
        "8",
        "--devices",
        "cpu:2",
        "--warmup-epochs",
        "0",
        "--base-lr",
        "0.05",
        "--check-replicas",
        "--no-eval",
        "--quiet",
    ])
    .args(flags)
    .arg("--dump-weights")
    .arg(weights);
    run_ok(&mut cmd);
    fs::read(weights)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[test]
fn compiled_ranks_keep_equal_weights_that_follow_eager() {
    let tmp = scratch("compiled-mpi");
    let shards = synth_and_pack(
        tmp.path(),
        &SynthSpec {
            classes: 4,
            per_class: 16,
            val_per_class: 1,
            seed: 9,
            shards: 2,
            max_short_side: 40,
        },
    );
    let cache: PathBuf = Path::new(env!("CARGO_TARGET_TMPDIR")).join("compile-cache");
    let cache = cache.to_str().unwrap();
    let init = train(&shards, &["--max-steps", "0"], &tmp.path().join("init.f32"));
    let eager = train(
        &shards,
        &["--max-steps", "4"],
        &tmp.path().join("eager.f32"),
    );
    let compiled = train(
        &shards,
        &["--max-steps", "4", "--compile", "--compile-cache", cache],
        &tmp.path().join("compiled.f32"),
    );
    let (mut diff, mut update) = (0f64, 0f64);
    for ((&i, &e), &c) in init.iter().zip(&eager).zip(&compiled) {
        diff += (f64::from(c) - f64::from(e)).powi(2);
        update += (f64::from(e) - f64::from(i)).powi(2);
    }
    let rel = (diff / update).sqrt();
    assert!(
        update > 0.0 && rel < 0.03,
        "compiled update {rel:.3e} from eager's"
    );
}

#[test]
fn compile_with_a_python_without_torch_says_what_is_missing() {
    let tmp = scratch("compiled-no-torch");
    // A Python that cannot import torch (a virtualenv of the system's, without packages).
    let venv = tmp.path().join("bare");
    run_ok(
        Command::new("python3")
            .args(["-m", "venv", "--without-pip"])
            .arg(&venv),
    );
    let out = run(command("ddl-train")
        .args([
            "--synthetic-data",
            "--classes",
            "3",
            "--model",
            "convnet_nobn",
        ])
        .args([
            "--image-size",
            "16",
            "--batch",
            "2",
            "--devices",
            "cpu:1",
            "--max-steps",
            "1",
        ])
        .arg("--compile")
        .arg("--compile-cache")
        .arg(tmp.path().join("cache"))
        .env("DDL_PYTHON", venv.join("bin/python")));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{}", printed(&out));
    assert!(err.contains("cannot import torch"), "{}", printed(&out));
    // The failed compile's folder is kept and named: its spec, script and log.
    assert!(err.contains("whole log"), "{err}");
}
