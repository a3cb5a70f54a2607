//! TFRecord files of `tf.train.Example` records, the two forms TensorFlow users hold ImageNet in:
//! TensorFlow Datasets' `imagenet2012` (`imagenet2012-train.tfrecord-00000-of-01024`, features
//! `image`, `label`, `file_name`, with `label.labels.txt` naming the labels) and the TPU
//! reference's `imagenet_to_gcs.py` / `build_imagenet_data.py` (`train-00000-of-01024`,
//! `validation-00000-of-00128`: `image/encoded`, `image/class/synset`, `image/class/label`
//! counted from 1, `image/filename`). The split comes from the file name; the test split is left
//! out with a line.
//!
//! Each file is read once to list its records, and each record again on its own when it is
//! packed (`tfrecord_file.rs`). A record whose data fails its CRC, or that holds no image, is
//! skipped and counted toward the skip limit; a length that fails its CRC or a file cut short
//! would lose the records after it, and is refused.
//!
//! Labels: where every record states its wnid (`image/class/synset`, or a file name
//! `n01440764_10026.JPEG`), the wnids label, as a class folder's name does, and each number is
//! checked to name one wnid. Otherwise the numbers are the labels, in their order, named by the
//! class list, else by `label.labels.txt` beside the files, else by the wnids records state
//! (`numbered.rs`); a stated wnid that disagrees is refused either way.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use super::inputs::{LabelSource, Loc, Rejected, SourceOptions};
use super::listing::{input_err, is_image_name, list_dir, prefix_wnid, split_named, Entry};
use super::numbered::{name_numbers, stated, NumberList, Numbered};
use super::scan::{read_class_list, Found, Scan, SplitFound};
use super::tars::is_tar_name;
use super::tfrecord_file::{records, Fields, Record};
use crate::error::Result;

/// TensorFlow Datasets' names for the `label` feature's classes, beside the files.
const LABELS_TXT: &str = "label.labels.txt";

/// Whether `name` is a TFRecord file's name: `*.tfrecord*`, or a shard `NAME-00000-of-01024`
/// without an extension.
fn is_tfrecord_name(name: &str) -> bool {
    if name.contains(".tfrecord") {
        return true;
    }
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let mut parts = name.rsplitn(3, '-');
    let (Some(count), Some("of"), Some(rest)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    !name.contains('.') && digits(count) && rest.rsplit_once('-').is_some_and(|(_, i)| digits(i))
}

/// Whether `name` is a TensorFlow Datasets version folder's (`5.1.0`).
fn is_version(name: &str) -> bool {
    name.split('.').count() == 3 && name.split('.').all(|p| p.parse::<u32>().is_ok())
}

/// The folder of `root`'s TFRecord files: `root`, or the one TensorFlow Datasets version folder
/// that holds them (`imagenet2012/5.1.0/`); `None` when there are none. TensorFlow Datasets'
/// data folder itself, or a dataset's with two versions, is refused: which one is the user's
/// to say.
fn find(root: &Path) -> Result<Option<PathBuf>> {
    let holds = |dir: &Path| -> Result<bool> {
        let entries = list_dir(dir)?;
        Ok(entries
            .iter()
            .any(|e| !e.is_dir() && is_tfrecord_name(&e.name)))
    };
    if holds(root)? {
        return Ok(Some(root.to_path_buf()));
    }
    let versions_in = |dir: &Path| -> Result<Vec<String>> {
        let mut versions = Vec::new();
        for e in list_dir(dir)? {
            if e.is_dir() && is_version(&e.name) && holds(&dir.join(&e.name))? {
                versions.push(e.name);
            }
        }
        Ok(versions)
    };
    let versions = versions_in(root)?;
    match versions.as_slice() {
        [] => {
            // TensorFlow Datasets' data folder (~/tensorflow_datasets/): one folder per dataset.
            let mut datasets = Vec::new();
            for e in list_dir(root)?.into_iter().filter(Entry::is_dir) {
                if !versions_in(&root.join(&e.name))?.is_empty() {
                    datasets.push(root.join(&e.name).display().to_string());
                }
            }
            match datasets.is_empty() {
                true => Ok(None),
                false => Err(input_err(
                    root,
                    format!(
                        "is TensorFlow Datasets' data folder: give the folder of the dataset to \
                         pack ({})",
                        datasets.join(", ")
                    ),
                )),
            }
        }
        [one] => Ok(Some(root.join(one))),
        _ => Err(input_err(
            root,
            format!(
                "holds the TFRecord files of TensorFlow Datasets versions {}: give the folder \
                 of one of them",
                versions.join(", ")
            ),
        )),
    }
}

/// Scans `root` when it holds TFRecord files (or one TensorFlow Datasets version folder of
/// them); `None` when it holds none.
pub(super) fn scan_dir(
    root: &Path,
    opts: &SourceOptions,
    scan: &mut Scan,
) -> Result<Option<BTreeMap<String, SplitFound>>> {
    let Some(dir) = find(root)? else {
        return Ok(None);
    };
    let mut files: Vec<(PathBuf, &'static str)> = Vec::new();
    for e in list_dir(&dir)? {
        let path = dir.join(&e.name);
        if !e.is_dir() && is_tfrecord_name(&e.name) {
            match split_named(&e.name) {
                Some(Some(split)) => files.push((path, split)),
                Some(None) => scan.ignore(path.display(), "the test split: no labels exist"),
                None => {
                    return Err(input_err(
                        &path,
                        "is a TFRecord file whose name says no split (train, validation, test)",
                    ))
                }
            }
        } else if e.is_dir() || is_image_name(&e.name) || is_tar_name(&e.name) {
            return Err(input_err(
                &path,
                "lies beside TFRecord files: a folder holds one layout; move it out",
            ));
        } else {
            scan.ignore(path.display(), "not an input ddl-pack reads");
        }
    }
    // The training files first: their classes are registered first.
    files.sort_by_key(|(_, split)| *split != "train");
    if let Some(p) = scan.progress {
        let bytes = files
            .iter()
            .filter_map(|(f, _)| f.metadata().ok())
            .map(|m| m.len());
        let what = format!("{} TFRecord files", files.len());
        p.listing(&dir, bytes.sum(), &what);
    }
    let listed: Vec<Vec<Record>> = files
        .par_iter()
        .map(|(path, _)| records(path))
        .collect::<Result<_>>()?;
    let Labelled { labels, rule, list } = label(&dir, &files, &listed, opts, scan)?;
    let mut found: BTreeMap<String, SplitFound> = BTreeMap::new();
    for (((path, split), records), labels) in files.iter().zip(listed).zip(labels) {
        let archive = scan.archive(path);
        let entry = found.entry(split.to_string()).or_default();
        for (i, (r, label)) in records.into_iter().zip(labels).enumerate() {
            let at = || format!("{}[record {i}]", path.display());
            let reject = |reason: &str, detail: &str| Rejected {
                split: split.to_string(),
                path: at(),
                reason: reason.into(),
                detail: detail.into(),
            };
            match (r.fields, label) {
                (Err(why), _) => scan.rejected.push(reject(why, why)),
                (Ok(_), None) => scan
                    .rejected
                    .push(reject("no label", "the record has no label")),
                (Ok(f), Some(label)) => entry.items.push(Found {
                    label,
                    name: f.name.unwrap_or_else(|| format!("record {i}")),
                    size: f.size,
                    loc: Loc::TfRecord {
                        archive,
                        offset: r.offset,
                        len: r.len,
                    },
                }),
            }
        }
    }
    for (split, f) in &mut found {
        let n = files.iter().filter(|(_, s)| s == split).count();
        f.layout = format!("{n} TFRecord files");
        let read = format!("{n} TFRecord files ({split})");
        let listed = list.iter().map(|p| p.display().to_string());
        f.labels = LabelSource::new(std::iter::once(read).chain(listed).collect(), &rule);
    }
    Ok(Some(found))
}

/// The wnid record `f` states: its synset, else the wnid starting its file name.
fn stated_wnid(f: &Fields) -> Option<&str> {
    f.synset
        .as_deref()
        .or_else(|| f.name.as_deref().and_then(prefix_wnid))
}

/// How the records are labelled.
struct Labelled {
    /// Each record's label (a scan index), by file; `None`: it states none.
    labels: Vec<Vec<Option<u32>>>,
    /// The rule, in words.
    rule: String,
    /// The list that named the numbers, if one did.
    list: Option<PathBuf>,
}

/// Labels the `listed` records of `files` (see the module documentation), registering their
/// classes in `scan`.
fn label(
    dir: &Path,
    files: &[(PathBuf, &str)],
    listed: &[Vec<Record>],
    opts: &SourceOptions,
    scan: &mut Scan,
) -> Result<Labelled> {
    let at = |(f, i): (usize, usize)| format!("{}[record {i}]", files[f].0.display());
    let (mut inputs, mut place) = (Vec::new(), Vec::new());
    for (f, records) in listed.iter().enumerate() {
        for (i, fl) in records
            .iter()
            .enumerate()
            .filter_map(|(i, r)| Some((i, r.ok()?)))
        {
            let by_name = fl.name.as_deref().and_then(prefix_wnid);
            if let (Some(synset), Some(named)) = (fl.synset.as_deref(), by_name) {
                if synset != named {
                    return Err(input_err(
                        Path::new(&at((f, i))),
                        format!("states {synset} as its synset, but its file name is of {named}"),
                    ));
                }
            }
            if let Some(class) = fl.number.and_then(|n| u32::try_from(n).ok()) {
                inputs.push(Numbered {
                    class,
                    wnid: stated_wnid(fl),
                });
                place.push((f, i));
            }
        }
    }
    let at_input = |k: usize| at(place[k]);
    if listed
        .iter()
        .flatten()
        .filter_map(Record::ok)
        .all(|f| stated_wnid(f).is_some())
    {
        stated(&inputs, None, "label", at_input)?;
        let mut labels = Vec::new();
        for ((_, split), records) in files.iter().zip(listed) {
            let wnids = records.iter().map(|r| r.ok().and_then(stated_wnid));
            labels.push(wnids.map(|w| w.map(|w| scan.wnid_id(w))).collect());
            if *split == "train" {
                scan.train_classes = scan.wnids.len();
            }
        }
        let rule = "the wnid each record states (its image/class/synset, or its file name \
                    n01440764_10026.JPEG); each label number checked to name one wnid";
        return Ok(Labelled {
            labels,
            rule: rule.into(),
            list: None,
        });
    }
    let list = number_list(dir, opts)?;
    let numbers = list
        .as_ref()
        .map(|(path, wnids)| NumberList { path, wnids });
    let wnids = name_numbers(&inputs, numbers.as_ref(), "label", at_input)?;
    for (class, w) in wnids.iter().enumerate() {
        // Unique: a list is checked, and stated wnids give a wnid one number.
        let id = scan.wnid_id(w);
        debug_assert_eq!(id as usize, class);
    }
    scan.train_classes = wnids.len();
    scan.declared = Some(wnids);
    let labels = listed
        .iter()
        .map(|records| {
            let number = |r: &Record| r.ok()?.number.and_then(|n| u32::try_from(n).ok());
            records.iter().map(number).collect()
        })
        .collect();
    let by = match &list {
        Some((path, _)) => format!("line k+1 of {}", path.display()),
        None => "the wnid records state (image/class/synset, or a training file name \
                 n01440764_10026.JPEG)"
            .into(),
    };
    Ok(Labelled {
        labels,
        rule: format!("the class number k in each record's label; its wnid from {by}"),
        list: list.map(|(path, _)| path),
    })
}

/// The list that names the label numbers: the class list, or TensorFlow Datasets'
/// `label.labels.txt` beside the files (both: they must be the same).
fn number_list(dir: &Path, opts: &SourceOptions) -> Result<Option<(PathBuf, Vec<String>)>> {
    let txt = dir.join(LABELS_TXT);
    let beside = match txt.is_file() {
        true => Some((read_class_list(&txt)?, txt)),
        false => None,
    };
    match (&opts.classes, beside) {
        (Some(path), Some((wnids, txt))) => {
            if read_class_list(path)? != wnids {
                return Err(input_err(
                    path,
                    format!(
                        "names the label numbers otherwise than {} beside the TFRecord files \
                         (line k: class k): give the same list, or none",
                        txt.display()
                    ),
                ));
            }
            Ok(Some((path.clone(), wnids)))
        }
        (Some(path), None) => Ok(Some((path.clone(), read_class_list(path)?))),
        (None, beside) => Ok(beside.map(|(wnids, txt)| (txt, wnids))),
    }
}
