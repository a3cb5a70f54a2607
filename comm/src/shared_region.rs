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
//!
//! A rank waiting on a peer's counter also watches that peer's process (a pidfd, where the
//! ranks share a pid namespace): a peer that exited is reported within [`LIVENESS`] as
//! [`CommError::PeerExited`], not after the whole timeout (a message transport learns it
//! from the closed connection at once).

use std::fs::OpenOptions;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use memmap2::MmapRaw;

use crate::collective;
use crate::cores;
use crate::error::{CommError, Result};
use crate::transport::Transport;

/// Bytes at the start of the region holding rank 0's token (one padded cache line pair).
const TOKEN_BYTES: usize = 128;

/// Alignment of every rank's segment and of the counters in it: two cache lines, so that no
/// two ranks' writes ever share a line (or an adjacent-line prefetch pair).
pub(crate) const LINE: usize = 128;

/// Bytes of the counter lines at the start of every segment: counters 0 and 1 (see
/// [`SharedRegion::counter`]).
pub(crate) const COUNTER_BYTES: usize = 2 * LINE;

/// How long a waiting rank spins on a counter before it sleeps on it, while every rank has a
/// core of its own: longer than the ranks drift apart over one chunk when all of them run,
/// shorter than what a rank that lost its core takes to come back.
const SPIN: Duration = Duration::from_micros(50);

/// Polls between two looks at the clock while spinning.
const POLLS_PER_LOOK: u32 = 32;

/// Longest sleep on a counter before the waiting rank looks again (and checks its timeout).
const SLEEP: Duration = Duration::from_millis(5);

/// How often a rank that has waited that long on a peer's counter checks that the peer's
/// process still runs.
const LIVENESS: Duration = Duration::from_millis(100);

/// How a rank waits for the others' counters: it spins a little (not at all when the node's
/// ranks outnumber its cores: its spinning would take the core from a rank with work to do),
/// then sleeps on the counter until the rank it waits for publishes. It never yields: a
/// yielding rank hands its core to whatever else runs on the host for a whole time slice,
/// and on a host shared with other work every chunk's wait became milliseconds (BENCHMARKS.md,
/// "Why `shm` ran at ~2 GB/s here"), where a sleeping one is woken as soon as the counter
/// moves.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pace {
    /// Spinning before sleeping ([`SPIN`], or nothing when the ranks outnumber the cores).
    spin: Duration,
}

impl Pace {
    /// The pace of the ranks of `t`, one node's: from how many cores they share (collective).
    pub(crate) fn of(t: &dyn Transport) -> Result<Pace> {
        let oversubscribed = cores::oversubscribed(t)?;
        Ok(Pace {
            spin: if oversubscribed { Duration::ZERO } else { SPIN },
        })
    }
}

/// A region of `segment_bytes` per rank, mapped at (possibly) different addresses by every
/// rank of one group on one node. Rank `q`'s segment is [`SharedRegion::segment`]`(q)`.
pub(crate) struct SharedRegion {
    map: MmapRaw,
    segment_bytes: usize,
    ranks: usize,
    /// A pidfd of every other rank's process that this rank can watch (`None` for itself, a
    /// rank of this process, or one in another pid namespace).
    peers: Vec<Option<OwnedFd>>,
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
        let Some(map) = map.filter(|_| all_ok) else {
            return Ok(None);
        };
        // Every rank has the region (the verdict is the same on all): each learns the others'
        // processes, to tell a dead peer from a slow one while it waits.
        let ids = collective::allgather_bytes(t, process_id().into_bytes())?;
        let region = SharedRegion {
            map,
            segment_bytes,
            ranks: p,
            peers: ids.iter().map(|id| watch(id)).collect(),
        };
        region.prefault(t.rank());
        Ok(Some(region))
    }

    /// Whether rank `q`'s process is known to have exited (never for a rank it cannot watch).
    fn exited(&self, q: usize) -> bool {
        let Some(fd) = &self.peers[q] else {
            return false;
        };
        let mut poll = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; a zero timeout never blocks. A pidfd polls readable once
        // its process has terminated.
        unsafe { libc::poll(&mut poll, 1, 0) == 1 && poll.revents & libc::POLLIN != 0 }
    }

    /// Fills this rank's page tables for the whole region now, writable over its own segment
    /// (the only one it writes), without touching the data: otherwise the first calls that
    /// reach new slots take a minor fault per page and run several times slower than the
    /// calls after them, which misleads `auto`'s tuning (BENCHMARKS.md, issue 33). Best
    /// effort: a kernel older than Linux 5.14 faults as the calls go.
    fn prefault(&self, me: usize) {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let base = self.map.as_mut_ptr() as usize;
        let populate = |from: usize, to: usize, advice: libc::c_int| {
            let start = from / page * page;
            // SAFETY: a page-aligned range within the mapping; these advices only populate
            // page tables (no data changes), and failure leaves the mapping as it was.
            unsafe { libc::madvise(start as *mut libc::c_void, to - start, advice) };
        };
        populate(base, base + self.map.len(), libc::MADV_POPULATE_READ);
        let own = self.segment(me) as usize;
        populate(own, own + self.segment_bytes, libc::MADV_POPULATE_WRITE);
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

    /// Counter `c` (0 or 1) of rank `q`: the first half of line `c` of its segment, whose
    /// second half counts the ranks sleeping on it. The user reserves [`COUNTER_BYTES`] at the
    /// start of every segment.
    pub(crate) fn counter(&self, q: usize, c: usize) -> &AtomicU64 {
        assert!(c < COUNTER_BYTES / LINE && self.segment_bytes >= COUNTER_BYTES);
        // SAFETY: counters lie at the start of every segment, LINE-aligned, zero-initialised,
        // and are only ever accessed atomically.
        unsafe { &*self.segment(q).add(c * LINE).cast::<AtomicU64>() }
    }

    /// How many ranks sleep on counter `c` of rank `q` (the line's second half).
    fn sleepers(&self, q: usize, c: usize) -> &AtomicU32 {
        assert!(c < COUNTER_BYTES / LINE && self.segment_bytes >= COUNTER_BYTES);
        // SAFETY: the second half of the counter's line, zero-initialised, only accessed
        // atomically.
        unsafe { &*self.segment(q).add(c * LINE + LINE / 2).cast::<AtomicU32>() }
    }

    /// Sets this rank's counter `c` to `value` and wakes the ranks sleeping on it.
    pub(crate) fn publish(&self, me: usize, c: usize, value: u64) {
        let counter = self.counter(me, c);
        counter.store(value, Ordering::SeqCst);
        if self.sleepers(me, c).load(Ordering::SeqCst) > 0 {
            futex_wake(counter);
        }
    }

    /// Waits until counter `c` of every rank of `ranks` reaches `target`, at `pace`; fails with
    /// a timeout naming `op` and the rank waited for after `t`'s timeout.
    pub(crate) fn wait_all(
        &self,
        t: &dyn Transport,
        ranks: std::ops::Range<usize>,
        c: usize,
        target: u64,
        pace: Pace,
        op: &'static str,
    ) -> Result<()> {
        let mut polls = 0u32;
        let mut since: Option<Instant> = None;
        let mut look_at_peer = LIVENESS;
        for q in ranks {
            let counter = self.counter(q, c);
            while counter.load(Ordering::Acquire) < target {
                polls = polls.wrapping_add(1);
                if polls % POLLS_PER_LOOK != 0 {
                    std::hint::spin_loop();
                    continue;
                }
                let waited = since.get_or_insert_with(Instant::now).elapsed();
                if waited > t.timeout() {
                    return Err(CommError::Timeout {
                        op,
                        rank: t.rank(),
                        peer: Some(q),
                        timeout: t.timeout(),
                    });
                }
                if waited >= look_at_peer {
                    look_at_peer = waited + LIVENESS;
                    if let Some(e) = t.failure(op) {
                        return Err(e);
                    }
                    if self.exited(q) {
                        return Err(CommError::PeerExited {
                            op,
                            rank: t.rank(),
                            peer: q,
                        });
                    }
                }
                if waited >= pace.spin {
                    let sleepers = self.sleepers(q, c);
                    sleepers.fetch_add(1, Ordering::SeqCst);
                    let seen = counter.load(Ordering::SeqCst);
                    if seen < target {
                        futex_wait(counter, seen);
                    }
                    sleepers.fetch_sub(1, Ordering::SeqCst);
                }
            }
        }
        Ok(())
    }
}

/// This process as the other ranks of a region see it: `pid namespace`, where `pid` is its
/// pid and `namespace` the link of its pid namespace (empty where it cannot be read).
fn process_id() -> String {
    let ns = std::fs::read_link("/proc/self/ns/pid")
        .map(|l| l.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("{} {ns}", std::process::id())
}

/// A pidfd of the process `id` ([`process_id`] of a rank) when this process can watch it:
/// another process in this pid namespace (a pid of another namespace names another process
/// here), on a kernel with pidfds (Linux 5.3); `None` otherwise.
fn watch(id: &[u8]) -> Option<OwnedFd> {
    let (pid, ns) = std::str::from_utf8(id).ok()?.split_once(' ')?;
    let pid: libc::pid_t = pid.parse().ok()?;
    let (me, my_ns) = (std::process::id(), process_id());
    let same_ns = !ns.is_empty() && my_ns.split_once(' ').map(|(_, n)| n) == Some(ns);
    if !same_ns || u32::try_from(pid).ok()? == me {
        return None;
    }
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    // SAFETY: a descriptor pidfd_open just returned, owned by nothing else.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// The futex word of `counter`: its low 32 bits.
fn futex_word(counter: &AtomicU64) -> *mut u32 {
    let low = usize::from(cfg!(target_endian = "big"));
    // SAFETY: within the counter's 8 bytes.
    unsafe { counter.as_ptr().cast::<u32>().add(low) }
}

/// Sleeps while the low 32 bits of `counter` still equal those of `seen` (at most [`SLEEP`]);
/// returns early on a wake-up, a signal or a changed value (the caller looks again). Not
/// `FUTEX_PRIVATE`: the ranks are processes sharing the region.
fn futex_wait(counter: &AtomicU64, seen: u64) {
    let timeout = libc::timespec {
        tv_sec: 0,
        tv_nsec: SLEEP.as_nanos() as libc::c_long,
    };
    // SAFETY: the futex word lies within the counter, valid for the call; the kernel only
    // reads it.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            futex_word(counter),
            libc::FUTEX_WAIT,
            seen as u32,
            &timeout as *const libc::timespec,
            std::ptr::null::<u32>(),
            0,
        );
    }
}

/// Wakes every rank sleeping on `counter` ([`futex_wait`]).
fn futex_wake(counter: &AtomicU64) {
    // SAFETY: as in `futex_wait`.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            futex_word(counter),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0,
        );
    }
}
