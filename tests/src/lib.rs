//! ddl-tests: helpers for the end-to-end tests in `tests/`, which run the built binaries
//! (`ddl-synth`, `ddl-pack`, `ddl-train`, ...) the way a user does, `mpirun` included.

#![warn(missing_docs)]

use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Longest a launched command (an `mpirun` job, a pack) may run before its test fails: far
/// above what any test's command needs, so only a hang reaches it.
pub const LAUNCH_TIMEOUT: Duration = Duration::from_secs(600);

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

pub use ddl_testkit::{scratch, TempDir};

/// The threads reading a child's stdout and stderr to the end.
type OutputReaders = (JoinHandle<Vec<u8>>, JoinHandle<Vec<u8>>);

/// A command running in a session of its own, with its stdout and stderr captured: `mpirun`
/// and its ranks can be signalled or killed together through the session (Open MPI puts each
/// rank into a process group of its own, so a process-group kill would leave the ranks
/// running). Dropping it kills the job if it still runs.
pub struct Launched {
    child: Child,
    what: String,
    readers: Option<OutputReaders>,
}

fn drain(mut from: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = from.read_to_end(&mut out);
        out
    })
}

impl Launched {
    /// Starts `cmd` in a new session, capturing its output.
    pub fn start(cmd: &mut Command) -> Launched {
        // SAFETY: setsid(2) is async-signal-safe, and nothing else runs in the forked child.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
        let out = drain(child.stdout.take().expect("piped stdout"));
        let err = drain(child.stderr.take().expect("piped stderr"));
        Launched {
            child,
            what: format!("{cmd:?}"),
            readers: Some((out, err)),
        }
    }

    /// Process id of the command (and id of its session).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it has exited (without waiting).
    pub fn exited(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_some()
    }

    /// Sends `signal` to every process of the job: the command and all it started (its
    /// session).
    pub fn signal_job(&self, sig: i32) {
        let session = self.child.id();
        for (pid, _) in processes().filter(|(_, f)| f.session == session) {
            signal(pid, sig);
        }
    }

    /// Waits for the command to end; after `limit` kills the job and panics with
    /// everything it printed, so that a hang fails the test instead of the CI run.
    pub fn wait_within(mut self, limit: Duration) -> Output {
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            if start.elapsed() > limit {
                self.signal_job(libc::SIGKILL);
                let _ = self.child.wait();
                let out = self.collect(ExitStatus::from_raw(libc::SIGKILL));
                panic!(
                    "{} still ran after {limit:?}: killed\n--- stdout\n{}\n--- stderr\n{}",
                    self.what,
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.collect(status)
    }

    fn collect(&mut self, status: ExitStatus) -> Output {
        let (out, err) = self.readers.take().expect("output collected once");
        Output {
            status,
            stdout: out.join().unwrap_or_default(),
            stderr: err.join().unwrap_or_default(),
        }
    }
}

impl Drop for Launched {
    fn drop(&mut self) {
        if self.readers.is_some() && !self.exited() {
            self.signal_job(libc::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

/// The fields of `/proc/PID/stat` that the tests use.
struct ProcStat {
    ppid: u32,
    session: u32,
}

/// Every process this test can see, with its parent and session.
fn processes() -> impl Iterator<Item = (u32, ProcStat)> {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            // "pid (comm) state ppid pgrp session ..."; comm may hold spaces: split after ')'.
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let mut fields = stat.rsplit_once(')')?.1.split_whitespace().skip(1);
            let ppid = fields.next()?.parse().ok()?;
            let session = fields.nth(1)?.parse().ok()?;
            Some((pid, ProcStat { ppid, session }))
        })
}

/// The process ids of the ranks `mpirun` (process `mpirun_pid`) started, by world rank: its
/// child processes, each ranked by the `OMPI_COMM_WORLD_RANK` of its environment.
pub fn rank_pids(mpirun_pid: u32) -> Vec<(usize, u32)> {
    let mut out: Vec<(usize, u32)> = processes()
        .filter(|(_, f)| f.ppid == mpirun_pid)
        .filter_map(|(pid, _)| {
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let rank = env
                .split(|&b| b == 0)
                .filter_map(|kv| std::str::from_utf8(kv).ok())
                .find_map(|kv| kv.strip_prefix("OMPI_COMM_WORLD_RANK="))
                .and_then(|r| r.parse().ok())?;
            Some((rank, pid))
        })
        .collect();
    out.sort_unstable();
    out
}

/// Sends `signal` to process `pid`.
pub fn signal(pid: u32, signal: i32) {
    // SAFETY: kill(2) with a plain pid and signal number; no memory is involved.
    unsafe { libc::kill(pid as i32, signal) };
}

/// Runs `cmd` to its end within [`LAUNCH_TIMEOUT`] and returns its output, whatever its exit.
pub fn run(cmd: &mut Command) -> Output {
    Launched::start(cmd).wait_within(LAUNCH_TIMEOUT)
}

/// Stdout and stderr of `out`, for assertion messages.
pub fn printed(out: &Output) -> String {
    format!(
        "{}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `cmd` within [`LAUNCH_TIMEOUT`], panicking with its stdout and stderr when it fails.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed with {}",
        printed(&out)
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
