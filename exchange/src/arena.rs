//! Where a node keeps the records of other nodes it holds: one shard file per epoch (the
//! format of `loader/FORMAT.md`), `epoch-<E>.ddl` in a directory of its own under a
//! node-local base directory (`/dev/shm` by default: memory the node's ranks map together).
//!
//! The node's leader locks the directory for the run (a second job exchanging the same data
//! for the same node fails with [`ExchangeError::Busy`]), removes the arenas an earlier run
//! that died left there, and removes every file it wrote when the exchange ends. It also
//! removes the arena directories of any data under the same base whose lock no process holds
//! (their job died: a crash, `kill -9`), so that a crashed job's arenas never outlive the
//! next exchange on the node.

use std::fs::File;
use std::path::{Path, PathBuf};

use fs4::fs_std::FileExt;

use crate::error::{ExchangeError, Result};

/// The arena directory of one node.
#[derive(Debug)]
pub(crate) struct ArenaDir {
    dir: PathBuf,
    /// The lock the leader holds (`None` on the node's other ranks).
    lock: Option<File>,
}

impl ArenaDir {
    /// The directory of node `node`'s arenas of `split` of the data in `data`, under `base`.
    pub(crate) fn path(base: &Path, data: &Path, split: &str, node: usize) -> PathBuf {
        let data = std::fs::canonicalize(data).unwrap_or_else(|_| data.to_path_buf());
        let tag = crc32c::crc32c(data.as_os_str().as_encoded_bytes());
        base.join(format!("{PREFIX}{tag:08x}-{split}-node{node}"))
    }

    /// The leader's claim on `dir`: created, locked, emptied of an earlier run's arenas; the
    /// other arena directories beside it that no live job holds are removed.
    pub(crate) fn claim(dir: PathBuf) -> Result<ArenaDir> {
        if let Some(base) = dir.parent() {
            remove_orphans(base, &dir);
        }
        let lock_path = dir.join(LOCK);
        let lock = loop {
            std::fs::create_dir_all(&dir).map_err(io("create directory", &dir))?;
            // The lock file appears at its path already locked (made under another name,
            // locked, then linked there), so that a sweep of orphans beside it (another job's,
            // or another node's leader on the same base) never holds a fresh claim's lock.
            let fresh = tempfile::Builder::new()
                .prefix(".lock-")
                .tempfile_in(&dir)
                .map_err(io("create", &lock_path))?;
            if !fresh
                .as_file()
                .try_lock_exclusive()
                .map_err(io("lock", &lock_path))?
            {
                return Err(ExchangeError::Busy { path: lock_path });
            }
            let old = match fresh.persist_noclobber(&lock_path) {
                Ok(lock) => break lock,
                Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => {
                    match File::open(&lock_path) {
                        Ok(old) => old,
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(io("open", &lock_path)(e)),
                    }
                }
                Err(e) => return Err(io("create", &lock_path)(e.error)),
            };
            // An earlier job's lock file: free when that job died.
            if !old.try_lock_exclusive().map_err(io("lock", &lock_path))? {
                return Err(ExchangeError::Busy { path: lock_path });
            }
            // A job that held the directory until now (or a sweep of orphans) removes the
            // lock file before letting go of it: then the lock taken is of a file no other
            // job finds, and is taken again.
            if same_file(&old, &lock_path) {
                break old;
            }
        };
        remove_arenas(&dir).map_err(io("remove the arenas in", &dir))?;
        Ok(ArenaDir {
            dir,
            lock: Some(lock),
        })
    }

    /// The directory as the node's other ranks see it (they only read from it).
    pub(crate) fn shared(dir: PathBuf) -> ArenaDir {
        ArenaDir { dir, lock: None }
    }

    /// The arena of `epoch`.
    pub(crate) fn arena(&self, epoch: u64) -> PathBuf {
        self.dir.join(format!("epoch-{epoch}.ddl"))
    }

    /// Removes the arena of `epoch` (the leader, once the node serves a later one; the
    /// ranks that still map it keep their mapping until they drop it).
    pub(crate) fn release(&self, epoch: u64) -> Result<()> {
        let path = self.arena(epoch);
        if self.lock.is_some() {
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(ExchangeError::Io {
                        op: "remove",
                        path,
                        source: e,
                    })
                }
                _ => {}
            }
        }
        Ok(())
    }
}

impl Drop for ArenaDir {
    fn drop(&mut self) {
        if self.lock.is_some() {
            let _ = remove_arenas(&self.dir);
            let _ = std::fs::remove_file(self.dir.join(LOCK));
            let _ = std::fs::remove_dir(&self.dir);
        }
    }
}

/// The lock file of an arena directory.
const LOCK: &str = ".lock";
/// The prefix of an arena directory's name ([`ArenaDir::path`]).
const PREFIX: &str = "ddl-exchange-";

/// A closure naming `op` and `path` that makes an [`ExchangeError::Io`] of an I/O error.
fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ExchangeError {
    let path = path.to_path_buf();
    move |source| ExchangeError::Io { op, path, source }
}

/// Whether the open `file` is the file at `path` (not one removed from there since).
fn same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

/// Removes the arenas (and their temporary files) in `dir`, nothing else.
fn remove_arenas(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if is_arena(&path) {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

/// Removes the arena directories under `base` but `ours` whose lock no process holds: the
/// arenas of a job that died, of any data. Each is locked while it is emptied, its lock file
/// removed before it is let go (a job claiming it meanwhile takes it again, [`ArenaDir::claim`]);
/// a directory holding files ddl did not write there keeps them (and stays). Best effort: a
/// directory that cannot be read or locked is left as it is.
fn remove_orphans(base: &Path, ours: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for dir in entries.flatten().map(|e| e.path()) {
        let named = dir
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(PREFIX));
        if !named || dir == ours || !dir.is_dir() {
            continue;
        }
        let lock_path = dir.join(LOCK);
        let Ok(lock) = File::open(&lock_path) else {
            continue; // being created, or not an arena directory
        };
        if lock.try_lock_exclusive().unwrap_or(false) && same_file(&lock, &lock_path) {
            let _ = remove_arenas(&dir);
            let _ = std::fs::remove_file(&lock_path);
            let _ = std::fs::remove_dir(&dir);
        }
    }
}

/// Whether `path` is an arena (or the temporary file of one) this crate writes.
fn is_arena(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let Some(rest) = name.strip_prefix("epoch-") else {
        return false;
    };
    let digits = rest
        .strip_suffix(".ddl")
        .or_else(|| rest.strip_suffix(".ddl.tmp"));
    digits.is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The arena directories of jobs that died (any data, any node) go at the next claim
    /// beside them; those a live job holds, and files ddl did not write, stay.
    #[test]
    fn a_claim_removes_the_arenas_dead_jobs_left_of_any_data() {
        let tmp = ddl_testkit::scratch("arena-orphans");
        let base = tmp.path();
        let dir = |name: &str| base.join(format!("{PREFIX}{name}"));
        let write = |path: PathBuf| {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, b"x").unwrap();
        };
        // Killed mid-exchange: its lock file stays, no process holds it.
        let dead = dir("0000aaaa-train-node1");
        for name in [LOCK, "epoch-2.ddl", "epoch-3.ddl.tmp"] {
            write(dead.join(name));
        }
        // The same, with a file of the user's in it.
        let kept = dir("0000bbbb-val-node0");
        for name in [LOCK, "epoch-0.ddl", "notes.txt"] {
            write(kept.join(name));
        }
        // A job still exchanging, and a folder without a lock (not an arena directory).
        let live = ArenaDir::claim(dir("0000cccc-train-node0")).unwrap();
        write(live.arena(4));
        write(dir("elsewhere").join("epoch-1.ddl"));

        let _ours = ArenaDir::claim(dir("0000dddd-train-node0")).unwrap();
        assert!(!dead.exists(), "a dead job's arena directory stays");
        let left: Vec<String> = std::fs::read_dir(&kept)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, ["notes.txt"]);
        assert!(live.arena(4).exists(), "a live job's arena was removed");
        assert!(dir("elsewhere").join("epoch-1.ddl").exists());
    }

    /// Leaders of several nodes claiming beside each other at once (ranks of an emulated
    /// cluster on one host): each one's sweep of orphans never takes another's fresh lock.
    #[test]
    fn claims_beside_each_other_at_once_all_succeed() {
        let tmp = ddl_testkit::scratch("arena-at-once");
        for round in 0..100 {
            let nodes = 6;
            let start = std::sync::Barrier::new(nodes);
            std::thread::scope(|s| {
                let claims: Vec<_> = (0..nodes)
                    .map(|n| {
                        let dir = tmp
                            .path()
                            .join(format!("{PREFIX}{round:08x}-train-node{n}"));
                        let start = &start;
                        s.spawn(move || {
                            start.wait();
                            ArenaDir::claim(dir)
                        })
                    })
                    .collect();
                for c in claims {
                    let claim = c.join().unwrap();
                    assert!(claim.is_ok(), "round {round}: {:?}", claim.err());
                }
            });
        }
    }

    #[test]
    fn a_second_claim_is_refused_and_leftovers_go_but_nothing_else() {
        let tmp = ddl_testkit::scratch("arena-claim");
        let dir = tmp.path().join("node0");
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["epoch-3.ddl", "epoch-4.ddl.tmp", "notes.txt", "epoch-x.ddl"] {
            std::fs::write(dir.join(name), b"x").unwrap();
        }
        let claim = ArenaDir::claim(dir.clone()).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, [".lock", "epoch-x.ddl", "notes.txt"]);
        let e = ArenaDir::claim(dir.clone()).unwrap_err().to_string();
        assert!(e.contains("locked by another ddl job"), "{e}");
        std::fs::write(claim.arena(5), b"x").unwrap();
        drop(claim);
        assert!(!dir.join("epoch-5.ddl").exists() && !dir.join(".lock").exists());
        assert!(
            dir.join("notes.txt").exists(),
            "a file it did not write stays"
        );
    }
}
