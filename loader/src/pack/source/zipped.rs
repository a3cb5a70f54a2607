//! Zip archives read in place, as Kaggle ships ImageNet:
//! `imagenet-object-localization-challenge.zip` holds `ILSVRC/Data/CLS-LOC/train/<wnid>/*.JPEG`,
//! a flat `ILSVRC/Data/CLS-LOC/val/` labelled by `LOC_val_solution.csv` beside `ILSVRC/`, and the
//! unlabelled `test/`. The zip crate reads the
//! central directory and each member's local header; a member is then read on its own with a
//! positioned read at its data offset, inflated when it is deflated, and checked against its
//! CRC-32 (a damaged member is skipped and reported like any unreadable input).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::Path;

use zip::{CompressionMethod, ZipArchive};

use super::inputs::{LabelSource, Loc};
use super::listing::{input_err, is_image_name};
use super::scan::{Found, Scan, SplitFound};
use super::val::{csv_labels, label_flat};
use crate::error::{LoaderError, Result};

/// Where the images are in Kaggle's zip.
const CLS_LOC: &str = "Data/CLS-LOC/";
/// Kaggle's validation labels, beside `ILSVRC/`.
const KAGGLE_CSV: &str = "LOC_val_solution.csv";
/// Largest label file read from a zip (Kaggle's CSV is 2.5 MB).
const MAX_CSV_BYTES: u64 = 64 << 20;

/// One file member of a zip.
struct Member {
    name: String,
    size: u64,
    loc: Loc,
}

impl Member {
    /// The input it is, labelled `label` (a scan index).
    fn found(self, label: u32) -> Found {
        Found {
            label,
            name: self.name,
            size: self.size,
            loc: self.loc,
        }
    }
}

/// What a zip's central directory lists: its file members, its folders, and the index of
/// Kaggle's CSV among its entries.
struct Listing {
    members: Vec<Member>,
    folders: Vec<String>,
    csv: Option<usize>,
}

/// The error of the zip at `path` that the zip crate could not read.
fn unreadable(path: &Path) -> impl Fn(zip::result::ZipError) -> LoaderError + '_ {
    move |e| {
        input_err(
            path,
            format!("unreadable zip: {e} (a download cut short or damaged?)"),
        )
    }
}

/// Finds the splits of Kaggle's zip at `path`.
pub(super) fn scan(path: &Path, scan: &mut Scan) -> Result<BTreeMap<String, SplitFound>> {
    let file = File::open(path).map_err(|e| LoaderError::io("open", path, e))?;
    let mut zip = ZipArchive::new(file).map_err(unreadable(path))?;
    let archive = scan.archive(path);
    let Listing {
        members,
        folders,
        csv,
    } = list(&mut zip, path, archive)?;
    let Some(root) = members.iter().find_map(|m| {
        let i = m.name.find(CLS_LOC)?;
        Some(m.name[..i + CLS_LOC.len()].to_string())
    }) else {
        return Err(input_err(
            path,
            format!(
                "holds no {CLS_LOC} folder: ddl-pack reads Kaggle's ImageNet zip (unzip another \
                 zip and pack its folder)"
            ),
        ));
    };
    // A class folder without images is a class too (which the class check then reports).
    for f in &folders {
        let rel = f.strip_prefix(root.as_str()).unwrap_or("");
        if let ["train", class, ""] = rel.split('/').collect::<Vec<_>>().as_slice() {
            scan.wnid_id(class);
        }
    }
    let (train, val) = sort(path, &root, members, scan)?;
    let mut found = BTreeMap::new();
    if !train.is_empty() {
        let folder = format!("{}:{root}train", path.display());
        let rule = "class: the name of the image's folder; label: the position of the class's \
                    wnid in manifest.json's classes";
        let split = SplitFound {
            items: train,
            layout: format!("class folders in {folder}/"),
            labels: LabelSource::new(vec![folder], rule),
        };
        found.insert("train".to_string(), split);
    }
    scan.train_classes = scan.wnids.len();
    if !val.is_empty() {
        let folder = at(path, &format!("{root}val"));
        let labels = match csv {
            Some(i) => {
                let (name, bytes) = read_member(&mut zip, path, i)?;
                csv_labels(Some((&name, &bytes)))?
            }
            None => csv_labels(None)?,
        };
        let (items, labels) = label_flat(val, (path, &folder), &labels, scan)?;
        let layout = format!("flat folder {}", folder.display());
        found.insert(
            "val".to_string(),
            SplitFound {
                items,
                layout,
                labels,
            },
        );
    }
    Ok(found)
}

/// Lists the entries of `zip` (at `path`, `archive` in the scan): a member's place is read from
/// its local header, since its data starts after it.
fn list(zip: &mut ZipArchive<File>, path: &Path, archive: u32) -> Result<Listing> {
    let mut listing = Listing {
        members: Vec::new(),
        folders: Vec::new(),
        csv: None,
    };
    for i in 0..zip.len() {
        let m = zip.by_index_raw(i).map_err(unreadable(path))?;
        let name = m.name().to_string();
        if m.is_dir() {
            listing.folders.push(name);
            continue;
        }
        if name.rsplit('/').next() == Some(KAGGLE_CSV) {
            listing.csv = Some(i);
            continue;
        }
        let deflated = match m.compression() {
            CompressionMethod::Stored => false,
            CompressionMethod::Deflated => true,
            other => {
                return Err(input_err(
                    &at(path, &name),
                    format!("is compressed by {other}; ddl-pack reads stored or deflated members"),
                ))
            }
        };
        let loc = Loc::Zip {
            archive,
            crc32: m.crc32(),
            offset: m.data_start(),
            deflated,
        };
        let size = m.size();
        listing.members.push(Member { name, size, loc });
    }
    Ok(listing)
}

/// The name (as messages give it) and the bytes of entry `i` of `zip` (at `path`), a label file.
fn read_member(
    zip: &mut ZipArchive<File>,
    path: &Path,
    i: usize,
) -> Result<(std::path::PathBuf, Vec<u8>)> {
    let mut m = zip.by_index(i).map_err(unreadable(path))?;
    let name = at(path, m.name());
    let mut bytes = Vec::new();
    (&mut m)
        .take(MAX_CSV_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|e| LoaderError::io("read", &name, e))?;
    Ok((name, bytes))
}

/// `zip:member`, as messages name a member.
fn at(zip: &Path, member: &str) -> std::path::PathBuf {
    format!("{}:{member}", zip.display()).into()
}

/// Sorts the members into the training images (labelled by their class folder under
/// `root`train/) and the flat validation images (unlabelled yet), listing the rest as ignored:
/// the test images and whatever lies outside `root`, a line per folder.
fn sort(
    path: &Path,
    root: &str,
    members: Vec<Member>,
    scan: &mut Scan,
) -> Result<(Vec<Found>, Vec<Found>)> {
    let (mut train, mut val) = (Vec::new(), Vec::new());
    let mut ignored: BTreeMap<String, (u64, &str)> = BTreeMap::new();
    let mut ignore =
        |folder: String, why: &'static str| ignored.entry(folder).or_insert((0, why)).0 += 1;
    for m in members {
        let Some(rel) = m.name.strip_prefix(root) else {
            // Outside the images (ILSVRC/Annotations/, LOC_synset_mapping.txt): a line per
            // folder two levels down, or per file above that.
            let parts: Vec<&str> = m.name.splitn(3, '/').collect();
            match parts.as_slice() {
                [a, b, _] => ignore(format!("{a}/{b}/"), "not an input ddl-pack reads"),
                _ => ignore(m.name, "not an input ddl-pack reads"),
            }
            continue;
        };
        let parts: Vec<&str> = rel.split('/').collect();
        let image = is_image_name(&m.name);
        match parts.as_slice() {
            ["train", class, _] if image => {
                let label = scan.wnid_id(class);
                train.push(m.found(label));
            }
            ["val", _] if image => val.push(m.found(0)),
            ["val", _, _, ..] => {
                return Err(input_err(
                    &at(path, &m.name),
                    "is in a folder inside val/: ddl-pack reads Kaggle's flat val/ (unzip a \
                     re-sorted zip and pack the folder)",
                ))
            }
            ["test", ..] => ignore(
                format!("{root}test/"),
                "test images: no labels exist; not packed",
            ),
            ["train", _, _, _, ..] => ignore(
                format!("{root}{}/{}/", parts[0], parts[1]),
                "a folder inside a class folder: its images are not read",
            ),
            _ => ignore(m.name, "not an image file name"),
        }
    }
    for (name, (n, why)) in ignored {
        let what = match name.ends_with('/') {
            true => format!("{}:{name} ({n} files)", path.display()),
            false => format!("{}:{name}", path.display()),
        };
        scan.ignore(what, why);
    }
    Ok((train, val))
}
