//! Labelling validation images by the sources that state their labels: Kaggle's
//! `LOC_val_solution.csv` (image id -> wnid) and the devkit's ground truth, whose line N labels
//! the image numbered N (`ILSVRC2012_val_{N:08}.JPEG`), matched by the number in the name,
//! never by position.
//!
//! Flat images (a flat `val/`, `ILSVRC2012_img_val.tar`) are labelled by the ground truth when
//! there is one, else by the CSV; images sorted into class folders by their folder. Every other
//! source found beside them is a check: each image it names must have the wnid it states, or
//! the pack is refused, naming the image, both sources and both wnids, since either may be the
//! wrong one (a CSV of another download, a folder sorted by a wrong script).
//!
//! The ground truth and flat images must match one to one: an image without a number or a line,
//! two images with one number, or a line without its image is refused, naming the file and the
//! line. A flat image without a CSV row, where the CSV labels them, is skipped and counted
//! toward the skip limit (Kaggle's CSV covers every image; a few missing rows are a damaged
//! download).

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::devkit::{self, GroundTruth};
use super::inputs::{LabelSource, Rejected, SourceOptions};
use super::listing::{input_err, is_wnid};
use super::scan::{Found, Scan};
use crate::error::{LoaderError, Result};

/// Kaggle's validation labels.
const KAGGLE_CSV: &str = "LOC_val_solution.csv";
/// The name of validation image N, without its extension, is this and N in 8 digits.
const VAL_NAME_PREFIX: &str = "ILSVRC2012_val_";

/// The sources found beside validation images that state their labels.
pub(super) struct ValLabels {
    /// Kaggle's CSV.
    csv: Option<Csv>,
    /// The devkit's ground truth.
    truth: Option<GroundTruth>,
}

/// `LOC_val_solution.csv`: image id (file stem) -> wnid.
struct Csv {
    /// The CSV file, as messages name it.
    file: String,
    /// Its rows.
    rows: HashMap<String, String>,
}

/// The source that labels a split's images; the others found only check them.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Labeller {
    /// The class folder an image is in.
    Folder,
    /// The wnid that ends the image's name.
    Name,
    /// The devkit's ground truth.
    Truth,
    /// Kaggle's CSV.
    Csv,
}

/// Finds the sources that state the labels of the validation images of `input` (the images in
/// `val`, a folder or a tar): Kaggle's CSV in `val`, in `input` or up to three levels above
/// it, and a devkit in `input` or a ground truth in those places. Either may be absent.
pub(super) fn find_labels(input: &Path, val: &Path, opts: &SourceOptions) -> Result<ValLabels> {
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
    let csv = match places
        .iter()
        .map(|d| d.join(KAGGLE_CSV))
        .find(|p| p.is_file())
    {
        Some(path) => {
            let file = File::open(&path).map_err(|e| LoaderError::io("open", &path, e))?;
            Some(Csv {
                rows: read_csv(&path, file)?,
                file: path.display().to_string(),
            })
        }
        None => None,
    };
    let truth = devkit::find(input, &places, opts)?;
    Ok(ValLabels { csv, truth })
}

/// The labels Kaggle's CSV states, read from `csv` (as messages name it, and its bytes), or none.
pub(super) fn csv_labels(csv: Option<(&Path, &[u8])>) -> Result<ValLabels> {
    let csv = match csv {
        Some((file, bytes)) => Some(Csv {
            rows: read_csv(file, bytes)?,
            file: file.display().to_string(),
        }),
        None => None,
    };
    Ok(ValLabels { csv, truth: None })
}

/// Labels the flat validation `images` of `input` (their `label` unset; `val`, their folder or
/// tar, is named in a refusal) by the ground truth, or else by the CSV, and checks them against
/// the CSV beside a ground truth. Returns them labelled by scan index, with the label source.
pub(super) fn label_flat(
    images: Vec<Found>,
    (input, val): (&Path, &Path),
    labels: &ValLabels,
    scan: &mut Scan,
) -> Result<(Vec<Found>, LabelSource)> {
    let (items, labeller, mut source) = match (&labels.truth, &labels.csv) {
        (Some(gt), _) => {
            let rule = "line N of the ground truth holds the ILSVRC2012_ID of the image whose \
                        name ends in the number N (ILSVRC2012_val_{N:08}.JPEG); the id's WNID \
                        from meta.mat's synsets (or the synset list's line of that id)";
            let source = LabelSource::new(vec![gt.file.clone(), gt.mapping.clone()], rule);
            (by_number(images, gt, scan)?, Labeller::Truth, source)
        }
        (None, Some(csv)) => {
            let rule = "the first wnid of the PredictionString of the row whose ImageId is the \
                        image's file name without its extension";
            let source = LabelSource::new(vec![csv.file.clone()], rule);
            (by_row(images, csv, scan), Labeller::Csv, source)
        }
        (None, None) => return Err(no_labels(input, val)),
    };
    let checked = check(&items, labeller, labels, scan)?;
    source.add_checks(checked);
    Ok((items, source))
}

/// Checks validation images labelled by their class folders against the CSV and the ground
/// truth found beside them; returns the files that named any of them.
pub(super) fn check_folders(
    items: &[Found],
    labels: &ValLabels,
    scan: &Scan,
) -> Result<Vec<String>> {
    check(items, Labeller::Folder, labels, scan)
}

/// Checks `items`, labelled by the wnid ending their names (`named.rs`), against every source
/// of `labels`; returns the files of the sources that named any.
pub(super) fn check_named(items: &[Found], labels: &ValLabels, scan: &Scan) -> Result<Vec<String>> {
    check(items, Labeller::Name, labels, scan)
}

/// The refusal of flat validation images (in `val`) with no source of labels.
fn no_labels(input: &Path, val: &Path) -> LoaderError {
    input_err(
        val,
        format!(
            "holds validation images without labels: no ImageNet devkit \
             (ILSVRC2012_devkit_t12.tar.gz from image-net.org, or its extracted folder) in {}, \
             and no {KAGGLE_CSV} (Kaggle) or {} there or up to three levels above; put the \
             devkit beside the images",
            input.display(),
            devkit::GROUND_TRUTH,
        ),
    )
}

/// Labels each image by its CSV row; an image without one is rejected ("no label").
fn by_row(images: Vec<Found>, csv: &Csv, scan: &mut Scan) -> Vec<Found> {
    let mut found = Vec::with_capacity(images.len());
    for mut f in images {
        match csv.rows.get(stem(&f.name)) {
            Some(wnid) => {
                f.label = scan.wnid_id(wnid);
                found.push(f);
            }
            None => scan.rejected.push(Rejected {
                split: "val".to_string(),
                path: scan.display(&f),
                reason: "no label".into(),
                detail: format!("no row for ImageId {} in {}", stem(&f.name), csv.file),
            }),
        }
    }
    found
}

/// Checks each of `items` (labelled by `labeller`) against every other source of `labels`
/// that names it; returns the files of the sources that named any.
fn check(
    items: &[Found],
    labeller: Labeller,
    labels: &ValLabels,
    scan: &Scan,
) -> Result<Vec<String>> {
    let by = match (labeller, &labels.truth, &labels.csv) {
        (Labeller::Truth, Some(gt), _) => gt.file.as_str(),
        (Labeller::Csv, _, Some(csv)) => csv.file.as_str(),
        (Labeller::Name, _, _) => "its file name",
        _ => "its class folder",
    };
    let mut checked = Vec::new();
    if let Some(csv) = labels.csv.as_ref().filter(|_| labeller != Labeller::Csv) {
        let stated = |name: &str| csv.rows.get(stem(name)).map(String::as_str);
        if agree(items, by, (&csv.file, stated), scan)? {
            checked.push(csv.file.clone());
        }
    }
    if let Some(gt) = labels
        .truth
        .as_ref()
        .filter(|_| labeller != Labeller::Truth)
    {
        let stated = |name: &str| {
            let line = usize::try_from(val_number(stem(name))?).ok()?;
            gt.wnids.get(line.checked_sub(1)?).map(String::as_str)
        };
        if agree(items, by, (&gt.file, stated), scan)? {
            checked.extend([gt.file.clone(), gt.mapping.clone()]);
        }
    }
    Ok(checked)
}

/// Refuses the first of `items` (labelled by `by`) whose wnid is not the one `file` states
/// for it (`stated`, by image name); returns whether `file` named any.
fn agree<'a>(
    items: &[Found],
    by: &str,
    (file, stated): (&str, impl Fn(&str) -> Option<&'a str>),
    scan: &Scan,
) -> Result<bool> {
    let mut named = false;
    for f in items {
        let Some(wnid) = stated(&f.name) else {
            continue;
        };
        named = true;
        let given = &scan.wnids[f.label as usize];
        if given != wnid {
            return Err(input_err(
                Path::new(&scan.display(f)),
                format!(
                    "{by} labels it {given}, but {file} labels it {wnid}: the sources of its \
                     label disagree and either may be wrong; keep only the one that belongs \
                     to these images"
                ),
            ));
        }
    }
    Ok(named)
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

/// A file name's stem: its last `/`-separated part without the extension, and without the wnid
/// that ends Hugging Face's names (`ILSVRC2012_val_00000001_n01751748.JPEG` ->
/// `ILSVRC2012_val_00000001`).
fn stem(name: &str) -> &str {
    let file = name.rsplit('/').next().unwrap_or(name);
    let stem = file.rsplit_once('.').map_or(file, |(s, _)| s);
    match stem.rsplit_once('_') {
        Some((base, wnid)) if is_wnid(wnid) => base,
        _ => stem,
    }
}

/// The number N of validation image N's stem (`ILSVRC2012_val_{N:08}`); other stems have none.
fn val_number(stem: &str) -> Option<u64> {
    let digits = stem.strip_prefix(VAL_NAME_PREFIX)?;
    if digits.len() != 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Trailing decimal number of a file stem ("ILSVRC2012_val_00000042" -> 42).
fn trailing_number(stem: &str) -> Option<u64> {
    let digits = stem.len() - stem.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    stem[stem.len() - digits..].parse().ok()
}

/// One row of Kaggle's CSV (any other column is not read).
#[derive(Deserialize)]
struct Row {
    #[serde(rename = "ImageId")]
    image_id: String,
    #[serde(rename = "PredictionString")]
    prediction: String,
}

/// Labels for flat validation files by image id (file stem), from `LOC_val_solution.csv`.
fn read_csv(path: &Path, source: impl std::io::Read) -> Result<HashMap<String, String>> {
    let bad = |e: csv::Error| input_err(path, e.to_string());
    let at = |line: u64, why: String| input_err(path, format!("line {line}: {why}"));
    let mut reader = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_reader(source);
    let headers = reader.headers().map_err(bad)?.clone();
    if !["ImageId", "PredictionString"]
        .iter()
        .all(|c| headers.iter().any(|h| h == *c))
    {
        let found: Vec<&str> = headers.iter().collect();
        return Err(input_err(
            path,
            format!("header must name columns ImageId and PredictionString, found {found:?}"),
        ));
    }
    let mut out = HashMap::new();
    let mut record = csv::StringRecord::new();
    while reader.read_record(&mut record).map_err(bad)? {
        let line = record.position().map_or(0, csv::Position::line);
        let row: Row = record
            .deserialize(Some(&headers))
            .map_err(|e| at(line, e.to_string()))?;
        let Some(wnid) = row.prediction.split_whitespace().next() else {
            return Err(at(line, "empty PredictionString".into()));
        };
        let wnid = wnid.to_string();
        if out.insert(row.image_id.clone(), wnid).is_some() {
            let why = format!("ImageId {} is given a second time", row.image_id);
            return Err(at(line, why));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kaggle_csv_with_a_byte_order_mark_and_quoted_fields() {
        let path = Path::new(KAGGLE_CSV);
        let text = "\u{feff}ImageId,PredictionString\n\
                    ILSVRC2012_val_00000001,\"n01440764 1 2 3 4 n01443537 5 6 7 8\"\n\
                    \n\
                    ILSVRC2012_val_00000002,n01443537 1 2 3 4\n";
        let rows = read_csv(path, text.as_bytes()).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows["ILSVRC2012_val_00000001"], "n01440764");
        assert_eq!(rows["ILSVRC2012_val_00000002"], "n01443537");

        let twice = format!("{text}ILSVRC2012_val_00000001,n01443537\n");
        let e = read_csv(path, twice.as_bytes()).unwrap_err().to_string();
        assert!(
            e.contains("line 5: ImageId ILSVRC2012_val_00000001 is given a second time"),
            "{e}"
        );
        let other = "ImageId,Labels\nILSVRC2012_val_00000001,n01440764\n";
        let e = read_csv(path, other.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("ImageId and PredictionString"), "{e}");
    }

    #[test]
    fn numbers_and_stems() {
        assert_eq!(trailing_number("ILSVRC2012_val_00000042"), Some(42));
        assert_eq!(trailing_number("abc"), None);
        assert_eq!(val_number("ILSVRC2012_val_00000042"), Some(42));
        assert_eq!(val_number("img_00000042"), None);
        assert_eq!(val_number("ILSVRC2012_val_42"), None);
        assert_eq!(
            stem("val/ILSVRC2012_val_00000042.JPEG"),
            "ILSVRC2012_val_00000042"
        );
        assert_eq!(
            stem("ILSVRC2012_val_00000042_n01751748.JPEG"),
            "ILSVRC2012_val_00000042"
        );
    }
}
