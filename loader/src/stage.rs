//! Staging a node's shards into a node-local directory (`OpenOptions::stage`, e.g.
//! `/dev/shm/ddl`) before they are mapped.
//!
//! Two locks live in the stage directory, both `flock`s the kernel releases however the
//! process ends:
//! - `.ddl-stage.lock`, exclusive while one process stages: the ranks of a node stage one at a
//!   time, so that the first copies each shard and the others find it there (a copy renamed
//!   over a file another rank has mapped would read as a shard changed under the job);
//! - `.ddl-stage.owner`, shared by every process that has the directory's shards mapped, for
//!   as long as it does ([`StageClaim`]). Its first holder writes down the data it stages;
//!   while it is held, a job staging other data (whose shards of the same names would replace
//!   the mapped ones) is refused, naming the running job, and a job of the same data joins.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use fs4::fs_std::FileExt;
use serde::{Deserialize, Serialize};

use crate::error::{LoaderError, Result};
use crate::manifest::MANIFEST_FILE;
use crate::shard::{sync_dir, tmp_path};

/// The lock of the process staging.
const STAGING_LOCK: &str = ".ddl-stage.lock";
/// The claim of the processes that have the staged shards mapped.
const OWNER_FILE: &str = ".ddl-stage.owner";

/// Who claimed a stage directory, as its first holder wrote it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Owner {
    /// The first holder's process id.
    pid: u32,
    /// The data directory whose shards are staged.
    data: PathBuf,
    /// crc32c of that data's manifest: the same for every job of the same data.
    manifest: u32,
}

/// A process's share of a stage directory: held while its shards are mapped.
#[derive(Debug)]
pub(crate) struct StageClaim {
    _owner: File,
}

/// The stage directory `stage` (created), locked for this process to stage into, and this
/// process's claim on it for the data in `data`: refused with [`LoaderError::StageInUse`]
/// while a job of other data holds a claim. The staging lock is released when the first
/// file returned is dropped.
pub(crate) fn claim(stage: &Path, data: &Path) -> Result<(File, StageClaim)> {
    std::fs::create_dir_all(stage).map_err(|e| LoaderError::io("create directory", stage, e))?;
    let path = stage.join(STAGING_LOCK);
    let staging = File::create(&path).map_err(|e| LoaderError::io("create", &path, e))?;
    staging
        .lock_exclusive()
        .map_err(|e| LoaderError::io("lock", &path, e))?;
    let manifest = data.join(MANIFEST_FILE);
    let ours = Owner {
        pid: std::process::id(),
        data: std::fs::canonicalize(data).unwrap_or_else(|_| data.to_path_buf()),
        manifest: file_crc32c(&manifest)?.1,
    };
    let path = stage.join(OWNER_FILE);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| LoaderError::io("open", &path, e))?;
    let io = |e| LoaderError::io("lock", &path, e);
    // Under the staging lock no other process takes or converts this one: a claim held is a
    // shared one, and an exclusive lock taken means that no job holds a claim.
    if file.try_lock_exclusive().map_err(io)? {
        let text = serde_json::to_vec(&ours).expect("an owner serializes");
        file.set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)))
            .and_then(|_| file.write_all(&text))
            .map_err(|e| LoaderError::io("write", &path, e))?;
    } else {
        let mut text = String::new();
        file.read_to_string(&mut text)
            .map_err(|e| LoaderError::io("read", &path, e))?;
        match serde_json::from_str::<Owner>(&text) {
            Ok(theirs) if theirs.manifest == ours.manifest => {}
            theirs => {
                let (holder, data) = match theirs {
                    Ok(o) => (format!("pid {}", o.pid), o.data.display().to_string()),
                    Err(_) => ("a job".into(), "data it did not write down".into()),
                };
                return Err(LoaderError::StageInUse {
                    dir: stage.to_path_buf(),
                    holder,
                    theirs: data,
                    ours: ours.data,
                });
            }
        }
    }
    FileExt::lock_shared(&file).map_err(io)?;
    Ok((staging, StageClaim { _owner: file }))
}

/// crc32c and length of a whole file, read in 1 MiB pieces.
fn file_crc32c(path: &Path) -> Result<(u64, u32)> {
    let mut f = File::open(path).map_err(|e| LoaderError::io("open", path, e))?;
    let mut buf = vec![0u8; 1 << 20];
    let (mut len, mut crc) = (0u64, 0u32);
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| LoaderError::io("read", path, e))?;
        if n == 0 {
            return Ok((len, crc));
        }
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        len += n as u64;
    }
}

/// Copies `src` to `dst` unless `dst` already has the expected size and whole-file crc32c;
/// the copy goes through `dst.tmp` and a rename, and is checked against the manifest.
pub(crate) fn stage_file(src: &Path, dst: &Path, bytes: u64, crc: u32) -> Result<()> {
    if let Ok(meta) = std::fs::metadata(dst) {
        if meta.len() == bytes && file_crc32c(dst)?.1 == crc {
            return Ok(());
        }
    }
    let tmp = tmp_path(dst);
    let copied = (|| -> Result<()> {
        let mut input = File::open(src).map_err(|e| LoaderError::io("open", src, e))?;
        let mut out = File::create(&tmp).map_err(|e| LoaderError::io("create", &tmp, e))?;
        std::io::copy(&mut input, &mut out)
            .map_err(|e| LoaderError::io("copy to stage", src, e))?;
        out.flush().map_err(|e| LoaderError::io("write", &tmp, e))?;
        let (len, actual) = file_crc32c(&tmp)?;
        if len != bytes || actual != crc {
            return Err(LoaderError::ShardMismatch {
                path: src.to_path_buf(),
                reason: format!(
                    "{len} bytes with crc32c {actual:#010x}, the manifest says {bytes} bytes \
                     with crc32c {crc:#010x}"
                ),
            });
        }
        std::fs::rename(&tmp, dst).map_err(|e| LoaderError::io("rename", &tmp, e))?;
        if let Some(parent) = dst.parent() {
            sync_dir(parent)?;
        }
        Ok(())
    })();
    if copied.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    copied
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use ddl_testkit::{write_manifest, write_shards, Record};

    use super::*;
    use crate::dataset::{Dataset, OpenOptions, Residency};

    /// Two train shards of 4 records each under `dir`, their JPEGs drawn from `seed`.
    fn data(dir: &Path, seed: usize) -> PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        let shard = |first: usize| -> Vec<Record> {
            (first..first + 4)
                .map(|i| Record::jpeg(ddl_testkit::jpeg(24, 24, seed * 100 + i), (i % 2) as u32))
                .collect()
        };
        let info = write_shards(dir, "train", &[shard(0), shard(4)], 1);
        write_manifest(dir, 2, vec![("train", info)], 1);
        dir.to_path_buf()
    }

    fn open(data: &Path, stage: &Path) -> Result<Dataset> {
        let opts = OpenOptions {
            stage: Some(stage.to_path_buf()),
            ..OpenOptions::default()
        };
        Dataset::open(data, "train", Residency { node: 0, nodes: 1 }, &opts)
    }

    #[test]
    fn a_job_of_other_data_is_refused_while_the_stage_is_mapped() {
        let tmp = ddl_testkit::scratch("stage-claim");
        let (a, b) = (
            data(&tmp.path().join("a"), 1),
            data(&tmp.path().join("b"), 2),
        );
        let stage = tmp.path().join("stage");
        let first = open(&a, &stage).unwrap();
        let rank1 = open(&a, &stage).unwrap(); // another rank of the same job joins
        let e = open(&b, &stage).unwrap_err();
        let said = e.to_string();
        assert!(matches!(e, LoaderError::StageInUse { .. }), "{said}");
        let pid = format!("pid {}", std::process::id());
        let a_dir = std::fs::canonicalize(&a).unwrap();
        assert!(
            said.contains(&pid) && said.contains(&a_dir.display().to_string()),
            "{said}"
        );
        first
            .check_unchanged()
            .expect("the mapped shards were replaced");
        drop(first);
        assert!(
            open(&b, &stage).is_err(),
            "refused while any process maps them"
        );
        drop(rank1);
        // Once no one maps them, the stage is the next job's.
        let second = open(&b, &stage).unwrap();
        second.check_unchanged().unwrap();
    }

    #[test]
    fn the_ranks_of_a_node_stage_one_at_a_time() {
        // While another rank stages (holding the staging lock), an open waits for it, then
        // finds the shards it staged instead of copying its own over them.
        let tmp = ddl_testkit::scratch("stage-lock");
        let a = data(&tmp.path().join("a"), 1);
        let stage = tmp.path().join("stage");
        std::fs::create_dir_all(&stage).unwrap();
        let staging = File::create(stage.join(STAGING_LOCK)).unwrap();
        staging.lock_exclusive().unwrap();
        let (tx, rx) = mpsc::channel();
        let opener = std::thread::spawn({
            let stage = stage.clone();
            move || {
                let opened = open(&a, &stage);
                tx.send(()).unwrap();
                opened
            }
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "opened while another rank was staging"
        );
        drop(staging);
        let opened = opener.join().unwrap().unwrap();
        assert_eq!(opened.len(), 8);
    }
}
