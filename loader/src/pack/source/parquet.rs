//! Hugging Face's parquet datasets, as the `imagenet-1k` repository is downloaded:
//! `data/{train,validation,test}-NNNNN-of-NNNNN.parquet` (or the files at the top), each row an
//! `image` struct (`bytes`, `path`) and an integer `label`, with `classes.py` beside `data/`.
//!
//! The label is the row's own; its class name (the wnid) is line `label` of `classes.py`'s
//! `IMAGENET2012_CLASSES`, or else the `ClassLabel` names in the files' `huggingface` metadata,
//! and the classes keep that order, so every label stays the dataset's. The `test` split (no
//! labels, `label` -1) is left out with a line. Discovery reads the `label` and `image.path`
//! columns only; an image's bytes are read when it is converted, by skipping to its row within
//! its row group (pages before it are skipped by their headers, only its own is decompressed).
//! A row without image bytes is skipped and reported like an unreadable file.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parquet::column::reader::ColumnReader;
use parquet::file::reader::{FileReader, RowGroupReader};
use parquet::file::serialized_reader::SerializedFileReader;

use super::inputs::{LabelSource, Loc, Rejected};
use super::listing::{input_err, list_dir};
use super::parquet_file::ParquetFile;
use super::scan::{Found, Scan, SplitFound};
use crate::error::Result;

/// Rows read per call while reading a column at discovery.
const BATCH: usize = 4096;

/// The split a dataset file belongs to, by its name (`train-00000-of-00257.parquet`): `None`
/// for the test split.
fn split_of(file_name: &str) -> Option<Option<&'static str>> {
    let prefix = file_name.split(['-', '.']).next()?;
    match prefix {
        "train" => Some(Some("train")),
        "validation" | "val" | "valid" => Some(Some("val")),
        "test" => Some(None),
        _ => None,
    }
}

/// Scans `root` when it is a parquet dataset (`root/data/*.parquet` or `root/*.parquet`);
/// `None` when it holds no parquet file.
pub(super) fn scan_dir(
    root: &Path,
    scan: &mut Scan,
) -> Result<Option<BTreeMap<String, SplitFound>>> {
    let data = root.join("data");
    let dir = if data.is_dir() {
        data
    } else {
        root.to_path_buf()
    };
    let files: Vec<String> = list_dir(&dir)?
        .into_iter()
        .filter(|e| !e.is_dir() && e.name.ends_with(".parquet"))
        .map(|e| e.name)
        .collect();
    if files.is_empty() {
        return Ok(None);
    }
    let mut by_split: BTreeMap<&str, Vec<PathBuf>> = BTreeMap::new();
    for f in &files {
        match split_of(f) {
            Some(Some(split)) => by_split.entry(split).or_default().push(dir.join(f)),
            Some(None) => scan.ignore(dir.join(f).display(), "the test split: no labels exist"),
            None => {
                return Err(input_err(
                    &dir.join(f),
                    "is a parquet file whose name says no split (train-*, validation-*, \
                     test-*)",
                ))
            }
        }
    }
    let opened: Vec<(PathBuf, SerializedFileReader<File>)> = by_split
        .values()
        .flatten()
        .map(|p| open(p).map(|r| (p.clone(), r)))
        .collect::<Result<_>>()?;
    let names = class_names(root, &opened)?;
    for (label, w) in names.iter().enumerate() {
        if scan.wnid_id(w) as usize != label {
            return Err(input_err(
                root,
                format!(
                    "names class {w} twice (labels {} and {label})",
                    scan.wnid_ids[w]
                ),
            ));
        }
    }
    scan.train_classes = names.len();
    scan.declared = Some(names.clone());
    let mut readers = opened.into_iter();
    let mut found = BTreeMap::new();
    for (split, paths) in by_split {
        let mut items = Vec::new();
        for _ in &paths {
            let (path, reader) = readers.next().expect("one reader per file");
            items.extend(rows(&path, reader, split, &names, scan)?);
        }
        let labels = LabelSource::new(
            vec![format!(
                "{} parquet files in {}",
                paths.len(),
                dir.display()
            )],
            format!(
                "each row's label column; its class name from {}",
                class_source(root)
            ),
        );
        let layout = format!("{} parquet files in {}", paths.len(), dir.display());
        found.insert(
            split.to_string(),
            SplitFound {
                items,
                layout,
                labels,
            },
        );
    }
    Ok(Some(found))
}

/// Opens a parquet file (its footer).
fn open(path: &Path) -> Result<SerializedFileReader<File>> {
    let file = File::open(path).map_err(|e| crate::LoaderError::io("open", path, e))?;
    SerializedFileReader::new(file).map_err(|e| input_err(path, format!("unreadable parquet: {e}")))
}

/// Where the class names come from, in words.
fn class_source(root: &Path) -> String {
    let py = root.join("classes.py");
    if py.is_file() {
        format!("{}'s IMAGENET2012_CLASSES, in order", py.display())
    } else {
        "the ClassLabel names of the files' huggingface metadata".into()
    }
}

/// The class names in label order: `classes.py`'s keys, or the ClassLabel names of the
/// first file's `huggingface` metadata. Refused when neither exists or when they disagree: in
/// count, or on a label whose metadata name is neither the wnid nor the words `classes.py`
/// gives it (a `classes.py` in another order would rename every class).
fn class_names(
    root: &Path,
    files: &[(PathBuf, SerializedFileReader<File>)],
) -> Result<Vec<String>> {
    let from_meta = files
        .iter()
        .find_map(|(p, r)| label_names(r).map(|n| (p, n)));
    let py = root.join("classes.py");
    if py.is_file() {
        let text =
            std::fs::read_to_string(&py).map_err(|e| crate::LoaderError::io("read", &py, e))?;
        let (names, words): (Vec<String>, Vec<String>) = dict_entries(&text).into_iter().unzip();
        if names.is_empty() {
            return Err(input_err(
                &py,
                "lists no classes (a dict of \"wnid\": \"name\" lines)",
            ));
        }
        if let Some((p, meta)) = from_meta {
            if meta.len() != names.len() {
                return Err(input_err(
                    &py,
                    format!(
                        "lists {} classes, but {}'s metadata has {} class names",
                        names.len(),
                        p.display(),
                        meta.len()
                    ),
                ));
            }
            let differs = |k: &usize| meta[*k] != names[*k] && meta[*k] != words[*k];
            if let Some(k) = (0..names.len()).find(differs) {
                return Err(input_err(
                    &py,
                    format!(
                        "names label {k} {} ({:?}), but {}'s metadata names it {:?}: the two \
                         disagree on the class order; use the classes.py of this download",
                        names[k],
                        words[k],
                        p.display(),
                        meta[k]
                    ),
                ));
            }
        }
        return Ok(names);
    }
    match from_meta {
        Some((_, names)) => Ok(names),
        None => Err(input_err(
            root,
            "holds parquet files without class names: no classes.py beside data/, and no \
             ClassLabel names in the files' huggingface metadata",
        )),
    }
}

/// The ClassLabel names of the `label` feature in a file's `huggingface` metadata.
fn label_names(reader: &SerializedFileReader<File>) -> Option<Vec<String>> {
    let kv = reader.metadata().file_metadata().key_value_metadata()?;
    let json = kv.iter().find(|k| k.key == "huggingface")?.value.as_ref()?;
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    let names = v.pointer("/info/features/label/names")?.as_array()?;
    names
        .iter()
        .map(|n| n.as_str().map(str::to_string))
        .collect()
}

/// The entries (key, value) of a Python dict literal of strings written one entry per line
/// (`"n01440764": "tench, Tinca tinca",`), in order: `classes.py`'s `IMAGENET2012_CLASSES`.
/// A value that is not one quoted string is read as "".
fn dict_entries(text: &str) -> Vec<(String, String)> {
    let mut entries = Vec::new();
    for line in text.lines() {
        let Some((key, rest)) = quoted(line.trim_start()) else {
            continue;
        };
        if let Some(value) = rest.trim_start().strip_prefix(':') {
            let value = quoted(value.trim_start()).map_or("", |(v, _)| v);
            entries.push((key.to_string(), value.to_string()));
        }
    }
    entries
}

/// The string `text` starts with, quoted by `"` or `'`, and what follows it.
fn quoted(text: &str) -> Option<(&str, &str)> {
    let quote = text.chars().next().filter(|c| *c == '"' || *c == '\'')?;
    text[1..].split_once(quote)
}

/// The leaf column index of `path` (e.g. `image.bytes`).
fn column(reader: &SerializedFileReader<File>, path: &str) -> Option<usize> {
    let schema = reader.metadata().file_metadata().schema_descr();
    (0..schema.num_columns()).find(|&i| schema.column(i).path().string() == path)
}

/// The rows of one file of `split` as inputs labelled by scan index.
fn rows(
    path: &Path,
    reader: SerializedFileReader<File>,
    split: &str,
    names: &[String],
    scan: &mut Scan,
) -> Result<Vec<Found>> {
    let need = |c: &str| {
        column(&reader, c).ok_or_else(|| {
            input_err(
                path,
                format!("has no column {c} (Hugging Face's image datasets have image.bytes, image.path and label)"),
            )
        })
    };
    let (bytes, paths, labels) = (
        need("image.bytes")?,
        column(&reader, "image.path"),
        need("label")?,
    );
    let bad =
        |e: parquet::errors::ParquetError| input_err(path, format!("unreadable parquet: {e}"));
    let file = scan.parquet.len() as u32;
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut found = Vec::new();
    let mut global = 0u64;
    for g in 0..reader.num_row_groups() {
        let group = reader.get_row_group(g).map_err(bad)?;
        let label_values = read_labels(&*group, labels).map_err(bad)?;
        let path_values = match paths {
            Some(c) => read_paths(&*group, c).map_err(bad)?,
            None => vec![None; label_values.len()],
        };
        for (row, (label, name)) in label_values.into_iter().zip(path_values).enumerate() {
            let name = name.unwrap_or_else(|| format!("{stem}:{}", global + row as u64));
            let loc = Loc::Parquet {
                file,
                group: g as u32,
                row: row as u32,
            };
            match label {
                Some(l) if l >= 0 && (l as usize) < names.len() => found.push(Found {
                    label: l as u32,
                    name,
                    size: 0,
                    loc,
                }),
                Some(l) if l >= 0 => {
                    return Err(input_err(
                        path,
                        format!(
                            "row {}: label {l} is not one of the {} classes",
                            global + row as u64,
                            names.len()
                        ),
                    ))
                }
                _ => scan.rejected.push(Rejected {
                    split: split.to_string(),
                    path: format!("{}[row {}]:{name}", path.display(), global + row as u64),
                    reason: "no label".into(),
                    detail: "the row's label is null or negative".into(),
                }),
            }
        }
        global += group.metadata().num_rows() as u64;
    }
    scan.parquet.push(ParquetFile {
        path: path.to_path_buf(),
        meta: Arc::new(reader.metadata().clone()),
        bytes,
    });
    Ok(found)
}

/// Every row's label of one row group (None where null).
fn read_labels(group: &dyn RowGroupReader, c: usize) -> parquet::errors::Result<Vec<Option<i64>>> {
    let rows = group.metadata().num_rows() as usize;
    let mut out = Vec::with_capacity(rows);
    let column = group.get_column_reader(c)?;
    let max_def = group.metadata().column(c).column_descr().max_def_level();
    match column {
        ColumnReader::Int64ColumnReader(mut r) => {
            while out.len() < rows {
                let (mut defs, mut values) = (Vec::new(), Vec::new());
                let (n, _, _) = r.read_records(BATCH, Some(&mut defs), None, &mut values)?;
                spread(&defs, max_def, n, values, &mut out)?;
            }
        }
        ColumnReader::Int32ColumnReader(mut r) => {
            while out.len() < rows {
                let (mut defs, mut values) = (Vec::new(), Vec::new());
                let (n, _, _) = r.read_records(BATCH, Some(&mut defs), None, &mut values)?;
                let values = values.into_iter().map(i64::from).collect();
                spread(&defs, max_def, n, values, &mut out)?;
            }
        }
        _ => {
            return Err(parquet::errors::ParquetError::General(
                "label is not an integer column".into(),
            ))
        }
    }
    Ok(out)
}

/// Every row's image path of one row group (None where null).
fn read_paths(
    group: &dyn RowGroupReader,
    c: usize,
) -> parquet::errors::Result<Vec<Option<String>>> {
    let rows = group.metadata().num_rows() as usize;
    let mut out = Vec::with_capacity(rows);
    let max_def = group.metadata().column(c).column_descr().max_def_level();
    let ColumnReader::ByteArrayColumnReader(mut r) = group.get_column_reader(c)? else {
        return Err(parquet::errors::ParquetError::General(
            "image.path is not a string column".into(),
        ));
    };
    while out.len() < rows {
        let (mut defs, mut values) = (Vec::new(), Vec::new());
        let (n, _, _) = r.read_records(BATCH, Some(&mut defs), None, &mut values)?;
        let values = values
            .into_iter()
            .map(|v| String::from_utf8_lossy(v.data()).into_owned())
            .collect();
        spread(&defs, max_def, n, values, &mut out)?;
    }
    Ok(out)
}

/// Appends `n` rows to `out`: the next of `values` where a row's definition level is
/// `max_def` (present), `None` elsewhere. Fails when the column ended early (`n` 0).
fn spread<T>(
    defs: &[i16],
    max_def: i16,
    n: usize,
    values: Vec<T>,
    out: &mut Vec<Option<T>>,
) -> parquet::errors::Result<()> {
    if n == 0 {
        return Err(parquet::errors::ParquetError::General(
            "a column ends before its row group's last row".into(),
        ));
    }
    let mut values = values.into_iter();
    if defs.is_empty() {
        out.extend(values.map(Some));
        return Ok(());
    }
    for &d in &defs[..n] {
        out.push(if d == max_def { values.next() } else { None });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_py_entries_in_order_and_split_names() {
        let text = "from collections import OrderedDict\n\nIMAGENET2012_CLASSES = OrderedDict(\n    {\n        \"n01440764\": \"tench, Tinca tinca\",\n        'n01443537': \"goldfish, Carassius auratus\",\n    }\n)\n";
        let entries = dict_entries(text);
        assert_eq!(
            entries,
            [
                ("n01440764".into(), "tench, Tinca tinca".into()),
                ("n01443537".into(), "goldfish, Carassius auratus".into())
            ]
        );
        assert_eq!(
            split_of("train-00000-of-00257.parquet"),
            Some(Some("train"))
        );
        assert_eq!(
            split_of("validation-00003-of-00014.parquet"),
            Some(Some("val"))
        );
        assert_eq!(split_of("test-00000-of-00028.parquet"), Some(None));
        assert_eq!(split_of("other.parquet"), None);
    }
}
