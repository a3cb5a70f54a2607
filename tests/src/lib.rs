//! ddl-tests: helpers for the end-to-end tests in `tests/`, which run the built binaries
//! (`ddl-synth`, `ddl-pack`, `ddl-train`, ...) the way a user does, `mpirun` included.

#![warn(missing_docs)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub use ddl_testkit::launch::{
    mpirun, mpirun_with, printed, rank_pids, run, run_ok, signal, Launched, LAUNCH_TIMEOUT,
};

/// The directory holding the workspace's built binaries (`target/<profile>/`), found from the
/// running test executable (`target/<profile>/deps/<test>`).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe
        .parent()
        .expect("test executable has a parent directory");
    let dir = if deps.ends_with("deps") {
        deps.parent().expect("deps has a parent")
    } else {
        deps
    };
    dir.to_path_buf()
}

/// Path of the workspace binary `name`; panics with a hint when it was not built.
pub fn bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.exists(),
        "{} not built: run `cargo build --release --workspace` first",
        path.display()
    );
    path
}

/// A command running the workspace binary `name` ([`bin`]), as the user would type it.
pub fn command(name: &str) -> Command {
    Command::new(bin(name))
}

pub use ddl_testkit::{scratch, scratch_until_exit, TempDir};

pub mod slurm;

/// `mpirun -np NP ddl-train --data SHARDS --model resnet_small --workers 1`: the CPU job the
/// end-to-end tests launch; callers add the flags they vary.
pub fn mpirun_train(np: usize, shards: &Path) -> Command {
    let mut cmd = mpirun(np);
    cmd.arg(bin("ddl-train")).arg("--data").arg(shards).args([
        "--model",
        "resnet_small",
        "--workers",
        "1",
    ]);
    cmd
}

/// The training flags of `make demo` (resnet_small at 64 px, one CPU replica per rank, four
/// epochs), added to [`mpirun_train`] by [`demo_train`].
const DEMO_TRAIN_FLAGS: [&str; 12] = [
    "--image-size",
    "64",
    "--batch",
    "32",
    "--devices",
    "cpu:1",
    "--epochs",
    "4",
    "--warmup-epochs",
    "1",
    "--base-lr",
    "0.4",
];

/// Runs `make demo`'s training under `mpirun -np 2` on `shards` with `--metrics metrics`, and
/// returns its last epoch line.
pub fn demo_train(shards: &Path, metrics: &Path) -> serde_json::Value {
    run_ok(
        mpirun_train(2, shards)
            .args(DEMO_TRAIN_FLAGS)
            .arg("--metrics")
            .arg(metrics),
    );
    last_epoch(metrics)
}

/// The last `"type": "epoch"` line of a ddl-train `--metrics` file.
fn last_epoch(metrics: &Path) -> serde_json::Value {
    std::fs::read_to_string(metrics)
        .unwrap_or_else(|e| panic!("reading {}: {e}", metrics.display()))
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON metrics line"))
        .rfind(|v| v["type"] == "epoch")
        .expect("epoch lines")
}

/// The global step at which `ranks` ranks said in `output` that SIGTERM stopped them: one
/// `stopped by SIGTERM after global step N ...: checkpoint PATH written; ... --resume ...`
/// line each, all naming step N and its checkpoint `checkpoint(N)`, and no rank exiting at
/// once instead. Panics with `output` otherwise.
pub fn sigterm_stop_step(output: &str, ranks: usize, checkpoint: impl Fn(u64) -> PathBuf) -> u64 {
    let lines: Vec<&str> = output
        .lines()
        .filter(|l| l.contains("stopped by SIGTERM after global step"))
        .collect();
    assert_eq!(lines.len(), ranks, "one stop line per rank: {output}");
    assert!(!output.contains("exiting now"), "{output}");
    let step: u64 = lines[0]
        .split("global step ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no step in {:?}", lines[0]));
    let path = checkpoint(step).display().to_string();
    for l in &lines {
        assert!(
            l.contains(&format!("global step {step} "))
                && l.contains(&path)
                && l.contains("--resume"),
            "ranks disagree on where to resume: {output}"
        );
    }
    step
}

/// `bin/NAME` of the virtualenv `make setup` filled (the Makefile's `VIRTUAL_ENV`); panics
/// naming it when missing.
pub fn venv_bin(name: &str) -> PathBuf {
    let venv = std::env::var_os("VIRTUAL_ENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| bin("ddl-train").join("../../../.venv"));
    let path = venv.join("bin").join(name);
    assert!(
        path.exists(),
        "{} missing: run `make setup`",
        path.display()
    );
    path
}

/// 160 training images of 4 classes (10 steps per epoch at 2 ranks x batch 8), 8 val images,
/// 2 shards: the data of the tests that stop a job and resume it.
pub const RESUME_DATA: SynthSpec = SynthSpec {
    classes: 4,
    per_class: 40,
    val_per_class: 2,
    seed: 9,
    shards: 2,
    max_short_side: 48,
};

/// What [`synth_and_pack`] writes: a `ddl-synth` tree and its shards.
pub struct SynthSpec {
    /// Classes.
    pub classes: usize,
    /// Training images per class.
    pub per_class: usize,
    /// Validation images per class.
    pub val_per_class: usize,
    /// Seed of the generated images.
    pub seed: u64,
    /// Shards per split.
    pub shards: usize,
    /// `--max-short-side` of the pack.
    pub max_short_side: u32,
}

/// Runs `ddl-synth` into `dir/imagenet` and `ddl-pack` into `dir/shards`, as a user would;
/// returns the shard directory.
pub fn synth_and_pack(dir: &Path, spec: &SynthSpec) -> PathBuf {
    let tree = dir.join("imagenet");
    let shards = dir.join("shards");
    let num = |n: &dyn ToString| n.to_string();
    run_ok(Command::new(bin("ddl-synth")).arg(&tree).args([
        "--classes".to_string(),
        num(&spec.classes),
        "--per-class".to_string(),
        num(&spec.per_class),
        "--val-per-class".to_string(),
        num(&spec.val_per_class),
        "--seed".to_string(),
        num(&spec.seed),
    ]));
    run_ok(
        Command::new(bin("ddl-pack"))
            .arg(&tree)
            .arg("-o")
            .arg(&shards)
            .args([
                "--shards".to_string(),
                num(&spec.shards),
                "--max-short-side".to_string(),
                num(&spec.max_short_side),
            ]),
    );
    shards
}
