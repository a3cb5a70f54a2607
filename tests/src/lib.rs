//! ddl-tests: helpers for the end-to-end tests in `tests/`, which run the built binaries
//! (`ddl-synth`, `ddl-pack`, `ddl-train`, ...) the way a user does, `mpirun` included.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

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

/// A fresh, empty scratch directory for one test, removed when dropped.
pub struct Scratch(PathBuf);

impl Scratch {
    /// Creates `$TMPDIR/ddl-test-<tag>-<pid>-<n>`.
    pub fn new(tag: &str) -> Scratch {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ddl-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        Scratch(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `cmd`, panicking with its stdout and stderr when it fails.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed with {}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// An `mpirun` command for `np` ranks on this machine, with the flags root and
/// oversubscription need.
pub fn mpirun(np: usize) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.args([
        "--oversubscribe",
        "--bind-to",
        "none",
        "-np",
        &np.to_string(),
    ]);
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    cmd
}

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
