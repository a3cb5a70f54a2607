//! Whether a node can hold what the exchange gives it: besides its own shards, at most two
//! arenas of other nodes' records at once (the epoch's, and the next epoch's while it is
//! received), each at most the most records of other nodes the node holds in an epoch of the
//! run ([`ddl_loader::placement::Placement::most_foreign`]), at the split's average record
//! size.

use std::path::Path;

use crate::error::{ExchangeError, Result};

/// Fails, with the figures, when two arenas of `records` records of `avg` bytes do not fit
/// in the memory available to the arena directory `dir`: the smaller of `MemAvailable` and
/// the free space of its file system (`/dev/shm` is limited by both).
pub fn check(fraction: f64, node: usize, records: u64, avg: f64, dir: &Path) -> Result<()> {
    let need = (2.0 * records as f64 * avg).ceil() as u64;
    let mut limits = Vec::new();
    if let Some(free) = ddl_loader::limits::available_memory() {
        limits.push((free, "MemAvailable".to_string()));
    }
    if let Some(free) = free_space(dir) {
        limits.push((free, format!("free space of {}", dir.display())));
    }
    match limits.into_iter().min_by_key(|(free, _)| *free) {
        Some((available, why)) if need > available => Err(ExchangeError::Memory {
            fraction,
            node,
            records,
            avg,
            need,
            available,
            why,
        }),
        _ => Ok(()),
    }
}

/// Bytes an unprivileged process may still write on the file system of `dir` (or its
/// nearest existing ancestor).
fn free_space(dir: &Path) -> Option<u64> {
    let existing = dir.ancestors().find(|d| d.exists())?;
    let c = std::ffi::CString::new(existing.as_os_str().as_encoded_bytes()).ok()?;
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `s` a valid statvfs to fill.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return None;
    }
    Some(s.f_bavail as u64 * s.f_frsize as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn too_many_records_for_the_machine_are_refused_with_the_figures() {
        let tmp = ddl_testkit::scratch("exchange-memory");
        let e = check(0.5, 2, 1 << 40, 110_000.0, tmp.path())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("exchanging 0.5")
                && e.contains("node 2")
                && e.contains("1099511627776 records"),
            "{e}"
        );
        assert!(e.contains("bytes") && e.contains("available"), "{e}");
        check(0.5, 2, 10, 110_000.0, tmp.path()).unwrap();
    }
}
