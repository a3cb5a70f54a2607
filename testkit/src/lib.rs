//! ddl-testkit: what ddl's tests share, so that every crate's tests build their fixtures the
//! same way: scratch directories ([`scratch`]), real JPEGs ([`jpeg`]), shards with a
//! manifest written through ddl-loader's own writer ([`write_shards`], [`write_manifest`]),
//! and a closed pipe to write into ([`closed_pipe`]).

#![warn(missing_docs)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, Once};

use ddl_loader::manifest::{ClassInfo, Manifest, ShardInfo, SplitInfo};
use ddl_loader::shard::ShardWriter;
pub mod launch;

pub use tempfile::TempDir;
pub use turbojpeg::Subsamp;

/// A pipe whose reading end is already closed, for a child's stdout: its first write fails
/// (EPIPE), as when the reader of `ddl-predict ... | head` has gone.
pub fn closed_pipe() -> std::process::Stdio {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills the two descriptors; the read end is closed at once and the write
    // end owned by the returned Stdio.
    unsafe {
        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0, "pipe(2)");
        libc::close(fds[0]);
        std::process::Stdio::from(std::os::fd::OwnedFd::from_raw_fd(fds[1]))
    }
}

/// A standard output that is a full disk (`/dev/full`: every write fails with ENOSPC), for the
/// tests of what a binary does when its output cannot be written.
pub fn full_disk() -> std::process::Stdio {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    std::process::Stdio::from(f)
}

/// The one error line a binary wrote when its standard output was a full disk: it failed with
/// status 1 and said so in one line naming the failure, without a panic.
pub fn assert_ended_on_full_disk(what: &str, out: &std::process::Output) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{what}: {err}");
    assert!(
        err.contains("cannot write to standard output") && err.contains("No space left"),
        "{what}: {err}"
    );
    assert!(!err.contains("panicked"), "{what}: {err}");
}

/// A fresh, empty scratch directory named after `name`, removed with everything in it when
/// dropped.
pub fn scratch(name: &str) -> TempDir {
    tempfile::Builder::new()
        .prefix(&format!("ddl-{name}-"))
        .tempdir()
        .expect("a scratch directory in the temporary directory")
}

/// A fresh scratch directory named after `name` that lasts until this process exits: for a
/// fixture a test binary makes once and shares between its tests. A [`TempDir`] kept in a
/// `static` is never dropped, so it would be left behind; this one is removed at exit (not
/// after a crash).
pub fn scratch_until_exit(name: &str) -> PathBuf {
    static DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    static AT_EXIT: Once = Once::new();
    extern "C" fn remove_dirs() {
        let dirs = std::mem::take(&mut *DIRS.lock().unwrap_or_else(|e| e.into_inner()));
        for dir in dirs {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    // SAFETY: atexit(3) registers a function that takes and returns nothing, once.
    AT_EXIT.call_once(|| assert_eq!(unsafe { libc::atexit(remove_dirs) }, 0, "atexit(3)"));
    let dir = scratch(name).keep();
    DIRS.lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(dir.clone());
    dir
}

/// [`scratch`] inside `parent`, e.g. `env!("CARGO_TARGET_TMPDIR")` for files that must live on
/// a disk rather than a tmpfs (page-cache eviction tests).
pub fn scratch_in(parent: &Path, name: &str) -> TempDir {
    tempfile::Builder::new()
        .prefix(&format!("ddl-{name}-"))
        .tempdir_in(parent)
        .expect("a scratch directory")
}

/// Encodes `w` x `h` RGB pixels as a baseline JPEG of `quality` with chroma `subsamp`.
pub fn encode_jpeg(rgb: &[u8], w: usize, h: usize, quality: i32, subsamp: Subsamp) -> Vec<u8> {
    let image = turbojpeg::Image {
        pixels: rgb,
        width: w,
        pitch: w * 3,
        height: h,
        format: turbojpeg::PixelFormat::RGB,
    };
    turbojpeg::compress(image, quality, subsamp)
        .expect("libjpeg-turbo encodes RGB")
        .to_vec()
}

/// A real `w` x `h` JPEG (4:2:0, quality 85) whose pixels depend on `seed`: gradients and an
/// xor pattern, so that decoders and resizers have edges and colour to work on.
pub fn jpeg(w: usize, h: usize, seed: usize) -> Vec<u8> {
    let mut rgb = vec![0u8; w * h * 3];
    for y in 0..h {
        for x in 0..w {
            let i = (y * w + x) * 3;
            rgb[i] = ((x * 7 + seed * 31) % 256) as u8;
            rgb[i + 1] = ((y * 5 + seed * 17) % 256) as u8;
            rgb[i + 2] = (((x ^ y) + seed) % 256) as u8;
        }
    }
    encode_jpeg(&rgb, w, h, 85, Subsamp::Sub2x2)
}

/// One record to write into a test shard.
#[derive(Clone, Debug)]
pub struct Record {
    /// The record's bytes (normally a JPEG).
    pub bytes: Vec<u8>,
    /// Class label.
    pub label: u32,
    /// Height and width stored in the index row.
    pub size: (u16, u16),
}

impl Record {
    /// A JPEG record: its size is read from the JPEG's header.
    pub fn jpeg(bytes: Vec<u8>, label: u32) -> Record {
        let header = turbojpeg::read_header(&bytes).expect("a JPEG header");
        Record {
            size: (header.height as u16, header.width as u16),
            bytes,
            label,
        }
    }
}

/// Writes one shard file `{split}-{index:05}.ddl` per element of `shards` into `dir`, shard
/// `s` owned by node `s % nodes`, and returns the split's entry for the manifest.
pub fn write_shards(dir: &Path, split: &str, shards: &[Vec<Record>], nodes: usize) -> SplitInfo {
    let infos: Vec<ShardInfo> = shards
        .iter()
        .enumerate()
        .map(|(s, records)| {
            let file = format!("{split}-{s:05}.ddl");
            let mut w = ShardWriter::create(&dir.join(&file)).expect("create a test shard");
            for r in records {
                w.push(&r.bytes, r.label, r.size.0, r.size.1)
                    .expect("append a test record");
            }
            let sum = w.finish().expect("finish a test shard");
            ShardInfo {
                file,
                records: sum.records,
                bytes: sum.bytes,
                crc32c: sum.crc32c,
                node: s % nodes,
            }
        })
        .collect();
    SplitInfo {
        records: infos.iter().map(|i| i.records).sum(),
        shards: infos,
    }
}

/// Writes `dir/manifest.json` for `classes` classes (wnids `n00000000`, `n00000001`, ...),
/// the given splits and `nodes` nodes.
pub fn write_manifest(dir: &Path, classes: usize, splits: Vec<(&str, SplitInfo)>, nodes: usize) {
    let manifest = Manifest {
        format_version: 1,
        classes: (0..classes)
            .map(|c| ClassInfo {
                wnid: format!("n{c:08}"),
                label: c as u32,
            })
            .collect(),
        splits: splits
            .into_iter()
            .map(|(name, split)| (name.to_string(), split))
            .collect::<BTreeMap<_, _>>(),
        pack: serde_json::json!({"generator": "ddl-testkit"}),
        nodes,
    };
    manifest.save(dir).expect("write the test manifest");
}

/// A `ddl-train --dump-weights` file: raw little-endian f32 and its `.json` index, as (name,
/// values) in index order.
pub fn read_dump(path: &Path) -> Vec<(String, Vec<f32>)> {
    let raw: Vec<f32> = std::fs::read(path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let index = format!("{}.json", path.display());
    let index: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&index).unwrap_or_else(|e| panic!("reading {index}: {e}")),
    )
    .expect("a JSON index");
    let tensors = index["tensors"].as_array().expect("a tensor list");
    tensors
        .iter()
        .enumerate()
        .map(|(k, t)| {
            let start = t["offset"].as_u64().expect("an offset") as usize;
            let end = tensors.get(k + 1).map_or(raw.len(), |n| {
                n["offset"].as_u64().expect("an offset") as usize
            });
            let name = t["name"].as_str().expect("a name").to_string();
            (name, raw[start..end].to_vec())
        })
        .collect()
}

/// The largest difference between the weights `a` and `b` (same names and sizes) relative to
/// the largest weight of `b`: over all of them, and over those whose names start with
/// `prefix`.
pub fn relative_difference(
    a: &[(String, Vec<f32>)],
    b: &[(String, Vec<f32>)],
    prefix: &str,
) -> (f32, f32) {
    assert_eq!(a.len(), b.len(), "different tensor counts");
    let (mut d, mut s, mut pd, mut ps) = (0f32, 0f32, 0f32, 0f32);
    for ((na, va), (nb, vb)) in a.iter().zip(b) {
        assert_eq!((na, va.len()), (nb, vb.len()), "different tensors");
        let diff = va
            .iter()
            .zip(vb)
            .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        let scale = vb.iter().fold(0f32, |m, x| m.max(x.abs()));
        (d, s) = (d.max(diff), s.max(scale));
        if na.starts_with(prefix) {
            (pd, ps) = (pd.max(diff), ps.max(scale));
        }
    }
    (d / s, pd / ps)
}

/// An uncompressed tar of `(name, bytes)` regular files, in order.
pub fn tar_of(entries: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, data.as_slice()).unwrap();
    }
    b.into_inner().unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_and_manifest_read_back() {
        let dir = scratch("testkit");
        let records: Vec<Record> = (0..5)
            .map(|i| Record::jpeg(jpeg(40 + i, 30, i), i as u32 % 2))
            .collect();
        let split = write_shards(
            dir.path(),
            "train",
            &[records[..3].to_vec(), records[3..].to_vec()],
            2,
        );
        assert_eq!(split.records, 5);
        assert_eq!(split.shards[1].node, 1);
        write_manifest(dir.path(), 2, vec![("train", split)], 2);
        let m = Manifest::load(dir.path()).unwrap();
        assert_eq!(m.num_classes(), 2);
        let r = ddl_loader::shard::ShardReader::open(&dir.path().join("train-00000.ddl")).unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!(r.record(2).unwrap().bytes, &records[2].bytes[..]);
        assert_eq!(records[1].size, (30, 41));
    }

    /// Set in the copy of this test binary that `scratch_until_exit_is_removed_at_exit` runs.
    const CHILD: &str = "DDL_TESTKIT_SCRATCH_CHILD";

    #[test]
    fn scratch_until_exit_is_removed_at_exit() {
        if std::env::var_os(CHILD).is_some() {
            // The child: two fixtures with a file each, named on stdout, then a normal exit.
            for name in ["until-exit-a", "until-exit-b"] {
                let dir = scratch_until_exit(name);
                std::fs::write(dir.join("fixture"), b"kept until exit").unwrap();
                println!("fixture-dir {}", dir.display());
            }
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "tests::scratch_until_exit_is_removed_at_exit"])
            .args(["--nocapture", "--test-threads", "1"])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{said}");
        // libtest's own "test ... " may begin the first line.
        let dirs: Vec<&str> = said
            .split("fixture-dir ")
            .skip(1)
            .filter_map(|rest| rest.lines().next())
            .collect();
        assert_eq!(dirs.len(), 2, "{said}");
        for dir in dirs {
            assert!(!Path::new(dir).exists(), "{dir} outlived its process");
        }
    }
}
