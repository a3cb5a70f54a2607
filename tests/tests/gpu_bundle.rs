//! The GPU bundle (`tools/gpu/bundle.sh`) builds, and its `run.sh` runs every stage on the CPU
//! (`DEVICE=cpu`), the compiled step's tiny: each stage runs to its end, each check writes its
//! JSON line and none fails. So the script that will run on the GPU machine cannot rot between GPU
//! runs. Also: bundle.sh refuses a folder it did not write, and a bundle holding a file it did
//! not write, touching nothing in either; and a run under a DEADLINE too close for its stages
//! skips them and still ends with its summary.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use ddl_tests::{printed, run, run_ok, scratch};
use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// The Python with torch and torchvision that `make setup` made (the Makefile's VIRTUAL_ENV).
fn python() -> PathBuf {
    let venv = std::env::var_os("VIRTUAL_ENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".venv"));
    let python = venv.join("bin/python");
    assert!(
        python.exists(),
        "{} missing: run `make setup` (the bundle's CPU run needs its torch)",
        python.display()
    );
    python
}

fn bundle_cmd(dir: &Path) -> Command {
    let mut cmd = Command::new(root().join("tools/gpu/bundle.sh"));
    cmd.arg(dir);
    cmd
}

/// The bundle's run.sh on the CPU, scratch in `work`, results in `out`.
fn run_cmd(dir: &Path, work: &Path, out: &Path) -> Command {
    let mut cmd = Command::new(dir.join("run.sh"));
    cmd.env("DEVICE", "cpu")
        .env("OUT", out)
        .env("WORK", work)
        // The compile cache of every compiled-step test: the bundle's keys on the CPU are the
        // trainer tests', compiled once per `make test`.
        .env(
            "COMPILE_CACHE",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("compile-cache"),
        )
        .env("PYTHON", python());
    cmd
}

/// The JSON lines of a run's results.jsonl.
fn results(out: &Path) -> Vec<Value> {
    fs::read_to_string(out.join("results.jsonl"))
        .expect("results.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// The checks every CPU run must record, ok, per stage.
const CHECKS: &[(&str, &str)] = &[
    ("env", "torch"),
    ("env", "libraries"),
    ("env", "ddl-train"),
    ("compile", "compile"),
    ("compile", "update"),
    ("compile_all", "variant"),
    ("compile_check", "compiled-fp32"),
    ("compile_check", "graphs-fp32"),
    ("compile_check", "resume"),
    ("compiled_speed", "fed"),
    ("compiled_speed", "synthetic"),
    ("compiled_speed", "synthetic-images_per_s"),
    ("compiled_python", "compiled"),
    ("correctness", "fp32"),
    ("correctness", "bf16"),
    ("correctness", "fp16"),
    ("correctness", "overlap-pipeline"),
    ("correctness", "overlap-backward"),
    ("correctness", "channels-last"),
    ("correctness", "replicas"),
    ("correctness", "resume"),
    ("correctness", "export"),
    ("speed", "synthetic"),
    ("speed", "synthetic-images_per_s"),
    ("speed", "fed"),
    ("prof", "ddl-prof"),
    ("python", "train.py"),
    ("python", "feed"),
    ("python", "feed-feed_images_per_s"),
];

#[test]
fn bundle_runs_every_stage_on_the_cpu() {
    let tmp = scratch("gpu-bundle");
    let dir = tmp.path().join("bundle");
    let built = run_ok(&mut bundle_cmd(&dir));
    let said = String::from_utf8_lossy(&built.stdout);
    assert!(said.contains("MiB (limit 56 MiB)"), "{}", printed(&built));

    let out = tmp.path().join("out");
    let ran = run(&mut run_cmd(&dir, &tmp.path().join("work"), &out));
    assert!(ran.status.success(), "{}", printed(&ran));
    let lines = results(&out);
    let failed: Vec<&Value> = lines.iter().filter(|l| l["ok"] != true).collect();
    assert!(failed.is_empty(), "failed checks: {failed:#?}");

    let seen: BTreeSet<(&str, &str)> = lines
        .iter()
        .map(|l| (l["stage"].as_str().unwrap(), l["check"].as_str().unwrap()))
        .collect();
    let stages = [
        "env",
        "compile",
        "compile_all",
        "compiled_speed",
        "compile_check",
        "compiled_python",
        "correctness",
        "speed",
        "prof",
        "python",
    ];
    for want in CHECKS.iter().copied().chain(stages.map(|s| (s, "stage"))) {
        assert!(seen.contains(&want), "no line for {want:?}: {lines:#?}");
    }
    let line = |stage: &str, check: &str| {
        lines
            .iter()
            .find(|l| l["stage"] == stage && l["check"] == check)
            .unwrap()
    };
    assert_eq!(line("correctness", "resume")["bitwise"], true);
    assert_eq!(line("compile_check", "resume")["bitwise"], true);
    // The CUDA graph check, whose capture only a GPU can make, is there, said to be skipped.
    let graphs = &line("compile_check", "graphs-fp32")["skipped"];
    assert!(
        graphs.as_str().is_some_and(|s| s.contains("GPU")),
        "{graphs}"
    );
    let update = line("compile_check", "compiled-fp32")["update_rel_diff"].as_f64();
    assert!(update.is_some_and(|u| u < 0.05), "{update:?}");
    assert!(
        line("correctness", "export")["max_abs_diff"]
            .as_f64()
            .unwrap()
            < 1e-3
    );
    let peers = |stage: &str| -> BTreeSet<&str> {
        lines
            .iter()
            .filter(|l| l["stage"] == stage && l["check"] == "synthetic")
            .map(|l| l["peer"].as_str().unwrap())
            .collect()
    };
    assert_eq!(
        peers("speed"),
        BTreeSet::from(["ddl-train", "pytorch-eager"])
    );
    assert_eq!(
        peers("compiled_speed"),
        BTreeSet::from(["ddl-train", "ddl-train-compile"])
    );
    // The step compiled by ddl-train with Inductor's defaults and with another option, each
    // package timed alone by compiled_graphs.py.
    let variants: BTreeSet<&str> = lines
        .iter()
        .filter(|l| l["stage"] == "compile_all" && l["check"] == "variant")
        .map(|l| l["options"].as_str().unwrap())
        .collect();
    assert_eq!(
        variants,
        BTreeSet::from(["default", "layout_optimization=False"])
    );
    let summary = fs::read_to_string(out.join("summary.md")).expect("summary.md");
    assert_eq!(
        summary.lines().filter(|l| l.starts_with("| ")).count(),
        lines.len(),
        "summary.md: a header and a row per line but the start line:\n{summary}"
    );

    // A second run in the same WORK (a warm machine's second device call) under a DEADLINE
    // too close for any stage (it keeps 30 s and gives a stage at least 60): each stage is
    // recorded as skipped, and the run still ends with its summary.
    let late = tmp.path().join("late");
    let ran = run(run_cmd(&dir, &tmp.path().join("work"), &late)
        .env("STAGES", "env compile")
        .env("DEADLINE", "89"));
    assert!(ran.status.success(), "{}", printed(&ran));
    let skipped: Vec<Value> = results(&late)
        .into_iter()
        .filter(|l| l["check"] == "stage" && l["skipped"] == "deadline")
        .map(|l| l["stage"].clone())
        .collect();
    assert_eq!(skipped, ["env", "compile"]);
    assert!(late.join("summary.md").exists());

    // A bundle holding a file it did not write is not rebuilt: nothing is removed.
    let mine = dir.join("py/notes.txt");
    fs::write(&mine, "mine").unwrap();
    let listed = fs::read_to_string(dir.join(".ddl-gpu-bundle")).unwrap();
    let again = run(&mut bundle_cmd(&dir));
    assert!(!again.status.success(), "{}", printed(&again));
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("py/notes.txt"),
        "{}",
        printed(&again)
    );
    for path in listed.lines() {
        let kept = fs::symlink_metadata(dir.join(path)).is_ok();
        assert!(kept, "{path} of the bundle was removed");
    }
    assert_eq!(fs::read_to_string(&mine).unwrap(), "mine");
}

#[test]
fn bundle_refuses_a_folder_it_did_not_write() {
    let tmp = scratch("gpu-bundle-refuse");
    let mine = tmp.path().join("notes.txt");
    fs::write(&mine, "mine").unwrap();
    let out = run(&mut bundle_cmd(tmp.path()));
    assert!(!out.status.success(), "{}", printed(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&tmp.path().display().to_string()) && err.contains("not a bundle"),
        "{}",
        printed(&out)
    );
    assert_eq!(fs::read_to_string(&mine).unwrap(), "mine");
    assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 1);
}
