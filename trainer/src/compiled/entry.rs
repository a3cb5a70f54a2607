//! One compile-cache entry: a folder holding `step.pt2` (the package), on a GPU `graph.so`
//! (its CUDA graph capture, [`super::graph`]), `step.json` (what the compile script says the
//! package reads and takes, and its check against eager) and `entry.json` (the key it was
//! compiled for and the size and crc32c of the package, of `step.json` and of the graph
//! library), written last: a folder without it is not a finished entry.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::Tensor;

use super::step::StepKey;
use crate::error::{Result, TrainError};

/// The package file of an entry.
pub const PACKAGE: &str = "step.pt2";
/// The CUDA graph library of an entry for a GPU.
pub const GRAPH_LIBRARY: &str = "graph.so";
/// The compile script's description of the package.
pub const DESCRIBED: &str = "step.json";
/// The key and checksum of the entry.
pub const ENTRY: &str = "entry.json";
/// Files an entry may hold, all written by ddl-train (the spec and the compile's output too).
pub const FILES: &[&str] = &[
    PACKAGE,
    DESCRIBED,
    ENTRY,
    GRAPH_LIBRARY,
    "spec.json",
    "step.py",
    "graph.cpp",
    "guarded.h",
    "compile.log",
];

/// A tensor the package reads or writes, as the compile script saw it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TensorSpec {
    /// ddl's name (empty for the flat gradients and the inputs).
    #[serde(default)]
    pub name: String,
    /// The package's name.
    #[serde(default)]
    pub fqn: String,
    /// Shape.
    pub shape: Vec<i64>,
    /// Strides in elements.
    pub strides: Vec<i64>,
    /// torch's name of the dtype, e.g. `torch.float32`.
    pub dtype: String,
}

impl TensorSpec {
    /// Fails, naming `what`, unless `t` has this shape, strides and dtype.
    pub fn check(&self, what: &str, t: &Tensor) -> Result<()> {
        let dtype = match t.kind() {
            tch::Kind::Float => "torch.float32",
            tch::Kind::Int64 => "torch.int64",
            tch::Kind::BFloat16 => "torch.bfloat16",
            tch::Kind::Half => "torch.float16",
            _ => "another dtype",
        };
        let (shape, strides) = (t.size(), t.stride());
        // A dimension of size 1 may have any stride.
        let strides_match = self.strides.len() == strides.len()
            && self
                .shape
                .iter()
                .zip(self.strides.iter().zip(&strides))
                .all(|(&n, (a, b))| n == 1 || a == b);
        if shape != self.shape || !strides_match || dtype != self.dtype {
            return Err(TrainError::Compile(format!(
                "{what}: the compiled step takes shape {:?}, strides {:?}, {}; ddl has shape \
                 {shape:?}, strides {strides:?}, {dtype}",
                self.shape, self.strides, self.dtype
            )));
        }
        Ok(())
    }
}

/// `step.json`: what the compile script says of the package.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Described {
    /// The torch that compiled it.
    pub torch_version: String,
    /// Every constant: the network's parameters and buffers, and the flat gradients.
    pub constants: Vec<TensorSpec>,
    /// images, labels, loss scale.
    pub inputs: Vec<TensorSpec>,
    /// Seconds the compile took.
    pub compile_seconds: f64,
    /// The packages compiled before this one and refused by the check against eager, and why.
    #[serde(default)]
    pub refused: Vec<String>,
    /// The CUDA graph library, for a GPU: compiled, or why not.
    #[serde(default)]
    pub graph_library: Option<GraphLibraryBuild>,
    /// How far the package was from eager PyTorch in the compile's check.
    #[serde(default)]
    pub check: Option<Check>,
}

/// The figures of the check of a package against the eager step of the same weights.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Check {
    /// The whole gradient's distance from eager's, relative.
    pub grad_rel: f64,
    /// The loss's distance from eager's, relative.
    pub loss_rel: f64,
}

/// What became of the CUDA graph library's compile.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GraphLibraryBuild {
    /// The library's file in the entry, when it was compiled.
    #[serde(default)]
    pub file: Option<String>,
    /// Why it was not.
    #[serde(default)]
    pub error: Option<String>,
}

/// The size and crc32c of one file of an entry.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
struct Sum {
    bytes: u64,
    crc32c: u32,
}

/// `entry.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct EntryFile {
    key: StepKey,
    package: Sum,
    /// step.json.
    described: Sum,
    /// graph.so, in an entry for a GPU whose compile made one.
    #[serde(default)]
    graph_library: Option<Sum>,
}

/// A finished entry, checked.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Its folder.
    pub dir: PathBuf,
    /// Its description.
    pub described: Described,
}

impl Entry {
    /// The package file.
    pub fn package(&self) -> PathBuf {
        self.dir.join(PACKAGE)
    }

    /// The CUDA graph library of the package, or why there is none.
    pub fn graph_library(&self) -> std::result::Result<PathBuf, String> {
        match &self.described.graph_library {
            Some(GraphLibraryBuild {
                file: Some(file), ..
            }) => Ok(self.dir.join(file)),
            Some(GraphLibraryBuild {
                error: Some(why), ..
            }) => Err(why.clone()),
            _ => Err("the step was not compiled for a GPU".into()),
        }
    }
}

/// Why an existing entry cannot be used.
pub enum Unusable {
    /// Nothing there.
    Missing,
    /// There, but stale (another key or torch), foreign or damaged: why.
    Bad(String),
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> std::result::Result<T, String> {
    let text = fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The size and crc32c of `path`, read in pieces.
fn checksum(path: &Path) -> std::io::Result<Sum> {
    use std::io::Read;
    let mut f = fs::File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut sum = Sum {
        bytes: 0,
        crc32c: 0,
    };
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(sum);
        }
        sum.crc32c = crc32c::crc32c_append(sum.crc32c, &buf[..n]);
        sum.bytes += n as u64;
    }
}

/// Fails unless `path` is whole: its size and crc32c are `sealed`'s.
fn verify(path: &Path, sealed: Sum) -> std::result::Result<(), Unusable> {
    match checksum(path) {
        Ok(sum) if sum == sealed => Ok(()),
        Ok(sum) => Err(Unusable::Bad(format!(
            "{} is damaged ({} bytes, crc32c differs from the {} bytes compiled)",
            path.display(),
            sum.bytes,
            sealed.bytes
        ))),
        Err(e) => Err(Unusable::Bad(format!("{}: {e}", path.display()))),
    }
}

/// The entry in `dir` if it is a finished one for `key`, whole.
pub fn open(dir: &Path, key: &StepKey) -> std::result::Result<Entry, Unusable> {
    let entry_file = dir.join(ENTRY);
    if !dir.exists() {
        return Err(Unusable::Missing);
    }
    let entry: EntryFile = read_json(&entry_file).map_err(Unusable::Bad)?;
    if &entry.key != key {
        return Err(Unusable::Bad(format!(
            "it was compiled for another step ({})",
            key.differences(&entry.key).join(", ")
        )));
    }
    verify(&dir.join(PACKAGE), entry.package)?;
    verify(&dir.join(DESCRIBED), entry.described)?;
    if let Some(sealed) = entry.graph_library {
        verify(&dir.join(GRAPH_LIBRARY), sealed)?;
    }
    let described: Described = read_json(&dir.join(DESCRIBED)).map_err(Unusable::Bad)?;
    Ok(Entry {
        dir: dir.to_path_buf(),
        described,
    })
}

/// Finishes the entry compiled into `dir` for `key`: checks the script's description (the
/// package passed its check against eager) and writes `entry.json` with the checksums of the
/// package, the description and the graph library.
pub fn seal(dir: &Path, key: &StepKey) -> Result<Entry> {
    let bad = |m: String| TrainError::Compile(format!("the compile wrote no usable entry: {m}"));
    let described: Described = read_json(&dir.join(DESCRIBED)).map_err(bad)?;
    if described.check.is_none() {
        return Err(bad(format!(
            "{} records no check of the package against eager PyTorch",
            dir.join(DESCRIBED).display()
        )));
    }
    let sum = |path: PathBuf| checksum(&path).map_err(|e| TrainError::io(&path, e));
    let graph = dir.join(GRAPH_LIBRARY);
    let entry = EntryFile {
        key: key.clone(),
        package: sum(dir.join(PACKAGE))?,
        described: sum(dir.join(DESCRIBED))?,
        graph_library: graph.exists().then(|| sum(graph)).transpose()?,
    };
    let path = dir.join(ENTRY);
    let text = serde_json::to_vec_pretty(&entry).expect("an entry serializes");
    fs::write(&path, text).map_err(|e| TrainError::io(&path, e))?;
    Ok(Entry {
        dir: dir.to_path_buf(),
        described,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(model: &str) -> StepKey {
        StepKey {
            model: model.into(),
            classes: 3,
            batch: 2,
            image_size: 16,
            model_image_size: 16,
            precision: "fp32".into(),
            channels_last: false,
            label_smoothing: 0.0,
            device: "cpu".into(),
            torch: "2.11.0".into(),
            layout: 1,
            script: 2,
            inductor_options: vec![],
        }
    }

    /// Why `open` refuses `dir` for `key`.
    fn refused(dir: &Path, key: &StepKey) -> String {
        match open(dir, key) {
            Err(Unusable::Bad(why)) => why,
            Err(Unusable::Missing) => panic!("{} is missing", dir.display()),
            Ok(_) => panic!("{} was opened", dir.display()),
        }
    }

    /// The checks the cache compiles again on, each alone (the rebuild itself: the trainer's
    /// compiled tests): an entry sealed around a few bytes that stand in for a package opens
    /// for its own key only, and only while those bytes are whole, and so does the graph
    /// library sealed with it.
    #[test]
    fn open_refuses_another_step_and_a_damaged_package() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("entry");
        assert!(matches!(
            open(&dir, &key("convnet_nobn")),
            Err(Unusable::Missing)
        ));
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join(PACKAGE), b"a package").unwrap();
        let described = r#"{"torch_version": "2.11.0", "constants": [], "inputs": [],
                            "compile_seconds": 1.0,
                            "check": {"grad_rel": 1e-6, "loss_rel": 1e-7}}"#;
        fs::write(dir.join(DESCRIBED), described).unwrap();
        seal(&dir, &key("convnet_nobn")).unwrap();
        assert!(open(&dir, &key("convnet_nobn")).is_ok());

        let other = refused(&dir, &key("resnet50"));
        assert!(
            other.contains(r#"another step (model "convnet_nobn" instead of "resnet50")"#),
            "{other}"
        );
        fs::write(dir.join(PACKAGE), b"a packagE").unwrap();
        let damaged = refused(&dir, &key("convnet_nobn"));
        assert!(damaged.contains("step.pt2 is damaged"), "{damaged}");
        fs::write(dir.join(PACKAGE), b"a package").unwrap();
        fs::write(dir.join(GRAPH_LIBRARY), b"a library").unwrap();
        seal(&dir, &key("convnet_nobn")).unwrap();
        assert!(open(&dir, &key("convnet_nobn")).is_ok());
        fs::write(dir.join(GRAPH_LIBRARY), b"a librarY").unwrap();
        let damaged = refused(&dir, &key("convnet_nobn"));
        assert!(damaged.contains("graph.so is damaged"), "{damaged}");
        // An edit of the description (a stride, a dtype) is damage too.
        fs::write(dir.join(GRAPH_LIBRARY), b"a library").unwrap();
        seal(&dir, &key("convnet_nobn")).unwrap();
        fs::write(dir.join(DESCRIBED), described.replace("1.0", "2.0")).unwrap();
        let edited = refused(&dir, &key("convnet_nobn"));
        assert!(edited.contains("step.json is damaged"), "{edited}");
        // A description without its check against eager is never sealed.
        let unchecked = r#"{"torch_version": "2.11.0", "constants": [], "inputs": [],
                           "compile_seconds": 1.0}"#;
        fs::write(dir.join(DESCRIBED), unchecked).unwrap();
        let err = seal(&dir, &key("convnet_nobn")).unwrap_err().to_string();
        assert!(err.contains("no check of the package"), "{err}");
        fs::write(dir.join(ENTRY), "{}").unwrap();
        let unreadable = refused(&dir, &key("convnet_nobn"));
        assert!(unreadable.contains(ENTRY), "{unreadable}");
    }
}
