//! Helpers shared by the ddl-tools integration tests: what a process writes to stderr, write by
//! write, and `mpirun` launches with a deadline.


use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::{Command, ExitStatus, Output, Stdio};

/// Seconds an `mpirun` launch of a test may take before it is killed.
pub const MPIRUN_LIMIT_S: u32 = 300;

/// What a process printed: its status, stdout, and each `write` it made to stderr.
pub struct Writes {
    /// Exit status.
    pub status: ExitStatus,
    /// Everything on stdout.
    pub stdout: String,
    /// Every write to stderr, in order (one element per `write` call).
    pub stderr: Vec<String>,
}

impl Writes {
    /// All of stderr as one string.
    pub fn stderr_text(&self) -> String {
        self.stderr.concat()
    }

    /// Stdout and stderr, for failure messages.
    pub fn all(&self) -> String {
        format!(
            "status {:?}\n--- stdout\n{}\n--- stderr writes\n{:#?}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// Runs `cmd` with stderr connected to a `SOCK_SEQPACKET` socket, which keeps the boundaries
/// of writes: each `write` the process (or its children) makes to stderr arrives as one
/// message. Reading ends when every holder of the socket has closed it.
pub fn stderr_writes(mut cmd: Command) -> Writes {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` is a valid array of two ints for socketpair to fill.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0, "socketpair: {}", std::io::Error::last_os_error());
    // SAFETY: socketpair returned two fresh descriptors that nothing else owns.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    cmd.stdout(Stdio::piped()).stderr(Stdio::from(theirs));
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
    // Closes this process's copy of the child's end: reading then ends with the child's.
    drop(cmd);
    let reader = std::thread::spawn(move || {
        let mut sock = UnixStream::from(ours);
        let mut buf = vec![0u8; 1 << 20];
        let mut writes = Vec::new();
        loop {
            let n = sock.read(&mut buf).expect("read stderr socket");
            if n == 0 {
                return writes;
            }
            writes.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    });
    let out = child.wait_with_output().expect("wait for child");
    Writes {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: reader.join().expect("stderr reader"),
    }
}

/// Asserts that neither stdout nor stderr holds an ANSI escape sequence (both are pipes or
/// sockets here, never terminals).
pub fn assert_no_ansi(w: &Writes) {
    assert!(
        !w.stdout.contains("\x1b[") && !w.stderr_text().contains("\x1b["),
        "ANSI escape codes in output to a pipe:\n{}",
        w.all()
    );
}

/// `timeout mpirun -np NP` (root and oversubscription allowed): coreutils `timeout` puts the
/// job in its own process group and, after [`MPIRUN_LIMIT_S`] seconds, signals the whole group
/// (then kills it 10 s later), so a hang fails the test instead of holding up CI.
pub fn mpirun(np: usize) -> Command {
    let mut cmd = Command::new("timeout");
    cmd.args(["-k", "10", &MPIRUN_LIMIT_S.to_string(), "mpirun"])
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            &np.to_string(),
        ]);
    cmd
}

/// Panics with a clear message when a launch from [`mpirun`] ran out of time.
pub fn assert_not_timed_out(status: ExitStatus, all: &str) {
    assert!(
        !matches!(status.code(), Some(124) | Some(137)),
        "mpirun did not finish within {MPIRUN_LIMIT_S} s and was killed:\n{all}"
    );
}

/// Runs an [`mpirun`] command to completion, failing the test if it ran out of time.
pub fn mpirun_output(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .expect("timeout and mpirun (Open MPI) must be installed");
    assert_not_timed_out(
        out.status,
        &format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    );
    out
}
