//! A shared-memory region mapped by every rank of a group that shares one node: the medium of
//! the `shm` allreduce.
//!
//! [`SharedRegion::create`] is collective. Rank 0 creates a file under `/dev/shm` (tmpfs)
//! with a random name, reserves its memory (so a full tmpfs fails here, not with SIGBUS on
//! first touch), writes a random token into it and sends the name and token to the others.
//! Each rank maps the file and checks the token; rank 0 gathers the verdicts, deletes the
//! file it created (the mappings stay valid, and nothing is left behind even if a rank dies
//! later) and tells everyone whether all ranks see the same memory. A rank on another node
//! cannot open the file, so the region exists exactly when the whole group shares memory.
//! Dropping a region unmaps it locally; nothing collective happens on drop, so a failed job
//! never hangs in teardown.

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::time::{SystemTime, UNIX_EPOCH};

use memmap2::MmapRaw;

use crate::collective;
use crate::error::{CommError, Result};
use crate::transport::Transport;

/// Bytes at the start of the region holding rank 0's token (one padded cache line pair).
const TOKEN_BYTES: usize = 128;

/// Alignment of every rank's segment and of the counters in it: two cache lines, so that no
/// two ranks' writes ever share a line (or an adjacent-line prefetch pair).
pub(crate) const LINE: usize = 128;

/// A region of `segment_bytes` per rank, mapped at (possibly) different addresses by every
/// rank of one group on one node. Rank `q`'s segment is [`SharedRegion::segment`]`(q)`.
pub(crate) struct SharedRegion {
    map: MmapRaw,
    segment_bytes: usize,
    ranks: usize,
}

// SAFETY: the mapping is plain shared memory; all access goes through raw pointers whose
// synchronisation (atomics with acquire/release) is the algorithm's responsibility.
unsafe impl Send for SharedRegion {}
// SAFETY: as above.
unsafe impl Sync for SharedRegion {}

impl std::fmt::Debug for SharedRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedRegion")
            .field("ranks", &self.ranks)
            .field("segment_bytes", &self.segment_bytes)
            .finish()
    }
}

/// A name no other job or region on this node uses: pid, time and a per-process counter.
fn unique_path() -> PathBuf {
    use std::sync::atomic::Ordering;
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    PathBuf::from(format!("/dev/shm/ddl-{}-{nanos:x}-{n}", std::process::id()))
}

/// A token that tells this region from any other: the time and the address of a local.
fn token() -> u64 {
    let local = 0u8;
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ ((&local as *const u8 as u64).rotate_left(32)) ^ 0x6464_6c2d_7368_6d21
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> CommError {
    CommError::Unsupported(format!("shared memory: {what} {}: {e}", path.display()))
}

/// Creates the file of `bytes` at `path`, reserves its memory and maps it; on failure
/// nothing is left behind.
fn create_mapped(path: &Path, bytes: usize) -> Result<MmapRaw> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| io_err("cannot create", path, e))?;
    let mapped = (|| {
        let len = libc::off_t::try_from(bytes)
            .map_err(|_| CommError::InvalidArgument(format!("shared memory of {bytes} bytes")))?;
        // SAFETY: a valid descriptor of a regular file we own.
        let code = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
        if code != 0 {
            let e = std::io::Error::from_raw_os_error(code);
            return Err(io_err("cannot reserve memory for", path, e));
        }
        MmapRaw::map_raw(&file).map_err(|e| io_err("cannot map", path, e))
    })();
    if mapped.is_err() {
        let _ = std::fs::remove_file(path);
    }
    mapped
}

/// Maps the file rank 0 announced (`token` then path) if it is `bytes` long and holds the
/// token: `None` when this rank does not share rank 0's memory.
fn open_announced(announce: &[u8], bytes: usize) -> Option<MmapRaw> {
    let token = u64::from_le_bytes(announce.get(..8)?.try_into().ok()?);
    let path = PathBuf::from(String::from_utf8(announce[8..].to_vec()).ok()?);
    let file = OpenOptions::new().read(true).write(true).open(path).ok()?;
    if file.metadata().ok()?.len() != bytes as u64 {
        return None;
    }
    let map = MmapRaw::map_raw(&file).ok()?;
    // SAFETY: the mapping is `bytes` (> 8) long and page-aligned.
    let seen = unsafe { map.as_ptr().cast::<u64>().read_volatile() };
    (seen == token).then_some(map)
}

impl SharedRegion {
    /// Collective over `t`: a region of `segment_bytes` (rounded up to [`LINE`]) per rank,
    /// zero-filled, or `None` when the ranks do not all share one node's memory (every rank
    /// gets the same answer). Errors are those of the transport (a rank that does not take
    /// part times out).
    pub(crate) fn create(t: &dyn Transport, segment_bytes: usize) -> Result<Option<SharedRegion>> {
        let p = t.size();
        let segment_bytes = segment_bytes.div_ceil(LINE) * LINE;
        let total = TOKEN_BYTES + p * segment_bytes;
        let mut created: Option<(MmapRaw, PathBuf)> = None;
        let mut announce = Vec::new();
        if t.rank() == 0 {
            let path = unique_path();
            if let Ok(map) = create_mapped(&path, total) {
                let token = token();
                // SAFETY: the mapping is at least TOKEN_BYTES long and page-aligned.
                unsafe { map.as_mut_ptr().cast::<u64>().write_volatile(token) };
                announce = token.to_le_bytes().to_vec();
                announce.extend_from_slice(path.to_string_lossy().as_bytes());
                created = Some((map, path));
            }
        }
        let announce = collective::broadcast_bytes(t, announce);
        let (map, path) = match created {
            Some((map, path)) => (Some(map), Some(path)),
            None => (
                announce
                    .as_ref()
                    .ok()
                    .and_then(|a| open_announced(a, total)),
                None,
            ),
        };
        let verdict = announce.and_then(|_| collective::all(t, map.is_some()));
        if let Some(path) = &path {
            // The file is rank 0's own; every rank that could map it has, and the mappings
            // outlive its name.
            let _ = std::fs::remove_file(path);
        }
        let all_ok = verdict?;
        Ok(map.filter(|_| all_ok).map(|map| SharedRegion {
            map,
            segment_bytes,
            ranks: p,
        }))
    }

    /// Start of rank `q`'s segment (aligned to [`LINE`]).
    pub(crate) fn segment(&self, q: usize) -> *mut u8 {
        assert!(q < self.ranks);
        // SAFETY: within the mapping: TOKEN_BYTES + ranks * segment_bytes bytes.
        unsafe {
            self.map
                .as_mut_ptr()
                .add(TOKEN_BYTES + q * self.segment_bytes)
        }
    }
}
