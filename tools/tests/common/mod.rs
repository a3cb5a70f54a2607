//! Helpers shared by the ddl-tools integration tests: what a process writes to stderr, write by
//! write, and `mpirun` launches with a deadline.

use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::{Command, ExitStatus, Stdio};

use ddl_testkit::launch::LAUNCH_TIMEOUT;

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
/// message. Reading ends when every holder of the socket has closed it. The command runs under
/// coreutils `timeout` with the testkit's [`LAUNCH_TIMEOUT`] (which signals its process group,
/// `mpirun` stopping its ranks, and kills it 10 s later), so a hang fails the test.
pub fn stderr_writes(cmd: Command) -> Writes {
    let mut timed = Command::new("timeout");
    timed
        .args(["-k", "10", &LAUNCH_TIMEOUT.as_secs().to_string()])
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (key, value) in cmd.get_envs() {
        match value {
            Some(value) => timed.env(key, value),
            None => timed.env_remove(key),
        };
    }
    if let Some(dir) = cmd.get_current_dir() {
        timed.current_dir(dir);
    }
    let mut cmd = timed;
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
    let what = format!("{cmd:?}");
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
    assert!(
        !matches!(out.status.code(), Some(124) | Some(137)),
        "{what} did not finish within {LAUNCH_TIMEOUT:?} and was killed"
    );
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
