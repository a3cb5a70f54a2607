//! Where a node keeps the records of other nodes it holds: one shard file per epoch (the
//! format of `loader/FORMAT.md`), `epoch-<E>.ddl` in a directory of its own under a
//! node-local base directory (`/dev/shm` by default: memory the node's ranks map together).
//!
//! The node's leader locks the directory for the run (a second job exchanging the same data
//! for the same node fails with [`ExchangeError::Busy`]), removes the arenas an earlier run
//! that died left there, and removes every file it wrote when the exchange ends.

use std::fs::File;
use std::path::{Path, PathBuf};

use fs4::fs_std::FileExt;

use crate::error::{ExchangeError, Result};

/// The arena directory of one node.
#[derive(Debug)]
pub(crate) struct ArenaDir {
    dir: PathBuf,
    /// The lock the leader holds (`None` on the node's other ranks).
    lock: Option<(PathBuf, File)>,
}

impl ArenaDir {
    /// The directory of node `node`'s arenas of `split` of the data in `data`, under `base`.
    pub(crate) fn path(base: &Path, data: &Path, split: &str, node: usize) -> PathBuf {
        let data = std::fs::canonicalize(data).unwrap_or_else(|_| data.to_path_buf());
        let tag = crc32c::crc32c(data.as_os_str().as_encoded_bytes());
        base.join(format!("ddl-exchange-{tag:08x}-{split}-node{node}"))
    }

    /// The leader's claim on `dir`: created, locked, emptied of an earlier run's arenas.
    pub(crate) fn claim(dir: PathBuf) -> Result<ArenaDir> {
        let io = |op, path: &Path| {
            let path = path.to_path_buf();
            move |source| ExchangeError::Io { op, path, source }
        };
        std::fs::create_dir_all(&dir).map_err(io("create directory", &dir))?;
        let lock_path = dir.join(".lock");
        let lock = File::create(&lock_path).map_err(io("create", &lock_path))?;
        if !lock.try_lock_exclusive().map_err(io("lock", &lock_path))? {
            return Err(ExchangeError::Busy { path: lock_path });
        }
        for entry in std::fs::read_dir(&dir).map_err(io("read directory", &dir))? {
            let path = entry.map_err(io("read directory", &dir))?.path();
            if is_arena(&path) {
                std::fs::remove_file(&path).map_err(io("remove", &path))?;
            }
        }
        Ok(ArenaDir {
            dir,
            lock: Some((lock_path, lock)),
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
        let Some((lock_path, _lock)) = &self.lock else {
            return;
        };
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for path in entries.flatten().map(|e| e.path()) {
                if is_arena(&path) {
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        let _ = std::fs::remove_file(lock_path);
        let _ = std::fs::remove_dir(&self.dir);
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
