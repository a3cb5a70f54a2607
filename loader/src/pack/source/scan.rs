//! What the scanners of an input fill in ([`Scan`]) before labels are known.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::inputs::{show, Item, LabelSource, Rejected};
use super::parquet_file::ParquetFile;
use crate::error::{LoaderError, Result};
use crate::pack::progress::PackProgress;

/// An input found while scanning, before labels are known: its `label` is the index of its
/// wnid in [`Scan::wnids`] (one string per class rather than one per input, so that the index
/// of 14 M inputs costs one [`Item`] each).
pub(super) type Found = Item;

/// What the scanners of one input fill in.
#[derive(Default)]
pub(super) struct Scan<'a> {
    /// Told of each gzip-compressed tar as it is listed.
    pub(super) progress: Option<&'a dyn PackProgress>,
    pub(super) dirs: Vec<PathBuf>,
    pub(super) archives: Vec<PathBuf>,
    pub(super) parquet: Vec<ParquetFile>,
    pub(super) ignored_files: Vec<(String, String)>,
    pub(super) rejected: Vec<Rejected>,
    /// Every wnid seen, by scan index.
    pub(super) wnids: Vec<String>,
    /// Scan index of each wnid.
    pub(super) wnid_ids: HashMap<String, u32>,
    /// Wnids registered by the training split's scan (it runs first, so they are
    /// `wnids[..train_classes]`): its class folders and tars, empty ones included.
    pub(super) train_classes: usize,
    /// The class order the input itself states (a parquet dataset's class names, WebDataset
    /// `.cls` numbers): its labels are kept unless a class list is given.
    pub(super) declared: Option<Vec<String>>,
}

impl Scan<'_> {
    /// The scan index of `wnid`, registering it when new.
    pub(super) fn wnid_id(&mut self, wnid: &str) -> u32 {
        if let Some(&id) = self.wnid_ids.get(wnid) {
            return id;
        }
        let id = self.wnids.len() as u32;
        self.wnids.push(wnid.to_string());
        self.wnid_ids.insert(wnid.to_string(), id);
        id
    }

    /// Registers an archive file, returning its index.
    pub(super) fn archive(&mut self, path: &Path) -> u32 {
        self.archives.push(path.to_path_buf());
        self.archives.len() as u32 - 1
    }

    /// Registers a directory, returning its index.
    pub(super) fn dir(&mut self, path: &Path) -> u32 {
        self.dirs.push(path.to_path_buf());
        self.dirs.len() as u32 - 1
    }

    /// Where `f` is, in words.
    pub(super) fn display(&self, f: &Found) -> String {
        show(&self.dirs, &self.archives, &self.parquet, f)
    }

    /// Lists `path` among the ignored files.
    pub(super) fn ignore(&mut self, path: impl std::fmt::Display, why: impl Into<String>) {
        self.ignored_files.push((path.to_string(), why.into()));
    }
}

/// One split as a scanner found it.
#[derive(Default)]
pub(super) struct SplitFound {
    /// Its inputs, labelled by scan index.
    pub(super) items: Vec<Found>,
    /// How it was found, in words.
    pub(super) layout: String,
    /// Where its labels come from.
    pub(super) labels: LabelSource,
}

/// Reads a class list (`--classes`, `label.labels.txt`): a wnid list with no class twice and at
/// least one.
pub(super) fn read_class_list(path: &Path) -> Result<Vec<String>> {
    let list = read_wnid_list(path)?;
    crate::pack::classes::check_list(path, &list)?;
    Ok(list)
}

/// Reads a wnid list: first token of every non-blank line not starting with `#`.
pub(super) fn read_wnid_list(path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path).map_err(|e| LoaderError::io("read", path, e))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.split_whitespace().next().unwrap_or("").to_string())
        .collect())
}
