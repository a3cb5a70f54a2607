//! Checkpoint files: one file per checkpoint, written by rank 0, holding everything a resumed
//! run needs to continue bit-exactly.
//!
//! Contents: the parameters (identical on every replica of every rank; under `head_parallel`
//! the head whole, assembled from every replica's slice of it, and the split in the header),
//! the SGD momentum (identical too), the BatchNorm running statistics of *every* replica of every rank (they
//! differ, since each replica normalises its own batches), the position (epoch, step within
//! the epoch, global step), the fp16 loss-scaler state and the run's flags.
//!
//! Format (little-endian):
//!
//! ```text
//! magic  b"DDLCKPT1"                      8 bytes
//! header_len u64                          8 bytes
//! header  JSON (CheckpointMeta)           header_len bytes
//! data    f32 values of every tensor      sum of numel * 4 bytes, in header order
//! crc32c  u32 over all preceding bytes    4 bytes
//! magic  b"DDLCKEND"                      8 bytes
//! ```
//!
//! A file is written as `NAME.tmp`, fsynced, renamed to `NAME` and the directory fsynced, so
//! a crash leaves either the previous set of checkpoints or the new complete file; a write that
//! fails (disk full) removes its partial file and says how many bytes it needed. Names are
//! `ckpt-<global step, 12 digits>.ddlck`, so lexical order is step order.
//!
//! A directory belongs to one run: a new run refuses a directory holding checkpoint files
//! ([`occupants`]) unless it continues them (`resume`) or moves them aside first
//! ([`move_aside`], `restart`); nothing deletes a checkpoint another run wrote.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};

const MAGIC: &[u8; 8] = b"DDLCKPT1";
const END: &[u8; 8] = b"DDLCKEND";
const SUFFIX: &str = ".ddlck";

/// One tensor entry of the header.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorEntry {
    /// `param/<name>`, `momentum/<name>` or `buffer/<rank>/<replica>/<name>`.
    pub name: String,
    /// Shape.
    pub shape: Vec<i64>,
}

impl TensorEntry {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product::<i64>().max(0) as usize
    }
}

/// The JSON header of a checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMeta {
    /// Model name.
    pub model: String,
    /// Output classes.
    pub classes: i64,
    /// Epoch to continue in.
    pub epoch: u64,
    /// Step within `epoch` to continue at (0 = start of the epoch).
    pub step: u64,
    /// Optimizer steps taken so far over the whole run.
    pub global_step: u64,
    /// Ranks of the run that wrote it.
    pub ranks: usize,
    /// Replicas per rank of the run that wrote it.
    pub replicas: usize,
    /// fp16 loss scale.
    pub loss_scale: f64,
    /// fp16 steps since the last overflow.
    pub good_steps: u64,
    /// The run's flags (`resume` compares them, see [`crate::run_flags`]).
    pub flags: serde_json::Value,
    /// Nodes sharing the data in the run that wrote it (absent in older checkpoints).
    #[serde(default)]
    pub nodes: Option<usize>,
    /// Under `head_parallel`: the classes of each replica's slice of the head, in replica
    /// order (rank by rank); the whole head is stored, the slices one after the other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_split: Option<Vec<usize>>,
    /// Fingerprint of the training data (classes and train shards of the manifest; absent in
    /// older checkpoints).
    #[serde(default)]
    pub data_fingerprint: Option<u32>,
    /// Class names (WordNet ids) in label order, for exporting the model (absent in older
    /// checkpoints).
    #[serde(default)]
    pub class_names: Option<Vec<String>>,
    /// Validation top-1 of these weights, when the run evaluated them at this step.
    #[serde(default)]
    pub val_top1: Option<f64>,
    /// Validation top-5 of these weights, when the run evaluated them at this step.
    #[serde(default)]
    pub val_top5: Option<f64>,
    /// The `num_batches_tracked` of each BatchNorm (by prefix) in the `init_from` file the
    /// run started from (empty from scratch): an export adds the global step to it (see
    /// [`crate::weights`]).
    #[serde(default)]
    pub batches_tracked_base: BTreeMap<String, i64>,
    /// The records the epoch had served over the whole job, when written mid-epoch: a run
    /// resumed on another layout serves the others in the rest of it (see `train::elastic`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<ddl_loader::progress::EpochProgress>,
    /// In an epoch resumed on another layout: what it had served when its remainder began,
    /// from which a resume recomputes `progress` to check it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_before: Option<ddl_loader::progress::EpochProgress>,
    /// The rule that placed the records ([`ddl_loader::placement::RULE`]; absent in older
    /// checkpoints): `progress` is recomputed under it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<u32>,
    /// Tensors in data order.
    pub tensors: Vec<TensorEntry>,
}

/// A checkpoint in memory.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    /// Header.
    pub meta: CheckpointMeta,
    /// Values of each tensor of `meta.tensors`, same order.
    pub data: Vec<Vec<f32>>,
}

impl Checkpoint {
    /// Values of the tensor called `name`.
    pub fn get(&self, name: &str) -> Option<&[f32]> {
        self.meta
            .tensors
            .iter()
            .position(|t| t.name == name)
            .map(|i| self.data[i].as_slice())
    }

    /// Copies of the tensors called `names`, in order; the error names the first one missing.
    pub fn tensors(
        &self,
        names: impl IntoIterator<Item = String>,
    ) -> std::result::Result<Vec<Vec<f32>>, String> {
        names
            .into_iter()
            .map(|name| {
                self.get(&name)
                    .map(<[f32]>::to_vec)
                    .ok_or_else(|| format!("tensor {name} missing"))
            })
            .collect()
    }

    /// Serialises the checkpoint.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let header = serde_json::to_vec(&self.meta).map_err(|e| TrainError::Checkpoint {
            path: PathBuf::new(),
            message: format!("cannot encode header: {e}"),
        })?;
        let values: usize = self.data.iter().map(Vec::len).sum();
        let mut out = Vec::with_capacity(16 + header.len() + values * 4 + 12);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(header.len() as u64).to_le_bytes());
        out.extend_from_slice(&header);
        for (entry, v) in self.meta.tensors.iter().zip(&self.data) {
            if entry.numel() != v.len() {
                return Err(TrainError::Checkpoint {
                    path: PathBuf::new(),
                    message: format!(
                        "{} has {} values for shape {:?}",
                        entry.name,
                        v.len(),
                        entry.shape
                    ),
                });
            }
            for x in v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(END);
        Ok(out)
    }

    /// Parses and verifies a checkpoint; `path` only names the file in errors.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Checkpoint> {
        let bad = |m: String| TrainError::Checkpoint {
            path: path.to_path_buf(),
            message: m,
        };
        if bytes.len() < 28 || &bytes[..8] != MAGIC {
            return Err(bad("not a ddl checkpoint (bad magic or too short)".into()));
        }
        if &bytes[bytes.len() - 8..] != END {
            return Err(bad("truncated (end marker missing)".into()));
        }
        let body = &bytes[..bytes.len() - 12];
        let stored = u32::from_le_bytes(
            bytes[bytes.len() - 12..bytes.len() - 8]
                .try_into()
                .unwrap_or_default(),
        );
        let crc = crc32c::crc32c(body);
        if crc != stored {
            return Err(bad(format!(
                "checksum mismatch (stored {stored:08x}, computed {crc:08x})"
            )));
        }
        let header_len = u64::from_le_bytes(body[8..16].try_into().unwrap_or_default()) as usize;
        let header_end = 16usize.checked_add(header_len).filter(|&e| e <= body.len());
        let header_end =
            header_end.ok_or_else(|| bad(format!("header length {header_len} out of bounds")))?;
        let meta: CheckpointMeta = serde_json::from_slice(&body[16..header_end])
            .map_err(|e| bad(format!("bad header: {e}")))?;
        let mut data = Vec::with_capacity(meta.tensors.len());
        let mut pos = header_end;
        for t in &meta.tensors {
            let n = t.numel();
            let end = pos.checked_add(n * 4).filter(|&e| e <= body.len());
            let end =
                end.ok_or_else(|| bad(format!("tensor {} runs past the end of the file", t.name)))?;
            data.push(
                body[pos..end]
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            );
            pos = end;
        }
        if pos != body.len() {
            return Err(bad(format!(
                "{} unexpected bytes after the tensors",
                body.len() - pos
            )));
        }
        Ok(Checkpoint { meta, data })
    }

    /// Reads and verifies the checkpoint at `path`.
    ///
    /// # Examples
    ///
    /// A checkpoint written into its directory, read back, and refused once a bit of it
    /// flipped:
    ///
    /// ```
    /// use ddl_trainer::checkpoint::{Checkpoint, CheckpointMeta};
    ///
    /// let meta: CheckpointMeta = serde_json::from_value(serde_json::json!({
    ///     "model": "resnet_small", "classes": 2, "epoch": 1, "step": 0, "global_step": 8,
    ///     "ranks": 1, "replicas": 1, "loss_scale": 1.0, "good_steps": 8, "flags": {},
    ///     "tensors": [{"name": "param/fc.bias", "shape": [2]}],
    /// }))?;
    /// let ckpt = Checkpoint { meta, data: vec![vec![0.5, -0.5]] };
    /// let dir = ddl_testkit::scratch("checkpoint-example");
    /// let path = ckpt.write(dir.path())?;
    /// assert_eq!(Checkpoint::read(&path)?.get("param/fc.bias"), Some(&[0.5, -0.5][..]));
    ///
    /// let mut bytes = std::fs::read(&path)?;
    /// let last_value = bytes.len() - 13;
    /// bytes[last_value] ^= 1;
    /// std::fs::write(&path, bytes)?;
    /// let err = Checkpoint::read(&path).unwrap_err().to_string();
    /// assert!(err.contains("ckpt-000000000008"), "{err}");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn read(path: &Path) -> Result<Checkpoint> {
        let mut bytes = Vec::new();
        File::open(path)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .map_err(|e| TrainError::io(path, e))?;
        Checkpoint::from_bytes(&bytes, path)
    }

    /// Writes the checkpoint atomically into `dir` and returns its path. On failure the
    /// partial file is removed and the error says how many bytes were needed and how many are
    /// free (or that they exceed the process's file-size limit).
    pub fn write(&self, dir: &Path) -> Result<PathBuf> {
        fs::create_dir_all(dir).map_err(|e| TrainError::io(dir, e))?;
        let path = dir.join(file_name(self.meta.global_step));
        let tmp = dir.join(format!("{}.tmp", file_name(self.meta.global_step)));
        let bytes = self.to_bytes()?;
        let written = File::create(&tmp).and_then(|mut f| {
            f.write_all(&bytes)?;
            f.sync_all()
        });
        if let Err(source) = written {
            // Ours, and useless half-written: never leave it to fill the disk.
            let _ = fs::remove_file(&tmp);
            if source.kind() == std::io::ErrorKind::FileTooLarge {
                return Err(TrainError::CheckpointTooLarge {
                    path,
                    needed: bytes.len() as u64,
                });
            }
            return Err(TrainError::CheckpointWrite {
                path,
                needed: bytes.len() as u64,
                available: free_bytes(dir),
                source,
            });
        }
        fs::rename(&tmp, &path).map_err(|e| TrainError::io(&path, e))?;
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| TrainError::io(dir, e))?;
        Ok(path)
    }
}

/// Bytes available to unprivileged writers on the file system holding `dir` (`statvfs`).
fn free_bytes(dir: &Path) -> Option<u64> {
    let c = CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: an all-zero statvfs is a valid value of this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a valid, writable statvfs.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

/// File name of the checkpoint taken after `global_step` steps.
pub fn file_name(global_step: u64) -> String {
    format!("ckpt-{global_step:012}{SUFFIX}")
}

/// Checkpoint files in `dir`, oldest first (by global step in the name). A missing
/// directory has none.
pub fn list(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(TrainError::io(dir, e)),
    };
    let mut out = Vec::new();
    for e in entries {
        let e = e.map_err(|err| TrainError::io(dir, err))?;
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with("ckpt-") && name.ends_with(SUFFIX) {
            out.push(e.path());
        }
    }
    out.sort();
    Ok(out)
}

/// What [`newest_valid`] found.
#[derive(Debug, Default)]
pub struct Found {
    /// The newest intact checkpoint and its path.
    pub checkpoint: Option<(PathBuf, Checkpoint)>,
    /// One line per damaged newer file that was skipped.
    pub warnings: Vec<String>,
}

/// The newest checkpoint in `dir` that reads back intact; damaged newer ones are skipped
/// with a warning.
pub fn newest_valid(dir: &Path) -> Result<Found> {
    let mut warnings = Vec::new();
    for path in list(dir)?.into_iter().rev() {
        match Checkpoint::read(&path) {
            Ok(c) => {
                return Ok(Found {
                    checkpoint: Some((path, c)),
                    warnings,
                })
            }
            Err(e) => warnings.push(format!("skipping damaged checkpoint: {e}")),
        }
    }
    Ok(Found {
        checkpoint: None,
        warnings,
    })
}

/// The global step in a checkpoint file name.
pub fn step_of(path: &Path) -> Option<u64> {
    path.file_name()?
        .to_str()?
        .strip_prefix("ckpt-")?
        .strip_suffix(SUFFIX)?
        .parse()
        .ok()
}

fn is_partial(name: &str) -> bool {
    name.starts_with("ckpt-") && name.ends_with(".ddlck.tmp")
}

/// Of the checkpoints up to global step `upto` in `dir`, deletes all but the newest `keep`,
/// and deletes stale temporary files. Checkpoints past `upto` (damaged files `resume`
/// skipped) are left alone. Only for a directory this run owns (see [`occupants`]).
pub fn prune(dir: &Path, keep: usize, upto: u64) -> Result<()> {
    // Only one writer exists (rank 0, one checkpoint at a time), so any temporary file
    // here is left over from a crash of this run.
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if is_partial(&e.file_name().to_string_lossy()) {
                fs::remove_file(e.path()).map_err(|err| TrainError::io(e.path(), err))?;
            }
        }
    }
    let files: Vec<PathBuf> = list(dir)?
        .into_iter()
        .filter(|p| step_of(p).is_some_and(|s| s <= upto))
        .collect();
    if files.len() > keep {
        for p in &files[..files.len() - keep] {
            fs::remove_file(p).map_err(|e| TrainError::io(p, e))?;
        }
    }
    Ok(())
}

/// Checkpoint files, complete or partial, directly in `dir`, sorted by name: what a new run
/// must not mix with.
pub fn occupants(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(TrainError::io(dir, e)),
    };
    let mut out = Vec::new();
    for e in entries {
        let e = e.map_err(|err| TrainError::io(dir, err))?;
        let name = e.file_name().to_string_lossy().to_string();
        if (name.starts_with("ckpt-") && name.ends_with(SUFFIX)) || is_partial(&name) {
            out.push(e.path());
        }
    }
    out.sort();
    Ok(out)
}

/// Moves every checkpoint file of `dir` ([`occupants`]) into a new subdirectory named after
/// the current UTC time, `previous-YYYYMMDDTHHMMSSZ` (`-2`, `-3`, ... appended if taken), and
/// returns it with the number of files moved. Deletes nothing.
pub fn move_aside(dir: &Path) -> Result<(PathBuf, usize)> {
    let files = occupants(dir)?;
    let t = time::OffsetDateTime::now_utc();
    let stem = format!(
        "previous-{:04}{:02}{:02}T{:02}{:02}{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    );
    let mut n = 1;
    let aside = loop {
        let candidate = if n == 1 {
            dir.join(&stem)
        } else {
            dir.join(format!("{stem}-{n}"))
        };
        match fs::create_dir(&candidate) {
            Ok(()) => break candidate,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => n += 1,
            Err(e) => return Err(TrainError::io(&candidate, e)),
        }
    };
    for f in &files {
        let to = aside.join(f.file_name().unwrap_or_default());
        fs::rename(f, &to).map_err(|e| TrainError::io(f, e))?;
    }
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| TrainError::io(dir, e))?;
    Ok((aside, files.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(step: u64) -> Checkpoint {
        Checkpoint {
            meta: CheckpointMeta {
                model: "convnet_nobn".into(),
                classes: 3,
                epoch: 1,
                step: 2,
                global_step: step,
                ranks: 1,
                replicas: 1,
                loss_scale: 1.0,
                good_steps: 0,
                flags: serde_json::json!({"seed": 0}),
                nodes: Some(1),
                head_split: None,
                data_fingerprint: None,
                class_names: Some(vec!["a".into(), "b".into(), "c".into()]),
                val_top1: None,
                val_top5: None,
                batches_tracked_base: BTreeMap::new(),
                progress: None,
                progress_before: None,
                placement: None,
                tensors: vec![
                    TensorEntry {
                        name: "param/a".into(),
                        shape: vec![2, 2],
                    },
                    TensorEntry {
                        name: "momentum/a".into(),
                        shape: vec![4],
                    },
                ],
            },
            data: vec![vec![1.0, -0.0, f32::MIN_POSITIVE, 3.5], vec![0.25; 4]],
        }
    }

    #[test]
    fn roundtrip_and_damage() {
        let dir = std::env::temp_dir().join(format!("ddl-ckpt-unit-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let a = sample(5);
        let b = sample(10);
        a.write(&dir).unwrap();
        let pb = b.write(&dir).unwrap();
        let back = Checkpoint::read(&pb).unwrap();
        assert_eq!(back, b);
        assert_eq!(back.data[0][1].to_bits(), (-0.0f32).to_bits());
        // Damage the newest: resume falls back to the older one with a warning.
        let mut bytes = fs::read(&pb).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x40;
        fs::write(&pb, &bytes).unwrap();
        let Found {
            checkpoint: found,
            warnings,
        } = newest_valid(&dir).unwrap();
        let (path, c) = found.unwrap();
        assert_eq!(c.meta.global_step, 5);
        assert!(path.ends_with(file_name(5)));
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("checksum"), "{}", warnings[0]);
        // Truncation is detected too.
        fs::write(&pb, &bytes[..bytes.len() - 3]).unwrap();
        assert!(Checkpoint::read(&pb).is_err());
        let stale = dir.join(format!("{}.tmp", file_name(11)));
        fs::write(&stale, b"partial").unwrap();
        prune(&dir, 1, 10).unwrap();
        assert_eq!(list(&dir).unwrap(), vec![pb.clone()]);
        assert!(!stale.exists());
        // A checkpoint past the step being written is not pruned.
        let later = sample(20).write(&dir).unwrap();
        prune(&dir, 1, 10).unwrap();
        assert_eq!(list(&dir).unwrap(), vec![pb, later]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn move_aside_keeps_every_file() {
        let dir = std::env::temp_dir().join(format!("ddl-ckpt-aside-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        sample(3).write(&dir).unwrap();
        sample(4).write(&dir).unwrap();
        fs::write(dir.join(format!("{}.tmp", file_name(5))), b"partial").unwrap();
        fs::write(dir.join("notes.txt"), b"mine").unwrap();
        assert_eq!(occupants(&dir).unwrap().len(), 3);
        let (aside, n) = move_aside(&dir).unwrap();
        assert_eq!(n, 3);
        assert!(occupants(&dir).unwrap().is_empty());
        assert_eq!(occupants(&aside).unwrap().len(), 3);
        assert!(dir.join("notes.txt").exists(), "other files stay");
        let (again, m) = move_aside(&dir).unwrap();
        assert_eq!(m, 0);
        assert_ne!(again, aside);
        assert_eq!(step_of(&dir.join(file_name(42))), Some(42));
        fs::remove_dir_all(&dir).unwrap();
    }
}
