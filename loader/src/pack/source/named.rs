//! Tars of images whose file names end in their class's wnid, as Hugging Face's `imagenet-1k`
//! shipped ImageNet before its parquet conversion (`data/train_images_0.tar.gz` ...
//! `train_images_4.tar.gz` holding `n01440764_10026_n01440764.JPEG`, `val_images.tar.gz` holding
//! `ILSVRC2012_val_00000001_n01751748.JPEG`). The name's last `_`-separated part labels the
//! image; a training name that starts with another wnid states two classes and is refused, and
//! the validation labels are checked against the devkit and Kaggle's CSV found beside them. The
//! same images extracted into flat `train/` and `val/` folders are read the same way.

use std::path::{Path, PathBuf};

use super::inputs::{LabelSource, SourceOptions};
use super::listing::{flat_images, input_err, is_image_name, is_wnid, name_wnid, Entry};
use super::scan::{Found, Scan, SplitFound};
use super::tars::Tar;
use super::val::{check_named, find_labels, ValLabels};
use crate::error::Result;

/// The rule, in words.
const RULE: &str = "class: the wnid that ends each image's file name (NAME_<wnid>.JPEG, as \
    Hugging Face's imagenet-1k tars name them); label: the position of the class's wnid in \
    manifest.json's classes";

/// The wnid labelling the image named `file` (at `at`, for an error): the one ending its name;
/// a training image whose name starts with another wnid is refused.
fn wnid_of(file: &str, train: bool, at: impl Fn() -> PathBuf) -> Result<&str> {
    let wnid = name_wnid(file).expect("every image is named by its wnid");
    let first = file.split('_').next().unwrap_or("");
    if train && is_wnid(first) && first != wnid {
        return Err(input_err(
            &at(),
            format!(
                "its name states two classes, {first} and {wnid}: ddl-pack cannot tell which \
                 is its label"
            ),
        ));
    }
    Ok(wnid)
}

/// The images of `tars`, each labelled by the wnid ending its name.
fn label(tars: Vec<Tar>, train: bool, scan: &mut Scan) -> Result<Vec<Found>> {
    let mut found = Vec::new();
    for tar in tars {
        let archive = scan.archive(&tar.path);
        for m in &tar.members {
            let at = || PathBuf::from(format!("{}:{}", tar.path.display(), m.name));
            if !is_image_name(m.file_name()) {
                scan.ignore(at().display(), "not an image file name");
                continue;
            }
            let wnid = wnid_of(m.file_name(), train, at)?;
            found.push(Found {
                label: scan.wnid_id(wnid),
                name: m.name.clone(),
                size: m.size,
                loc: tar.loc(archive, m.offset),
            });
        }
    }
    Ok(found)
}

/// The images of the flat folder `dir` (its `entries`), each labelled by the wnid ending its
/// name, if every image's name ends in one (Hugging Face's tars extracted); `None` otherwise.
pub(super) fn label_folder(
    dir: &Path,
    entries: &[Entry],
    train: bool,
    scan: &mut Scan,
) -> Result<Option<Vec<Found>>> {
    let images: Vec<&Entry> = entries.iter().filter(|e| is_image_name(&e.name)).collect();
    if images.is_empty() || images.iter().any(|e| name_wnid(&e.name).is_none()) {
        return Ok(None);
    }
    let found = flat_images(dir, entries, scan, |e, scan| {
        let wnid = wnid_of(&e.name, train, || dir.join(&e.name))?;
        Ok(scan.wnid_id(wnid))
    })?;
    Ok(Some(found))
}

/// A training split of `items` labelled by their names, found in the flat folder `dir`.
pub(super) fn train_folder(dir: &Path, items: Vec<Found>) -> SplitFound {
    let dir = dir.display().to_string();
    SplitFound {
        items,
        layout: format!("flat folder {dir} of images named by their wnid"),
        labels: LabelSource::new(vec![dir], RULE),
    }
}

/// A validation split of `items` labelled by their names, found in the flat folder `val`,
/// checked against the devkit and Kaggle's CSV found beside it (`labels`).
pub(super) fn val_folder(
    val: &Path,
    items: Vec<Found>,
    labels: &ValLabels,
    scan: &Scan,
) -> Result<SplitFound> {
    let mut split = train_folder(val, items);
    split
        .labels
        .add_checks(check_named(&split.items, labels, scan)?);
    Ok(split)
}

/// The training split of `tars`.
pub(super) fn train(tars: Vec<Tar>, scan: &mut Scan) -> Result<SplitFound> {
    let (layout, files) = describe(&tars);
    Ok(SplitFound {
        items: label(tars, true, scan)?,
        layout,
        labels: LabelSource::new(files, RULE),
    })
}

/// The validation split of `tars`, checked against the devkit and Kaggle's CSV found in `root`
/// or above it.
pub(super) fn val(
    root: &Path,
    tars: Vec<Tar>,
    opts: &SourceOptions,
    scan: &mut Scan,
) -> Result<SplitFound> {
    let labels = find_labels(root, &tars[0].path, opts)?;
    let (layout, files) = describe(&tars);
    let items = label(tars, false, scan)?;
    let mut source = LabelSource::new(files, RULE);
    source.add_checks(check_named(&items, &labels, scan)?);
    Ok(SplitFound {
        items,
        layout,
        labels: source,
    })
}

/// The layout and the label files of `tars`, in words.
fn describe(tars: &[Tar]) -> (String, Vec<String>) {
    let files: Vec<String> = tars.iter().map(|t| t.path.display().to_string()).collect();
    let layout = match files.as_slice() {
        [one] => format!("tar file {one}"),
        _ => format!("{} tars ({}, ...)", files.len(), files[0]),
    };
    (layout, files)
}
