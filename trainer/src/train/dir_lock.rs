//! One run per checkpoint directory: rank 0 takes an exclusive `flock` on `DIR/ddl-train.lock`
//! before it looks into the directory and holds it for the whole run; the kernel releases it
//! when the process ends, however it ends, so a crashed run never leaves the directory locked.
//! The holder writes `pid PID host HOST` into the file, which a refused run names.
//!
//! Without it, two runs started together both found the directory empty, then pruned and
//! replaced each other's checkpoints (one died on a file the other had pruned).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use fs4::fs_std::FileExt;

use crate::error::{Result, TrainError};

/// The lock file in the checkpoint directory (never removed: removing it would let a third
/// run lock a new file while the second still holds the old one).
pub const LOCK_FILE: &str = "ddl-train.lock";

/// How long a refused run waits for a holder that has just taken the lock to write its pid.
const HOLDER_WAIT: Duration = Duration::from_secs(1);

/// The held lock: released when dropped (the file is closed) or when the process ends.
#[derive(Debug)]
pub(crate) struct DirLock {
    _file: File,
    /// Whether the directory did not exist and was created to hold the lock.
    pub(crate) created: bool,
}

/// Creates `dir` if needed and takes its lock, or fails naming the run that holds it.
pub(crate) fn lock(dir: &Path) -> Result<DirLock> {
    let created = !dir.is_dir();
    std::fs::create_dir_all(dir).map_err(|e| TrainError::io(dir, e))?;
    let path = dir.join(LOCK_FILE);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| TrainError::io(&path, e))?;
    if !try_lock(&mut file).map_err(|e| TrainError::io(&path, e))? {
        return Err(TrainError::CheckpointDirLocked {
            dir: dir.to_path_buf(),
            holder: holder(&mut file),
        });
    }
    let line = format!("pid {} host {}\n", std::process::id(), hostname());
    file.set_len(0)
        .and_then(|()| file.seek(SeekFrom::Start(0)))
        .and_then(|_| file.write_all(line.as_bytes()))
        .and_then(|()| file.sync_data())
        .map_err(|e| TrainError::io(&path, e))?;
    Ok(DirLock {
        _file: file,
        created,
    })
}

/// Takes the lock, or finds it held. A lock that names this very process was taken by an
/// earlier run in it and is held on only by a child process it is starting (a fork holds the
/// descriptor until its exec closes it): that one is waited for, up to [`HOLDER_WAIT`].
fn try_lock(file: &mut File) -> std::io::Result<bool> {
    let start = Instant::now();
    let mine = format!("pid {} host {}", std::process::id(), hostname());
    loop {
        if file.try_lock_exclusive()? {
            return Ok(true);
        }
        let mut text = String::new();
        file.seek(SeekFrom::Start(0))?;
        file.read_to_string(&mut text)?;
        if text.trim_end() != mine || start.elapsed() > HOLDER_WAIT {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// "pid PID on host HOST" of the run holding the lock, read from the file it wrote (which
/// it may still be writing: a run that has just taken the lock writes within microseconds).
fn holder(file: &mut File) -> String {
    let start = Instant::now();
    loop {
        let mut text = String::new();
        let read = file
            .seek(SeekFrom::Start(0))
            .and_then(|_| file.read_to_string(&mut text));
        let words: Vec<&str> = text.split_whitespace().collect();
        if let (Ok(_), ["pid", pid, "host", host]) = (read, words.as_slice()) {
            return format!("pid {pid} on host {host}");
        }
        if start.elapsed() > HOLDER_WAIT {
            return "a run that has not written its pid and host".into();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// This machine's name (`gethostname`), or "unknown".
fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is writable for its length; gethostname NUL-terminates within it
    // or truncates.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}
