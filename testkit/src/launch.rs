//! Launching the workspace's commands from tests, `mpirun` included, with a deadline: a job
//! that hangs is killed with everything it started and fails its test instead of holding up CI.

use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Longest a launched command (an `mpirun` job, a pack) may run before its test fails: far
/// above what any test's command needs, so only a hang reaches it.
pub const LAUNCH_TIMEOUT: Duration = Duration::from_secs(600);

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

    /// Waits (polling every 5 ms) until `done()` holds; panics if the job ends first or after
    /// [`LAUNCH_TIMEOUT`], naming `what` it waited for.
    pub fn wait_for(&mut self, what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + LAUNCH_TIMEOUT;
        while !done() {
            assert!(!self.exited(), "the job ended before {what}");
            assert!(
                Instant::now() < deadline,
                "no {what} within {LAUNCH_TIMEOUT:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
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

/// `mpirun FLAGS -np NP` with the environment that lets root launch: the flags a test needs
/// (binding, oversubscription), nothing else.
pub fn mpirun_with(flags: &[&str], np: usize) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.args(flags).args(["-np", &np.to_string()]);
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    cmd
}

/// An `mpirun` command for `np` ranks on this machine: oversubscribed and unbound, so that any
/// number of ranks runs on the cores there are.
pub fn mpirun(np: usize) -> Command {
    mpirun_with(&["--oversubscribe", "--bind-to", "none"], np)
}
