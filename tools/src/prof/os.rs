//! What the profiler asks the operating system: thread CPU time, bytes read from storage,
//! the page cache's share of the shards.

use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use ddl_loader::shard::cached_bytes;

/// CPU time the calling thread has used, in nanoseconds (0 if the clock is unavailable).
pub(crate) fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Bytes this process has read from storage so far (`read_bytes` of `/proc/self/io`), if the
/// kernel reports it.
pub fn storage_read_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/io").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("read_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Drops the clean pages of `paths` from the page cache (`posix_fadvise(DONTNEED)` over each
/// whole file, after `fdatasync`). Pages that a process still has mapped stay resident, so
/// callers unmap the shards first.
pub fn drop_page_cache(paths: &[PathBuf]) -> Result<()> {
    for p in paths {
        let f = File::open(p).with_context(|| format!("open {}", p.display()))?;
        f.sync_data()
            .with_context(|| format!("fdatasync {}", p.display()))?;
        // SAFETY: plain syscall on a file descriptor we own; offset 0, len 0 = whole file.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if rc != 0 {
            bail!(
                "posix_fadvise(DONTNEED) on {}: {}",
                p.display(),
                std::io::Error::from_raw_os_error(rc)
            );
        }
    }
    Ok(())
}

/// Bytes of `paths` resident in the page cache (`mincore` on a fresh mapping of each file;
/// nothing is read, so measuring does not bring pages in).
pub fn resident_bytes(paths: &[PathBuf]) -> Result<u64> {
    let mut total = 0;
    for p in paths {
        total += cached_bytes(p)?;
    }
    Ok(total)
}
