//! The shard mappings of this process, and a SIGBUS report that names the shard a fault hit.
//!
//! Reading a memory-mapped page past the end of a file that was truncated after it was mapped
//! raises SIGBUS, which by default kills the process without naming any file. Every
//! [`crate::shard::ShardReader`] registers its mapping here; [`report_sigbus`] installs a
//! handler that, when the faulting address lies in a registered mapping, writes one line naming
//! the shard and the offset to stderr before the process dies of SIGBUS as it would have
//! anyway (so exit status and core dumps are unchanged). Shards must stay read-only while a job
//! maps them (see `loader/FORMAT.md`); [`crate::shard::ShardReader::check_unchanged`] catches a
//! change between epochs, this handler the ones that land in the middle of one.

use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Once, RwLock};

use signal_hook::consts::SIGBUS;

/// One registered mapping.
struct Mapped {
    id: u64,
    start: usize,
    len: usize,
    path: PathBuf,
}

/// Every live shard mapping of the process, with the id counter.
static MAPPINGS: RwLock<(u64, Vec<Mapped>)> = RwLock::new((0, Vec::new()));

/// Keeps a mapping registered while alive; dropping it unregisters the mapping.
#[derive(Debug)]
pub(crate) struct Registration(u64);

/// Registers the mapping of `path` at `start..start + len`.
pub(crate) fn register(start: *const u8, len: usize, path: &Path) -> Registration {
    let mut m = MAPPINGS.write().unwrap_or_else(|p| p.into_inner());
    m.0 += 1;
    let id = m.0;
    m.1.push(Mapped {
        id,
        start: start as usize,
        len,
        path: path.to_path_buf(),
    });
    Registration(id)
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut m = MAPPINGS.write().unwrap_or_else(|p| p.into_inner());
        m.1.retain(|x| x.id != self.0);
    }
}

/// Installs the SIGBUS report (once per process; later calls do nothing). A binary that maps
/// shards calls it at start.
pub fn report_sigbus() -> std::io::Result<()> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        // SAFETY: the action only reads the registry without blocking (try_read), formats into
        // a stack buffer (no allocation), and calls write(2) and the async-signal-safe default
        // handler emulation; it never panics.
        result = unsafe {
            signal_hook_registry::register_sigaction(SIGBUS, |info: &libc::siginfo_t| {
                // The kernel fills si_addr for SIGBUS.
                let addr = info.si_addr() as usize;
                report(addr);
                let _ = signal_hook::low_level::emulate_default_handler(SIGBUS);
            })
        }
        .map(|_| ());
    });
    result
}

/// Writes the report line for a fault at `addr` to stderr.
fn report(addr: usize) {
    let mut buf = [0u8; 1536];
    let mut out = std::io::Cursor::new(&mut buf[..]);
    // A fault never happens while this thread holds the registry lock (the registry code
    // touches no mapping), so try_read only fails while another thread registers a shard.
    let hit = MAPPINGS.try_read().ok().and_then(|m| {
        m.1.iter()
            .find(|x| addr >= x.start && addr < x.start + x.len)
            .map(|x| {
                let _ = out.write_all(b"ddl: SIGBUS reading shard ");
                let _ = out.write_all(x.path.as_os_str().as_bytes());
                let _ = writeln!(
                    out,
                    " at byte {}: the file was truncated or rewritten while this process had \
                     it mapped. Shards must stay read-only while a job uses them: restore the \
                     file (ddl-pack's verification checks it) and resume from the last \
                     checkpoint.",
                    addr - x.start
                );
            })
    });
    if hit.is_none() {
        let _ = writeln!(
            out,
            "ddl: SIGBUS at address {addr:#x}, outside every shard mapping"
        );
    }
    let n = out.position() as usize;
    // SAFETY: write(2) of `n` initialised bytes of `buf` to stderr.
    unsafe { libc::write(2, buf.as_ptr().cast(), n) };
}
