//! Labelling flat validation images (a flat `val/` folder, ImageNet's `ILSVRC2012_img_val.tar`):
//! by Kaggle's `LOC_val_solution.csv` (image id -> wnid), or by the devkit's ground truth, whose
//! line N labels the image numbered N (`ILSVRC2012_val_{N:08}.JPEG`), matched by the number in
//! the name, never by position.
//!
//! The ground truth and the images must match one to one: an image without a number or a line,
//! two images with one number, or a line without its image is refused, naming the file and the
//! line. An image without a CSV row is skipped and counted toward the skip limit (Kaggle's CSV
//! covers every image; a few missing rows are a damaged download).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::devkit::{self, GroundTruth};
use super::inputs::{LabelSource, Rejected, SourceOptions};
use super::listing::input_err;
use super::scan::{Found, Scan};
use crate::error::{LoaderError, Result};

/// Kaggle's validation labels.
const KAGGLE_CSV: &str = "LOC_val_solution.csv";

/// How flat validation images are labelled.
pub(super) enum FlatLabels {
    /// `LOC_val_solution.csv`: image id (file stem) -> wnid.
    Csv {
        /// The CSV file.
        file: PathBuf,
        /// Its rows.
        rows: HashMap<String, String>,
    },
    /// The devkit's ground truth.
    GroundTruth(GroundTruth),
}

/// Finds the labels of the flat validation images of `input` (the images in `val`, a folder
/// or a tar, named in the refusal): Kaggle's CSV or a ground truth in `val`, in `input` or up
/// to three levels above it, or a devkit in `input`. Refuses, naming what is missing, when
/// there is none.
pub(super) fn find_labels(input: &Path, val: &Path, opts: &SourceOptions) -> Result<FlatLabels> {
    // The Kaggle layout keeps LOC_val_solution.csv next to ILSVRC/ while the images are in
    // ILSVRC/Data/CLS-LOC/{train,val}.
    let mut places: Vec<PathBuf> = vec![val.to_path_buf(), input.to_path_buf()];
    places.retain(|p| p.is_dir());
    places.extend(input.canonicalize().ok().iter().flat_map(|c| {
        c.ancestors()
            .skip(1)
            .take(3)
            .map(Path::to_path_buf)
            .collect::<Vec<_>>()
    }));
    if let Some(csv) = places
        .iter()
        .map(|d| d.join(KAGGLE_CSV))
        .find(|p| p.is_file())
    {
        let rows = read_csv(&csv)?;
        return Ok(FlatLabels::Csv { file: csv, rows });
    }
    if let Some(gt) = devkit::find(input, &places, opts)? {
        return Ok(FlatLabels::GroundTruth(gt));
    }
    Err(input_err(
        val,
        format!(
            "holds validation images without labels: no ImageNet devkit \
             (ILSVRC2012_devkit_t12.tar.gz from image-net.org, or its extracted folder) in {}, \
             and no {KAGGLE_CSV} (Kaggle) or {} there or up to three levels above; put the \
             devkit beside the images",
            input.display(),
            devkit::GROUND_TRUTH,
        ),
    ))
}

/// Labels `images` (their `label` unset) of split `split` by `labels`; returns them labelled
/// by scan index, with the label source.
pub(super) fn label(
    images: Vec<Found>,
    split: &str,
    labels: FlatLabels,
    scan: &mut Scan,
) -> Result<(Vec<Found>, LabelSource)> {
    match labels {
        FlatLabels::Csv { file, rows } => {
            let mut found = Vec::with_capacity(images.len());
            for mut f in images {
                match rows.get(stem(&f.name)) {
                    Some(wnid) => {
                        f.label = scan.wnid_id(wnid);
                        found.push(f);
                    }
                    None => scan.rejected.push(Rejected {
                        split: split.to_string(),
                        path: scan.display(&f),
                        reason: "no label".into(),
                        detail: format!(
                            "no row for ImageId {} in {}",
                            stem(&f.name),
                            file.display()
                        ),
                    }),
                }
            }
            let source = LabelSource {
                files: vec![file.display().to_string()],
                rule: "the first wnid of the PredictionString of the row whose ImageId is the \
                       image's file name without its extension"
                    .into(),
            };
            Ok((found, source))
        }
        FlatLabels::GroundTruth(gt) => {
            let found = by_number(images, &gt, scan)?;
            let source = LabelSource {
                files: vec![gt.file, gt.mapping],
                rule: "line N of the ground truth holds the ILSVRC2012_ID of the image whose \
                       name ends in the number N (ILSVRC2012_val_{N:08}.JPEG); the id's WNID \
                       from meta.mat's synsets (or the synset list's line of that id)"
                    .into(),
            };
            Ok((found, source))
        }
    }
}

/// Labels each image by the ground truth's line of its number; refuses any mismatch.
fn by_number(mut images: Vec<Found>, gt: &GroundTruth, scan: &mut Scan) -> Result<Vec<Found>> {
    let lines = gt.wnids.len() as u64;
    let mut first: HashMap<u64, usize> = HashMap::with_capacity(images.len());
    for (i, f) in images.iter().enumerate() {
        let refuse = |why: String| Err(input_err(Path::new(&scan.display(f)), why));
        let Some(k) = trailing_number(stem(&f.name)) else {
            return refuse(format!(
                "has no image number in its name, and {} labels images by their number",
                gt.file
            ));
        };
        if k == 0 || k > lines {
            return refuse(format!(
                "is image number {k}, which has no line in {} ({lines} lines)",
                gt.file
            ));
        }
        if let Some(&j) = first.get(&k) {
            return refuse(format!(
                "and {} are both image number {k}: {} cannot tell them apart",
                scan.display(&images[j]),
                gt.file
            ));
        }
        first.insert(k, i);
    }
    if let Some(k) = (1..=lines).find(|k| !first.contains_key(k)) {
        return Err(LoaderError::Input {
            path: PathBuf::from(&gt.file),
            reason: format!(
                "line {k} labels image number {k}, which is not among the {} validation \
                 images ({lines} lines): the images and the ground truth do not match",
                images.len()
            ),
        });
    }
    for f in &mut images {
        let k = trailing_number(stem(&f.name)).expect("checked above");
        f.label = scan.wnid_id(&gt.wnids[k as usize - 1]);
    }
    Ok(images)
}

/// A file name's stem: its last `/`-separated part without the extension.
fn stem(name: &str) -> &str {
    let file = name.rsplit('/').next().unwrap_or(name);
    file.rsplit_once('.').map_or(file, |(s, _)| s)
}

/// Trailing decimal number of a file stem ("ILSVRC2012_val_00000042" -> 42).
fn trailing_number(stem: &str) -> Option<u64> {
    let digits = stem.len() - stem.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    stem[stem.len() - digits..].parse().ok()
}

/// Labels for flat validation files by image id (file stem), from `LOC_val_solution.csv`.
fn read_csv(path: &Path) -> Result<HashMap<String, String>> {
    let text = std::fs::read_to_string(path).map_err(|e| LoaderError::io("read", path, e))?;
    let mut lines = text.lines().enumerate();
    let header = lines.next().map(|(_, l)| l.trim()).unwrap_or("");
    let cols: Vec<&str> = header.split(',').map(str::trim).collect();
    let id_col = cols.iter().position(|c| *c == "ImageId");
    let pred_col = cols.iter().position(|c| *c == "PredictionString");
    let (Some(id_col), Some(pred_col)) = (id_col, pred_col) else {
        return Err(input_err(
            path,
            format!("header must name columns ImageId and PredictionString, found {header:?}"),
        ));
    };
    let mut out = HashMap::new();
    for (n, line) in lines {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').collect();
        let (Some(id), Some(pred)) = (fields.get(id_col), fields.get(pred_col)) else {
            return Err(input_err(path, format!("line {}: too few columns", n + 1)));
        };
        let Some(wnid) = pred.split_whitespace().next() else {
            return Err(input_err(
                path,
                format!("line {}: empty PredictionString", n + 1),
            ));
        };
        if out
            .insert(id.trim().to_string(), wnid.to_string())
            .is_some()
        {
            return Err(input_err(
                path,
                format!(
                    "line {}: ImageId {} is given a second time",
                    n + 1,
                    id.trim()
                ),
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_stems() {
        assert_eq!(trailing_number("ILSVRC2012_val_00000042"), Some(42));
        assert_eq!(trailing_number("abc"), None);
        assert_eq!(
            stem("val/ILSVRC2012_val_00000042.JPEG"),
            "ILSVRC2012_val_00000042"
        );
    }
}
