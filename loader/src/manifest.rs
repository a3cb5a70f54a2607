//! `manifest.json`: the classes, the splits with their shards (record counts, sizes, whole-file
//! checksums, node assignment) and the parameters a dataset was packed with.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{LoaderError, Result};
use crate::format::VERSION;
use crate::shard::{sync_dir, tmp_path};

/// File name of the manifest inside a packed dataset directory.
pub const MANIFEST_FILE: &str = "manifest.json";

/// The description of a packed dataset directory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Shard format version of every shard listed (1).
    pub format_version: u32,
    /// Classes in label order: `classes[i].label == i`.
    pub classes: Vec<ClassInfo>,
    /// Splits by name ("train", "val").
    pub splits: BTreeMap<String, SplitInfo>,
    /// The parameters the packer ran with (free-form JSON object).
    pub pack: serde_json::Value,
    /// Number of nodes the shards were assigned to at pack time (`ShardInfo::node`).
    pub nodes: usize,
}

/// One class: its WordNet id and its label.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassInfo {
    /// WordNet id, e.g. "n01440764".
    pub wnid: String,
    /// The label stored in the shards' index rows.
    pub label: u32,
}

/// One split: its total record count and its shards in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitInfo {
    /// Total records over all shards of the split.
    pub records: u64,
    /// Shards in order: shard `s` is `shards[s]`.
    pub shards: Vec<ShardInfo>,
}

/// One shard of a split.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardInfo {
    /// File name relative to the manifest's directory, e.g. "train-00000.ddl".
    pub file: String,
    /// Number of records.
    pub records: u64,
    /// File size in bytes.
    pub bytes: u64,
    /// crc32c of the whole file.
    pub crc32c: u32,
    /// The node that holds it for the manifest's `nodes`: shard index modulo `nodes`.
    pub node: usize,
}

impl Manifest {
    /// Reads and checks `dir/manifest.json`.
    pub fn load(dir: &Path) -> Result<Manifest> {
        let path = dir.join(MANIFEST_FILE);
        let text = std::fs::read(&path).map_err(|e| LoaderError::io("read", &path, e))?;
        let m: Manifest = serde_json::from_slice(&text).map_err(|source| LoaderError::Json {
            path: path.clone(),
            source,
        })?;
        m.validate(&path)?;
        Ok(m)
    }

    /// Writes `dir/manifest.json` atomically (temporary file, fsync, rename, directory fsync).
    pub fn save(&self, dir: &Path) -> Result<()> {
        let path = dir.join(MANIFEST_FILE);
        self.validate(&path)?;
        let mut text = serde_json::to_vec_pretty(self).map_err(|source| LoaderError::Json {
            path: path.clone(),
            source,
        })?;
        text.push(b'\n');
        write_atomic(&path, &text)
    }

    /// Number of classes.
    pub fn num_classes(&self) -> usize {
        self.classes.len()
    }

    /// The split named `name`, or an error naming the manifest and the splits it has.
    pub fn split(&self, dir: &Path, name: &str) -> Result<&SplitInfo> {
        self.splits.get(name).ok_or_else(|| LoaderError::Manifest {
            path: dir.join(MANIFEST_FILE),
            reason: format!(
                "no split {name:?} (splits: {})",
                self.splits.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        })
    }

    /// crc32c of the classes and of split `name`'s shards (names, record counts, sizes,
    /// checksums): what a checkpoint or a loader's state must match to continue on this data.
    pub fn fingerprint(&self, name: &str) -> u32 {
        let bytes = serde_json::to_vec(&(&self.classes, self.splits.get(name))).unwrap_or_default();
        crc32c::crc32c(&bytes)
    }

    /// Checks internal consistency; `path` names the manifest in errors.
    pub fn validate(&self, path: &Path) -> Result<()> {
        let bad = |reason: String| LoaderError::Manifest {
            path: path.to_path_buf(),
            reason,
        };
        if self.format_version != VERSION {
            return Err(bad(format!(
                "format_version {} is not supported (this build reads {VERSION})",
                self.format_version
            )));
        }
        if self.nodes == 0 {
            return Err(bad("nodes must be at least 1".into()));
        }
        for (i, c) in self.classes.iter().enumerate() {
            if c.label as usize != i {
                return Err(bad(format!(
                    "class {i} ({}) has label {}, expected {i}",
                    c.wnid, c.label
                )));
            }
        }
        for (name, split) in &self.splits {
            // Checked: a plain sum of hostile counts panics (overflow checks) or wraps around to
            // a total that matches `records`.
            let sum = split
                .shards
                .iter()
                .try_fold(0u64, |acc, s| acc.checked_add(s.records))
                .ok_or_else(|| {
                    bad(format!(
                        "split {name}: the shards' record counts overflow a u64"
                    ))
                })?;
            if sum != split.records {
                return Err(bad(format!(
                    "split {name}: records is {} but its shards hold {sum}",
                    split.records
                )));
            }
            for (s, sh) in split.shards.iter().enumerate() {
                if sh.file.is_empty() || sh.file.contains('/') || sh.file.contains("..") {
                    return Err(bad(format!(
                        "split {name} shard {s}: file name {:?} must be a plain file name",
                        sh.file
                    )));
                }
                if sh.node != s % self.nodes {
                    return Err(bad(format!(
                        "split {name} shard {s} ({}): node {} but shard {s} mod nodes {} is {}",
                        sh.file,
                        sh.node,
                        self.nodes,
                        s % self.nodes
                    )));
                }
            }
        }
        Ok(())
    }
}

/// Writes `bytes` to `path` crash-safely: `path.tmp`, fsync, rename, directory fsync.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp: PathBuf = tmp_path(path);
    let mut f = std::fs::File::create(&tmp).map_err(|e| LoaderError::io("create", &tmp, e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| LoaderError::io("write", &tmp, e))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(|e| LoaderError::io("rename", &tmp, e))?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        let shards = (0..3)
            .map(|s| ShardInfo {
                file: format!("train-{s:05}.ddl"),
                records: 10 + s as u64,
                bytes: 4096 + s as u64,
                crc32c: 7 * s as u32,
                node: s % 2,
            })
            .collect();
        Manifest {
            format_version: 1,
            classes: vec![
                ClassInfo {
                    wnid: "n01".into(),
                    label: 0,
                },
                ClassInfo {
                    wnid: "n02".into(),
                    label: 1,
                },
            ],
            splits: [(
                "train".to_string(),
                SplitInfo {
                    records: 33,
                    shards,
                },
            )]
            .into_iter()
            .collect(),
            pack: serde_json::json!({"quality": 90}),
            nodes: 2,
        }
    }

    fn dir(name: &str) -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix(&format!("ddl-manifest-{name}-"))
            .tempdir()
            .unwrap()
    }

    #[test]
    fn roundtrip() {
        let tmp = dir("roundtrip");
        let d = tmp.path();
        let m = sample();
        m.save(d).unwrap();
        assert!(!d.join("manifest.json.tmp").exists());
        let back = Manifest::load(d).unwrap();
        assert_eq!(back, m);
        assert_eq!(back.num_classes(), 2);
        assert_eq!(back.split(d, "train").unwrap().shards.len(), 3);
        assert!(back
            .split(d, "val")
            .unwrap_err()
            .to_string()
            .contains("train"));
    }

    #[test]
    fn inconsistencies_are_rejected() {
        let p = Path::new("m/manifest.json");
        let mut m = sample();
        m.splits.get_mut("train").unwrap().records = 1;
        assert!(m
            .validate(p)
            .unwrap_err()
            .to_string()
            .contains("shards hold 33"));
        let mut m = sample();
        m.classes[1].label = 5;
        assert!(m.validate(p).is_err());
        let mut m = sample();
        m.splits.get_mut("train").unwrap().shards[1].node = 0;
        assert!(m
            .validate(p)
            .unwrap_err()
            .to_string()
            .contains("train-00001.ddl"));
        let mut m = sample();
        m.format_version = 2;
        assert!(m.validate(p).is_err());
        let mut m = sample();
        m.splits.get_mut("train").unwrap().shards[0].file = "../x.ddl".into();
        assert!(m.validate(p).is_err());
    }

    #[test]
    fn bad_json_names_file() {
        let tmp = dir("badjson");
        let d = tmp.path();
        std::fs::write(d.join("manifest.json"), b"{\"format_version\": 1,").unwrap();
        let e = Manifest::load(d).unwrap_err().to_string();
        assert!(e.contains("manifest.json"), "{e}");
        let e = Manifest::load(&d.join("missing")).unwrap_err().to_string();
        assert!(e.contains("manifest.json"), "{e}");
    }
}
