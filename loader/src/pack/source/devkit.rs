//! ImageNet's devkit (`ILSVRC2012_devkit_t12.tar.gz` as downloaded, or its extracted folder):
//! the validation ground truth, `data/ILSVRC2012_validation_ground_truth.txt`, whose line N
//! holds the ILSVRC2012_ID of validation image N, and `data/meta.mat`, whose `synsets` struct
//! array maps each ILSVRC2012_ID to its WNID. The ids are in ILSVRC order, not sorted by wnid,
//! and `synsets` also lists the non-leaf synsets of the hierarchy (`num_children` > 0): only
//! the leaves are classes. Without `meta.mat` a synset list given by the caller maps the ids
//! (line k: the wnid of id k); beside `meta.mat` such a list must agree with it.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use super::inputs::SourceOptions;
use super::listing::{input_err, list_dir};
use super::scan::read_wnid_list;
use crate::error::{LoaderError, Result};

/// The ground truth's file name.
pub(super) const GROUND_TRUTH: &str = "ILSVRC2012_validation_ground_truth.txt";
/// The synset table's file name.
const META: &str = "meta.mat";

/// The devkit's validation labels, each line's wnid.
pub(super) struct GroundTruth {
    /// The ground truth file, as messages name it.
    pub file: String,
    /// What maps its ids to wnids (meta.mat or the synset list), as messages name it.
    pub mapping: String,
    /// The wnid of each line, in line order (line N labels image N).
    pub wnids: Vec<String>,
}

/// One synset of `meta.mat`.
struct Synset {
    wnid: String,
    children: u64,
}

/// A devkit's two files: where they are (for messages) and their bytes.
struct DevkitFiles {
    ground_truth: (String, Vec<u8>),
    meta: Option<(String, Vec<u8>)>,
}

/// Whether a file or folder name looks like a devkit (`ILSVRC2012_devkit_t12.tar.gz`).
pub(super) fn is_devkit_name(name: &str) -> bool {
    name.to_ascii_lowercase().contains("devkit")
}

/// Reads the devkit files inside the archive `path` (a `.tar.gz`, `.tgz` or `.tar`), if it
/// holds a ground truth.
fn from_archive(path: &Path) -> Result<Option<DevkitFiles>> {
    let file = std::fs::File::open(path).map_err(|e| LoaderError::io("open", path, e))?;
    let name = path.to_string_lossy();
    let reader: Box<dyn Read> = if name.ends_with(".gz") || name.ends_with(".tgz") {
        Box::new(flate2::read::GzDecoder::new(file))
    } else {
        Box::new(file)
    };
    let bad = |e: std::io::Error| input_err(path, format!("unreadable devkit archive: {e}"));
    let mut archive = tar::Archive::new(reader);
    let (mut gt, mut meta) = (None, None);
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        let member = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let slot = if member.ends_with(&format!("data/{GROUND_TRUTH}")) {
            &mut gt
        } else if member.ends_with(&format!("data/{META}")) {
            &mut meta
        } else {
            continue;
        };
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).map_err(bad)?;
        *slot = Some((format!("{}:{member}", path.display()), bytes));
    }
    Ok(gt.map(|ground_truth| DevkitFiles { ground_truth, meta }))
}

/// Reads the devkit files of the extracted folder whose `data/` is `data`, if it holds a
/// ground truth.
fn from_folder(data: &Path) -> Result<Option<DevkitFiles>> {
    let read = |name: &str| -> Result<Option<(String, Vec<u8>)>> {
        let p = data.join(name);
        if !p.is_file() {
            return Ok(None);
        }
        let bytes = std::fs::read(&p).map_err(|e| LoaderError::io("read", &p, e))?;
        Ok(Some((p.display().to_string(), bytes)))
    };
    let Some(ground_truth) = read(GROUND_TRUTH)? else {
        return Ok(None);
    };
    Ok(Some(DevkitFiles {
        ground_truth,
        meta: read(META)?,
    }))
}

/// The devkits among the entries of `root` (archives and extracted folders whose names say
/// devkit, holding a ground truth), by path.
fn devkits_in(root: &Path) -> Result<Vec<(PathBuf, DevkitFiles)>> {
    let mut out = Vec::new();
    for e in list_dir(root)? {
        if !is_devkit_name(&e.name) {
            continue;
        }
        let path = root.join(&e.name);
        let files = if e.is_dir() {
            from_folder(&path.join("data"))?
        } else if [".tar.gz", ".tgz", ".tar"]
            .iter()
            .any(|x| e.name.ends_with(x))
        {
            from_archive(&path)?
        } else {
            None
        };
        if let Some(f) = files {
            out.push((path, f));
        }
    }
    Ok(out)
}

/// Finds the validation ground truth for the flat validation images of `input`: a devkit
/// archive or folder in `input` (exactly one may hold a ground truth), or else a loose
/// `ILSVRC2012_validation_ground_truth.txt` in one of `places` (with `meta.mat` beside it, or
/// the caller's synset list). `None` when there is none.
pub(super) fn find(
    input: &Path,
    places: &[PathBuf],
    opts: &SourceOptions,
) -> Result<Option<GroundTruth>> {
    let mut found = devkits_in(input)?;
    if found.len() > 1 {
        let names: Vec<String> = found.iter().map(|(p, _)| p.display().to_string()).collect();
        return Err(input_err(
            input,
            format!(
                "holds {} devkits with a validation ground truth ({}): keep the one that \
                 belongs to these images",
                names.len(),
                names.join(", ")
            ),
        ));
    }
    let files = match found.pop() {
        Some((_, f)) => f,
        None => {
            let Some(data) = places.iter().find(|d| d.join(GROUND_TRUTH).is_file()) else {
                return Ok(None);
            };
            from_folder(data)?.expect("the ground truth is there")
        }
    };
    read(files, opts).map(Some)
}

/// Maps the ground truth's ids to wnids through `meta.mat`, the synset list, or both (which
/// must then agree).
fn read(files: DevkitFiles, opts: &SourceOptions) -> Result<GroundTruth> {
    let (gt_name, gt_bytes) = files.ground_truth;
    let listed = match &opts.synsets {
        Some(p) => Some((p.display().to_string(), read_wnid_list(p)?)),
        None => None,
    };
    let (mapping, synsets) = match (files.meta, listed) {
        (Some((meta_name, bytes)), listed) => {
            let synsets = parse_meta(&bytes).map_err(|e| input_err(Path::new(&meta_name), e))?;
            if let Some((list_name, list)) = listed {
                agree(&list_name, &list, &meta_name, &synsets)?;
            }
            (meta_name, synsets)
        }
        (None, Some((list_name, list))) => {
            let synsets = (1..)
                .zip(list)
                .map(|(id, wnid)| (id, Synset { wnid, children: 0 }))
                .collect();
            (list_name, synsets)
        }
        (None, None) => {
            return Err(LoaderError::Option {
                path: PathBuf::from(&gt_name),
                source: super::super::option_error::OptionError {
                    option: super::super::option_error::PackOption::Synsets,
                    value: None,
                    problem: "is needed: the devkit ground truth holds ILSVRC ids and no \
                              meta.mat is beside it; give ILSVRC2012_devkit_t12.tar.gz (its \
                              data/meta.mat maps them), or the ILSVRC synset list (FILE: one \
                              wnid per line in ILSVRC id order)"
                        .into(),
                },
            })
        }
    };
    let text = String::from_utf8_lossy(&gt_bytes);
    let mut wnids = Vec::new();
    for (n, line) in text.trim_end().lines().enumerate() {
        let line = line.trim();
        let at = |why: String| input_err(Path::new(&gt_name), format!("line {}: {why}", n + 1));
        if line.is_empty() {
            return Err(at(
                "is empty; every line holds the ILSVRC2012_ID of one image".into(),
            ));
        }
        let id: u64 = line
            .parse()
            .map_err(|_| at(format!("{line:?} is not an ILSVRC2012_ID")))?;
        let s = synsets
            .get(&id)
            .ok_or_else(|| at(format!("ILSVRC2012_ID {id} is not in {mapping}")))?;
        if s.children > 0 {
            return Err(at(format!(
                "ILSVRC2012_ID {id} is {}, which {mapping} lists as an inner synset with {} \
                 children, not a class",
                s.wnid, s.children
            )));
        }
        wnids.push(s.wnid.clone());
    }
    Ok(GroundTruth {
        file: gt_name,
        mapping,
        wnids,
    })
}

/// Refuses a synset list that differs from `meta.mat`'s classes (its leaves by ILSVRC id),
/// naming the first line that differs.
fn agree(
    list_name: &str,
    list: &[String],
    meta_name: &str,
    synsets: &BTreeMap<u64, Synset>,
) -> Result<()> {
    let leaves: Vec<(u64, &str)> = synsets
        .iter()
        .filter(|(_, s)| s.children == 0)
        .map(|(id, s)| (*id, s.wnid.as_str()))
        .collect();
    for k in 0..list.len().max(leaves.len()) {
        let (given, meta) = (list.get(k), leaves.get(k));
        if given.map(String::as_str) == meta.map(|m| m.1) {
            continue;
        }
        let says = match meta {
            Some((id, w)) => format!("{meta_name} gives ILSVRC2012_ID {id} = {w}"),
            None => format!("{meta_name} has only {} classes", leaves.len()),
        };
        let line = match given {
            Some(w) => format!("line {}: {w}", k + 1),
            None => format!("ends after {} lines", list.len()),
        };
        return Err(input_err(
            Path::new(list_name),
            format!(
                "{line}, but {says}: the synset list disagrees with the devkit (Kaggle's \
                 LOC_synset_mapping.txt is sorted by wnid, not in ILSVRC id order); leave \
                 --synsets out to use the devkit's"
            ),
        ));
    }
    Ok(())
}

/// The synsets of a `meta.mat` by ILSVRC2012_ID. matrw panics on some malformed files: a
/// panic is caught and reported as a damaged file.
fn parse_meta(bytes: &[u8]) -> std::result::Result<BTreeMap<u64, Synset>, String> {
    let bytes = mat5_header(bytes);
    let parsed = std::panic::catch_unwind(|| matrw::load_matfile_from_u8(&bytes).map(synsets))
        .map_err(|_| "damaged MAT-file: its synsets could not be read".to_string())?;
    parsed.map_err(|e| format!("unreadable MAT-file: {e}"))?
}

/// `bytes` with its descriptive header text starting as MATLAB writes it. The MAT-file v5
/// header text is free-form after "MATLAB 5.0 MAT-file" (scipy.io.savemat writes no comma
/// after it); matrw accepts only MATLAB's own ", " there.
fn mat5_header(bytes: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    const MATLAB: &[u8] = b"MATLAB 5.0 MAT-file, ";
    const TEXT: usize = 116;
    let plain = &MATLAB[..MATLAB.len() - 2];
    if bytes.len() < TEXT || bytes.starts_with(MATLAB) || !bytes.starts_with(plain) {
        return bytes.into();
    }
    let mut out = bytes.to_vec();
    let mut text = MATLAB.to_vec();
    text.extend_from_slice(bytes[plain.len()..TEXT].trim_ascii_start());
    text.resize(TEXT, b' ');
    out[..TEXT].copy_from_slice(&text);
    out.into()
}

/// The `synsets` struct array of a parsed `meta.mat`.
fn synsets(mat: matrw::MatFile) -> std::result::Result<BTreeMap<u64, Synset>, String> {
    let matrw::MatVariable::StructureArray(array) = &mat["synsets"] else {
        return Err("has no struct array named synsets (ImageNet devkit's meta.mat has)".into());
    };
    let mut out = BTreeMap::new();
    for (k, s) in array.value.iter().enumerate() {
        let matrw::MatVariable::Structure(s) = s else {
            return Err(format!("synsets({}) is not a struct", k + 1));
        };
        let field = |name: &str| {
            s.get(name)
                .ok_or_else(|| format!("synsets({}) has no field {name}", k + 1))
        };
        let id = number(field("ILSVRC2012_ID")?)
            .ok_or_else(|| format!("synsets({}).ILSVRC2012_ID is not a number", k + 1))?;
        let children = number(field("num_children")?)
            .ok_or_else(|| format!("synsets({}).num_children is not a number", k + 1))?;
        let wnid =
            text(field("WNID")?).ok_or_else(|| format!("synsets({}).WNID is not text", k + 1))?;
        if out.insert(id, Synset { wnid, children }).is_some() {
            return Err(format!("ILSVRC2012_ID {id} is given twice"));
        }
    }
    Ok(out)
}

/// A scalar whole number, whatever type it is stored as.
fn number(v: &matrw::MatVariable) -> Option<u64> {
    use matrw::MatlabType as T;
    let x = match v.numeric_type()? {
        T::F64(x) if x.len() == 1 => x[0],
        T::F32(x) if x.len() == 1 => x[0] as f64,
        T::U8(x) if x.len() == 1 => x[0] as f64,
        T::U16(x) if x.len() == 1 => x[0] as f64,
        T::U32(x) if x.len() == 1 => x[0] as f64,
        T::U64(x) if x.len() == 1 => x[0] as f64,
        T::I8(x) if x.len() == 1 => x[0] as f64,
        T::I16(x) if x.len() == 1 => x[0] as f64,
        T::I32(x) if x.len() == 1 => x[0] as f64,
        T::I64(x) if x.len() == 1 => x[0] as f64,
        _ => return None,
    };
    (x >= 0.0 && x.fract() == 0.0).then_some(x as u64)
}

/// A character array as a string.
fn text(v: &matrw::MatVariable) -> Option<String> {
    match v.numeric_type()? {
        matrw::MatlabType::UTF8(c) | matrw::MatlabType::UTF16(c) => Some(c.iter().collect()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scipy_headers_are_read_as_matlab_writes_them() {
        let mut scipy = b"MATLAB 5.0 MAT-file Platform: posix, Created on: x".to_vec();
        scipy.resize(128, 0);
        let fixed = mat5_header(&scipy);
        assert!(fixed.starts_with(b"MATLAB 5.0 MAT-file, Platform: posix"));
        assert_eq!(fixed.len(), 128);
        let mut matlab = b"MATLAB 5.0 MAT-file, Platform: GLNXA64".to_vec();
        matlab.resize(128, 0);
        assert_eq!(&*mat5_header(&matlab), &matlab[..]);
    }
}
