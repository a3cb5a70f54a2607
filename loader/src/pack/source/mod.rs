//! Finding the packer's inputs and their labels, in every form ImageNet is downloaded in
//! (`layout.rs` tells them apart):
//!
//! - image-net.org's archives as downloaded (`ILSVRC2012_img_train.tar`, a tar of per-class
//!   tars; `ILSVRC2012_img_val.tar`, flat; `ILSVRC2012_devkit_t12.tar.gz`) or extracted
//!   (`train/<wnid>/`, a flat `val/`, the devkit folder), in any mix;
//! - Kaggle's CLS-LOC folders with `LOC_val_solution.csv`;
//! - Hugging Face's `imagenet-1k` parquet files (`parquet.rs`);
//! - WebDataset shards, as timm publishes ImageNet (`wds.rs`);
//! - ImageNet-22k's per-synset tars, on disk or in an outer `fall11_whole.tar` /
//!   `winter21_whole.tar` (which may also be the input itself); any class-folder tree.
//!
//! Labels come only from a source that states them: a class folder's or per-synset tar's wnid,
//! the devkit's ground truth through its `meta.mat` (`devkit.rs`), Kaggle's CSV, a parquet
//! row's label, a WebDataset sample's `.cls`. An input whose label cannot be vouched for is
//! refused, never guessed (`val.rs`); each split's label source is recorded in the report and
//! the manifest.
//!
//! Tars are indexed with the tar crate (headers only, seeking over member data) and never
//! extracted: members are later read with positioned reads at the recorded offsets, so nested
//! tars are never unpacked and each member can be read independently.

mod devkit;
mod layout;
mod listing;
mod parquet;
mod tars;
mod tree;
mod val;
mod wds;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::classes;
use crate::error::{LoaderError, Result};
use listing::{input_err, name_link};

/// File name extensions (lower case) taken as images; other files are counted as ignored.
pub const IMAGE_EXTENSIONS: &[&str] = &["jpeg", "jpg", "png", "bmp", "gif", "webp", "tif", "tiff"];

/// Largest input file read, in bytes (guards memory against a damaged tar header).
pub const MAX_INPUT_BYTES: u64 = 1 << 30;

/// Where an input's bytes live.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Loc {
    /// File `name` in directory `Inputs::dirs[dir]`.
    Dir(u32),
    /// A file in directory `Inputs::dirs[dir]` whose name is not valid UTF-8 (`Item::name`
    /// holds it lossily decoded). Reading it fails, so it is skipped and reported like any
    /// unreadable input.
    NonUtf8Name(u32),
    /// A member of `Inputs::archives[archive]` whose data starts at byte `offset`.
    Archive {
        /// Index into `Inputs::archives`.
        archive: u32,
        /// Absolute byte offset of the member's data in the archive file.
        offset: u64,
    },
    /// Row `row` of row group `group` of the parquet file `Inputs::parquet[file]`.
    Parquet {
        /// Index into `Inputs::parquet`.
        file: u32,
        /// Row group.
        group: u32,
        /// Row within the row group.
        row: u32,
    },
}

/// One input image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    /// Class label.
    pub label: u32,
    /// File name (for a directory input) or path inside the archive (for a tar member, a
    /// parquet row's image path); the sort key within a class.
    pub name: String,
    /// Size of the input in bytes (a parquet row's: 0, known when read).
    pub size: u64,
    /// Where the bytes are.
    pub loc: Loc,
}

/// Options of input discovery.
#[derive(Clone, Debug, Default)]
pub struct SourceOptions {
    /// Restrict and order the classes: one wnid per line (first whitespace-separated token;
    /// blank lines and lines starting with `#` are skipped).
    pub classes: Option<PathBuf>,
    /// ILSVRC synset list for the devkit ground truth: line k (1-based) holds the wnid of
    /// ILSVRC id k, optionally followed by text. Needed only without the devkit's `meta.mat`;
    /// beside it, it must agree with it.
    pub synsets: Option<PathBuf>,
    /// Drop classes with fewer usable inputs than this (0 keeps all; see `classes.rs`).
    pub min_per_class: u64,
    /// Keep classes without usable training inputs as classes without records (see
    /// `classes.rs`).
    pub keep_empty_classes: bool,
}

/// Where a split's labels come from, as the report and the manifest record it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelSource {
    /// The files the labels are read from.
    pub files: Vec<String>,
    /// How a label is found in them.
    pub rule: String,
}

/// An input found but not packable before any decoding (a validation image without a label
/// row, a parquet row without image bytes): reported as skipped, and counted toward the skip
/// limit like an input that fails to decode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejected {
    /// Split ("train" or "val").
    pub split: String,
    /// The input, as the report names it.
    pub path: String,
    /// Short reason ("no label", "no image").
    pub reason: String,
    /// What is missing, naming the label file or row.
    pub detail: String,
}

/// Everything found under an input directory.
#[derive(Debug, Default)]
pub struct Inputs {
    /// Class wnids in label order.
    pub classes: Vec<String>,
    /// Items per split ("train", "val"), sorted by (label, name).
    pub splits: BTreeMap<String, Vec<Item>>,
    /// Directories referenced by [`Loc::Dir`].
    pub dirs: Vec<PathBuf>,
    /// Archive files referenced by [`Loc::Archive`].
    pub archives: Vec<PathBuf>,
    /// Parquet files referenced by [`Loc::Parquet`].
    pub parquet: Vec<parquet::ParquetFile>,
    /// How each split was found (for the report).
    pub layouts: BTreeMap<String, String>,
    /// Where each split's labels come from.
    pub labels: BTreeMap<String, LabelSource>,
    /// Inputs of classes left out by the class list, by wnid.
    pub ignored_classes: BTreeMap<String, u64>,
    /// Classes dropped by the minimum per class, with their usable input counts.
    pub dropped_classes: BTreeMap<String, u64>,
    /// Files that are not inputs (not images by their extension, splits without labels such
    /// as ImageNet's test set, archives ddl-pack does not read), with the reason.
    pub ignored_files: Vec<(String, String)>,
    /// Inputs found but not packable (see [`Rejected`]).
    pub rejected: Vec<Rejected>,
}

impl Inputs {
    /// Human-readable location of `item` for reports ("DIR/NAME", "ARCHIVE:MEMBER" or
    /// "FILE.parquet[row R]:NAME").
    pub fn display(&self, item: &Item) -> String {
        show(&self.dirs, &self.archives, &self.parquet, item)
    }

    /// Reads the bytes of `run`, items that [`read_together`] (or a single item): a parquet row
    /// group's rows in one pass over its pages.
    pub fn read_run(&self, run: &[&Item]) -> Vec<std::io::Result<Vec<u8>>> {
        match run {
            [first, ..] if run.len() > 1 => match first.loc {
                Loc::Parquet { file, group, .. } => {
                    let rows: Vec<u32> = run
                        .iter()
                        .map(|it| match it.loc {
                            Loc::Parquet { row, .. } => row,
                            _ => unreachable!("a run is one row group's rows"),
                        })
                        .collect();
                    self.parquet[file as usize].read_rows(group, &rows)
                }
                _ => run.iter().map(|it| self.read(it)).collect(),
            },
            _ => run.iter().map(|it| self.read(it)).collect(),
        }
    }

    /// Reads the bytes of `item`.
    pub fn read(&self, item: &Item) -> std::io::Result<Vec<u8>> {
        if item.size > MAX_INPUT_BYTES {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{} bytes is larger than the {MAX_INPUT_BYTES}-byte input limit",
                    item.size
                ),
            ));
        }
        match item.loc {
            Loc::Dir(d) => {
                let path = self.dirs[d as usize].join(&item.name);
                std::fs::read(&path).map_err(|e| name_link(&path, e))
            }
            Loc::NonUtf8Name(_) => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "file name is not valid UTF-8 (shown with U+FFFD); rename it to pack it",
            )),
            Loc::Archive { archive, offset } => {
                let f = File::open(&self.archives[archive as usize])?;
                let mut buf = vec![0u8; item.size as usize];
                f.read_exact_at(&mut buf, offset)?;
                Ok(buf)
            }
            Loc::Parquet { file, group, row } => self.parquet[file as usize].read(group, row),
        }
    }
}

/// Whether a split of `items` is found ordered, and read, by the inputs' place in their files
/// rather than by (label, name): parquet rows, whose images are compressed together a page at a
/// time, so that each page is read once for all of its rows (see `shards.rs`).
pub fn read_in_place_order(items: &[Item]) -> bool {
    items
        .first()
        .is_some_and(|it| matches!(it.loc, Loc::Parquet { .. }))
}

/// Sorts `items` by (label, name); the size and the location break ties, so that the order
/// never depends on the scan's.
pub fn sort_by_label(items: &mut [Item]) {
    items.sort_unstable_by(|a, b| {
        (a.label, &a.name, a.size, &a.loc).cmp(&(b.label, &b.name, b.size, &b.loc))
    });
}

/// Whether `a` and `b` are read in one go ([`Inputs::read_run`]): rows of one parquet row group.
pub fn read_together(a: &Item, b: &Item) -> bool {
    match (&a.loc, &b.loc) {
        (
            Loc::Parquet { file, group, .. },
            Loc::Parquet {
                file: f, group: g, ..
            },
        ) => file == f && group == g,
        _ => false,
    }
}

/// Where `item` is, in words (see [`Inputs::display`]).
fn show(
    dirs: &[PathBuf],
    archives: &[PathBuf],
    parquet: &[parquet::ParquetFile],
    item: &Item,
) -> String {
    match item.loc {
        Loc::Dir(d) | Loc::NonUtf8Name(d) => {
            dirs[d as usize].join(&item.name).display().to_string()
        }
        Loc::Archive { archive, .. } => {
            format!("{}:{}", archives[archive as usize].display(), item.name)
        }
        Loc::Parquet { file, group, row } => {
            parquet[file as usize].describe(group, row, &item.name)
        }
    }
}

/// An input found while scanning, before labels are known: its `label` is the index of its
/// wnid in [`Scan::wnids`] (one string per class rather than one per input, so that the index
/// of 14 M inputs costs one [`Item`] each).
type Found = Item;

/// What the scanners of one input fill in.
#[derive(Default)]
struct Scan {
    dirs: Vec<PathBuf>,
    archives: Vec<PathBuf>,
    parquet: Vec<parquet::ParquetFile>,
    ignored_files: Vec<(String, String)>,
    rejected: Vec<Rejected>,
    /// Every wnid seen, by scan index.
    wnids: Vec<String>,
    /// Scan index of each wnid.
    wnid_ids: HashMap<String, u32>,
    /// Wnids registered by the training split's scan (it runs first, so they are
    /// `wnids[..train_classes]`): its class folders and tars, empty ones included.
    train_classes: usize,
    /// The class order the input itself states (a parquet dataset's class names, WebDataset
    /// `.cls` numbers): its labels are kept unless a class list is given.
    declared: Option<Vec<String>>,
}

impl Scan {
    /// The scan index of `wnid`, registering it when new.
    fn wnid_id(&mut self, wnid: &str) -> u32 {
        if let Some(&id) = self.wnid_ids.get(wnid) {
            return id;
        }
        let id = self.wnids.len() as u32;
        self.wnids.push(wnid.to_string());
        self.wnid_ids.insert(wnid.to_string(), id);
        id
    }

    /// Registers an archive file, returning its index.
    fn archive(&mut self, path: &Path) -> u32 {
        self.archives.push(path.to_path_buf());
        self.archives.len() as u32 - 1
    }

    /// Registers a directory, returning its index.
    fn dir(&mut self, path: &Path) -> u32 {
        self.dirs.push(path.to_path_buf());
        self.dirs.len() as u32 - 1
    }

    /// Where `f` is, in words.
    fn display(&self, f: &Found) -> String {
        show(&self.dirs, &self.archives, &self.parquet, f)
    }

    /// Lists `path` among the ignored files.
    fn ignore(&mut self, path: impl std::fmt::Display, why: impl Into<String>) {
        self.ignored_files.push((path.to_string(), why.into()));
    }
}

/// One split as a scanner found it.
struct SplitFound {
    /// Its inputs, labelled by scan index.
    items: Vec<Found>,
    /// How it was found, in words.
    layout: String,
    /// Where its labels come from.
    labels: LabelSource,
}

/// Reads a wnid list: first token of every non-blank line not starting with `#`.
fn read_wnid_list(path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path).map_err(|e| LoaderError::io("read", path, e))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.split_whitespace().next().unwrap_or("").to_string())
        .collect())
}

/// Usable inputs per class in the split the classes come from: the training split, where
/// every class folder or tar counts (0 for an empty one), and so does a class with images
/// only in val (0); or, for an input with val alone, the classes with val images.
fn usable_counts(found: &BTreeMap<String, SplitFound>, scan: &Scan) -> BTreeMap<String, u64> {
    let train = found.get("train").filter(|f| !f.items.is_empty());
    let from = train
        .or_else(|| found.get("val"))
        .expect("some split has images");
    let mut per_id = vec![0u64; scan.wnids.len()];
    for f in &from.items {
        per_id[f.label as usize] += 1;
    }
    let mut class = vec![false; scan.wnids.len()];
    if train.is_some() {
        class[..scan.train_classes].fill(true);
        for f in found.get("val").into_iter().flat_map(|s| &s.items) {
            class[f.label as usize] = true;
        }
    }
    scan.wnids
        .iter()
        .zip(per_id)
        .zip(class)
        .filter(|((_, n), class)| *n > 0 || *class)
        .map(|((w, n), _)| (w.clone(), n))
        .collect()
}

/// Finds the inputs under `input` (see the module documentation for the layouts).
pub fn discover(input: &Path, opts: &SourceOptions) -> Result<Inputs> {
    let mut scan = Scan::default();
    let found = layout::scan(input, opts, &mut scan)?;
    if found.values().all(|f| f.items.is_empty()) {
        return Err(input_err(input, layout::NOTHING_FOUND));
    }
    let listed = match &opts.classes {
        Some(path) => {
            let list = read_wnid_list(path)?;
            classes::check_list(path, &list)?;
            Some(list)
        }
        None => scan.declared.clone(),
    };
    let counts = usable_counts(&found, &scan);
    if listed.is_none() && opts.min_per_class == 0 && !opts.keep_empty_classes {
        classes::check_none_empty(input, &counts)?;
    }
    let selection = classes::select(input, listed, &counts, opts.min_per_class)?;
    // Scan index -> label (None: not a kept class).
    let label_of: HashMap<&str, u32> = selection
        .classes
        .iter()
        .enumerate()
        .map(|(i, w)| (w.as_str(), i as u32))
        .collect();
    let relabel: Vec<Option<u32>> = scan
        .wnids
        .iter()
        .map(|w| label_of.get(w.as_str()).copied())
        .collect();
    let mut ignored_classes = BTreeMap::new();
    let mut splits = BTreeMap::new();
    let (mut layouts, mut labels) = (BTreeMap::new(), BTreeMap::new());
    for (split, f) in found {
        let mut items = f.items;
        // Relabelled in place: the index is never held twice.
        items.retain_mut(|it| match relabel[it.label as usize] {
            Some(label) => {
                it.label = label;
                true
            }
            None => {
                let wnid = &scan.wnids[it.label as usize];
                if !selection.dropped.contains_key(wnid) {
                    *ignored_classes.entry(wnid.clone()).or_insert(0u64) += 1;
                }
                false
            }
        });
        items.shrink_to_fit();
        if read_in_place_order(&items) {
            items.sort_unstable_by(|a, b| a.loc.cmp(&b.loc));
        } else {
            sort_by_label(&mut items);
        }
        layouts.insert(split.clone(), f.layout);
        labels.insert(split.clone(), f.labels);
        if !items.is_empty() {
            splits.insert(split, items);
        }
    }
    Ok(Inputs {
        classes: selection.classes,
        splits,
        dirs: scan.dirs,
        archives: scan.archives,
        parquet: scan.parquet,
        layouts,
        labels,
        ignored_classes,
        dropped_classes: selection.dropped,
        ignored_files: scan.ignored_files,
        rejected: scan.rejected,
    })
}
