//! The inputs a pack found ([`Inputs`]): where each one's bytes live and how they are read.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::gzip::Readers;
use super::parquet_file::ParquetFile;

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
    /// A member of the gzip-compressed tar `Inputs::archives[archive]` whose data starts at
    /// byte `offset` of the decompressed stream (read in order: see `gzip.rs`).
    Gzip {
        /// Index into `Inputs::archives`.
        archive: u32,
        /// Byte offset of the member's data in the decompressed stream.
        offset: u64,
    },
    /// A member of the zip `Inputs::archives[archive]` whose data starts at byte `offset`,
    /// deflated or stored, with the CRC-32 of its bytes (`zipped.rs`).
    Zip {
        /// Index into `Inputs::archives`.
        archive: u32,
        /// The CRC-32 the zip records for the member's bytes.
        crc32: u32,
        /// Absolute byte offset of the member's data in the zip.
        offset: u64,
        /// Whether its data is deflated (else stored as it is).
        deflated: bool,
    },
    /// The record of `len` data bytes whose length field starts at byte `offset` of the
    /// TFRecord file `Inputs::archives[archive]` (`tfrecord_file.rs`).
    TfRecord {
        /// Index into `Inputs::archives`.
        archive: u32,
        /// Byte offset of the record in the file.
        offset: u64,
        /// Length of the record's data (a `tf.train.Example`).
        len: u64,
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
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelSource {
    /// The files the labels are read from.
    pub files: Vec<String>,
    /// How a label is found in them.
    pub rule: String,
    /// Other sources found beside them that state labels of some of the same images, each of
    /// which agreed with every label it states (validation images: the devkit, Kaggle's CSV).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checked: Vec<String>,
}

impl LabelSource {
    /// Labels read from `files` by `rule`, checked against nothing else.
    pub(crate) fn new(files: Vec<String>, rule: impl Into<String>) -> LabelSource {
        LabelSource {
            files,
            rule: rule.into(),
            checked: Vec::new(),
        }
    }

    /// Records that the labels agree with every one the `checked` files state.
    pub(crate) fn add_checks(&mut self, checked: Vec<String>) {
        if !checked.is_empty() {
            self.rule += "; checked against every label the other files state";
            self.checked.extend(checked);
        }
    }
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
    /// Archive files referenced by [`Loc::Archive`], [`Loc::Gzip`], [`Loc::Zip`] and
    /// [`Loc::TfRecord`].
    pub archives: Vec<PathBuf>,
    /// The readers of the gzip-compressed archives.
    pub(crate) gzip: Readers,
    /// Parquet files referenced by [`Loc::Parquet`].
    pub parquet: Vec<ParquetFile>,
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
    /// group's rows in one pass over its pages, a gzip-compressed tar's members in one pass
    /// over its stream.
    pub fn read_run(&self, run: &[&Item]) -> Vec<std::io::Result<Vec<u8>>> {
        match run {
            [first, ..] if run.len() > 1 => match first.loc {
                Loc::Gzip { archive, .. } => {
                    let at: Vec<(u64, u64)> = run
                        .iter()
                        .map(|it| match it.loc {
                            Loc::Gzip { offset, .. } => (offset, it.size),
                            _ => unreachable!("a run is one archive's members"),
                        })
                        .collect();
                    // An input above the limit is not read: the stream skips over it.
                    let path = &self.archives[archive as usize];
                    let within: Vec<(u64, u64)> = at
                        .iter()
                        .copied()
                        .filter(|&(_, size)| within_limit(size).is_ok())
                        .collect();
                    let mut read = self.gzip.read(archive, path, &within).into_iter();
                    at.iter()
                        .map(|&(_, size)| {
                            within_limit(size)?;
                            read.next().expect("a read of each input within the limit")
                        })
                        .collect()
                }
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
        within_limit(item.size)?;
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
            Loc::Zip {
                archive,
                crc32,
                offset,
                deflated,
            } => read_zip_member(
                &self.archives[archive as usize],
                offset,
                item.size,
                deflated,
            )
            .and_then(|bytes| match crc32fast::hash(&bytes) == crc32 {
                true => Ok(bytes),
                false => Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "its bytes do not match the zip's CRC-32: a damaged member",
                )),
            }),
            Loc::Gzip { archive, offset } => {
                let path = &self.archives[archive as usize];
                let mut read = self.gzip.read(archive, path, &[(offset, item.size)]);
                read.pop().expect("one read")
            }
            Loc::TfRecord {
                archive,
                offset,
                len,
            } => super::tfrecord_file::read_image(&self.archives[archive as usize], offset, len),
            Loc::Parquet { file, group, row } => self.parquet[file as usize].read(group, row),
        }
    }
}

/// The `size` bytes of the zip member whose data starts at `offset` of `zip`, inflated when
/// `deflated`.
fn read_zip_member(zip: &Path, offset: u64, size: u64, deflated: bool) -> std::io::Result<Vec<u8>> {
    let f = File::open(zip)?;
    let mut buf = vec![0u8; size as usize];
    match deflated {
        false => f.read_exact_at(&mut buf, offset)?,
        true => {
            let mut f = std::io::BufReader::with_capacity(1 << 16, f);
            f.seek(std::io::SeekFrom::Start(offset))?;
            flate2::read::DeflateDecoder::new(f).read_exact(&mut buf)?;
        }
    }
    Ok(buf)
}

/// Refuses to read an input of `size` bytes above [`MAX_INPUT_BYTES`].
fn within_limit(size: u64) -> std::io::Result<()> {
    match size > MAX_INPUT_BYTES {
        true => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{size} bytes is larger than the {MAX_INPUT_BYTES}-byte input limit"),
        )),
        false => Ok(()),
    }
}

/// Whether a split of `items` is found ordered, and read, by the inputs' place in their files
/// rather than by (label, name): parquet rows, whose images are compressed together a page at a
/// time, so that each page is read once for all of its rows (see `shards.rs`), and the members
/// of gzip-compressed tars, which can only be read in their order.
pub fn read_in_place_order(items: &[Item]) -> bool {
    items
        .iter()
        .any(|it| matches!(it.loc, Loc::Parquet { .. } | Loc::Gzip { .. }))
}

/// An input's place in its sources, the order of a split [`read_in_place_order`]: its location,
/// the name breaking ties (the files of one directory).
pub fn place(item: &Item) -> (&Loc, &str) {
    (&item.loc, &item.name)
}

/// Whether any of `items` is in a gzip-compressed tar, whose members can only be read in their
/// order.
pub fn sequential_only(items: &[Item]) -> bool {
    items.iter().any(|it| matches!(it.loc, Loc::Gzip { .. }))
}

/// Sorts `items` by (label, name); the size and the location break ties, so that the order
/// never depends on the scan's.
pub fn sort_by_label(items: &mut [Item]) {
    items.sort_unstable_by(|a, b| {
        (a.label, &a.name, a.size, &a.loc).cmp(&(b.label, &b.name, b.size, &b.loc))
    });
}

/// Whether `a` and `b` are read in one go ([`Inputs::read_run`]): rows of one parquet row group,
/// members of one gzip-compressed tar.
pub fn read_together(a: &Item, b: &Item) -> bool {
    match (&a.loc, &b.loc) {
        (Loc::Gzip { archive, .. }, Loc::Gzip { archive: other, .. }) => archive == other,
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
pub(super) fn show(
    dirs: &[PathBuf],
    archives: &[PathBuf],
    parquet: &[ParquetFile],
    item: &Item,
) -> String {
    match item.loc {
        Loc::Dir(d) | Loc::NonUtf8Name(d) => {
            dirs[d as usize].join(&item.name).display().to_string()
        }
        Loc::Archive { archive, .. }
        | Loc::Gzip { archive, .. }
        | Loc::Zip { archive, .. }
        | Loc::TfRecord { archive, .. } => {
            format!("{}:{}", archives[archive as usize].display(), item.name)
        }
        Loc::Parquet { file, group, row } => {
            parquet[file as usize].describe(group, row, &item.name)
        }
    }
}

/// `e` for a read of `path`, saying where the link pointed when `path` is a symbolic link
/// (dangling, or a loop).
pub(super) fn name_link(path: &Path, e: std::io::Error) -> std::io::Error {
    match std::fs::read_link(path) {
        Ok(target) => std::io::Error::new(
            e.kind(),
            format!("symbolic link to {}: {e}", target.display()),
        ),
        Err(_) => e,
    }
}
