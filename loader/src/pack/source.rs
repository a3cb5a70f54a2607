//! Finding the packer's inputs: ImageNet-1k folder trees, flat validation folders labelled by
//! `LOC_val_solution.csv` or the devkit ground truth, and ImageNet-22k per-synset tars (on disk
//! or nested in an outer `fall11_whole.tar` / `winter21_whole.tar`, which may also be given as
//! the input itself).
//!
//! Tars are indexed with the tar crate (headers only, seeking over member data); members are
//! later read with positioned reads at the recorded offsets, so nested tars are never unpacked
//! and each member can be read independently.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use super::classes;
use super::options::{OptionError, PackOption};
use crate::error::{LoaderError, Result};

/// File name extensions (lower case) taken as images; other files are counted as ignored.
pub const IMAGE_EXTENSIONS: &[&str] = &["jpeg", "jpg", "png", "bmp", "gif", "webp", "tif", "tiff"];

/// Largest input file read, in bytes (guards memory against a damaged tar header).
pub const MAX_INPUT_BYTES: u64 = 1 << 30;

/// Where an input's bytes live.
#[derive(Clone, Debug, PartialEq, Eq)]
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
}

/// One input image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    /// Class label.
    pub label: u32,
    /// File name (for a directory input) or path inside the archive (for a tar member); the
    /// sort key within a class.
    pub name: String,
    /// Size of the input in bytes.
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
    /// ILSVRC id k, optionally followed by text.
    pub synsets: Option<PathBuf>,
    /// Drop classes with fewer usable inputs than this (0 keeps all; see `classes.rs`).
    pub min_per_class: u64,
    /// Keep classes without usable training inputs as classes without records (see
    /// `classes.rs`).
    pub keep_empty_classes: bool,
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
    /// How each split was found (for the report).
    pub layouts: BTreeMap<String, String>,
    /// Inputs of classes left out by the class list, by wnid.
    pub ignored_classes: BTreeMap<String, u64>,
    /// Classes dropped by the minimum per class, with their usable input counts.
    pub dropped_classes: BTreeMap<String, u64>,
    /// Files that are not images by their extension (and validation images without a label),
    /// with the reason.
    pub ignored_files: Vec<(String, String)>,
}

impl Inputs {
    /// Human-readable location of `item` for reports ("DIR/NAME" or "ARCHIVE:MEMBER").
    pub fn display(&self, item: &Item) -> String {
        match item.loc {
            Loc::Dir(d) | Loc::NonUtf8Name(d) => {
                self.dirs[d as usize].join(&item.name).display().to_string()
            }
            Loc::Archive { archive, .. } => {
                format!(
                    "{}:{}",
                    self.archives[archive as usize].display(),
                    item.name
                )
            }
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
        }
    }
}

/// `e` for a read of `path`, saying where the link pointed when `path` is a symbolic link
/// (dangling, or a loop).
fn name_link(path: &Path, e: std::io::Error) -> std::io::Error {
    match std::fs::read_link(path) {
        Ok(target) => std::io::Error::new(
            e.kind(),
            format!("symbolic link to {}: {e}", target.display()),
        ),
        Err(_) => e,
    }
}

/// An input found while scanning, before labels are known: its `label` is the index of its
/// wnid in [`Scan::wnids`] (one string per class rather than one per input, so that the index
/// of 14 M inputs costs one [`Item`] each).
type Found = Item;

#[derive(Default)]
struct Scan {
    dirs: Vec<PathBuf>,
    archives: Vec<PathBuf>,
    ignored_files: Vec<(String, String)>,
    /// Every wnid seen, by scan index.
    wnids: Vec<String>,
    /// Scan index of each wnid.
    wnid_ids: HashMap<String, u32>,
    /// Wnids registered by the training split's scan (it runs first, so they are
    /// `wnids[..train_classes]`): its class folders and tars, empty ones included.
    train_classes: usize,
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
}

fn is_image_name(name: &str) -> bool {
    Path::new(name)
        .extension()
        .and_then(|e| e.to_str())
        .map(|e| IMAGE_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()))
        .unwrap_or(false)
}

fn input_err(path: &Path, reason: impl Into<String>) -> LoaderError {
    LoaderError::Input {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// What a directory entry is, following symbolic links.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// A directory.
    Dir,
    /// Anything else that `stat` accepts, with its size.
    File(u64),
    /// `stat` failed (a dangling symbolic link, a link loop, no permission): the error.
    Broken(String),
}

/// One entry of an input directory.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    /// The name, lossily decoded when it is not UTF-8.
    name: String,
    /// Whether the name is valid UTF-8 (only then can the packer open it by `name`).
    utf8: bool,
    kind: Kind,
}

impl Entry {
    fn is_dir(&self) -> bool {
        self.kind == Kind::Dir
    }
}

/// Entries of `dir` sorted by name, hidden entries skipped. Entries that cannot be examined
/// are listed, not fatal: each caller decides (an input file is skipped and reported, a class
/// folder that cannot be examined stops the pack).
fn list_dir(dir: &Path) -> Result<Vec<Entry>> {
    let rd = std::fs::read_dir(dir).map_err(|e| LoaderError::io("read directory", dir, e))?;
    let mut out = Vec::new();
    for e in rd {
        let e = e.map_err(|e| LoaderError::io("read directory", dir, e))?;
        let os_name = e.file_name();
        let name = os_name.to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        // Follow symlinks: a tree of links into another tree is a common layout.
        let kind = match std::fs::metadata(e.path()) {
            Ok(md) if md.is_dir() => Kind::Dir,
            Ok(md) => Kind::File(md.len()),
            Err(err) => Kind::Broken(name_link(&e.path(), err).to_string()),
        };
        out.push(Entry {
            name,
            utf8: os_name.to_str().is_some(),
            kind,
        });
    }
    out.sort();
    Ok(out)
}

/// The class folders among `entries` of `root`; an entry that may be one but cannot be used
/// (not examinable, or a folder whose name is not UTF-8) is an error naming it, since leaving
/// a class out would shift every later label. A regular file among them is listed in the
/// report's ignored files.
fn class_folders(root: &Path, entries: &[Entry], scan: &mut Scan) -> Result<Vec<String>> {
    let mut classes = Vec::new();
    for e in entries {
        match &e.kind {
            Kind::Broken(err) => {
                return Err(input_err(
                    &root.join(&e.name),
                    format!("cannot tell whether it is a class folder ({err}); fix or remove it"),
                ))
            }
            Kind::Dir if !e.utf8 => {
                return Err(input_err(
                    &root.join(&e.name),
                    "class folder name is not valid UTF-8 (shown with U+FFFD); rename it",
                ))
            }
            Kind::Dir => classes.push(e.name.clone()),
            Kind::File(_) => scan.ignored_files.push((
                root.join(&e.name).display().to_string(),
                "a file among the class folders, not a class".into(),
            )),
        }
    }
    Ok(classes)
}

/// The input an image-named file entry of `dir` (index `dir` in `Scan::dirs`) becomes: an
/// entry that cannot be examined has size 0 and fails when read, a non-UTF-8 name cannot be
/// opened; both are then skipped and reported with the reason.
fn file_input(e: &Entry, dir: u32) -> (u64, Loc) {
    let size = match e.kind {
        Kind::File(n) => n,
        _ => 0,
    };
    let loc = if e.utf8 {
        Loc::Dir(dir)
    } else {
        Loc::NonUtf8Name(dir)
    };
    (size, loc)
}

/// Scans a folder tree `root/<wnid>/*` (one directory per class).
fn scan_tree(root: &Path, scan: &mut Scan) -> Result<Vec<Found>> {
    let classes = class_folders(root, &list_dir(root)?, scan)?;
    let listed: Vec<Result<Vec<Entry>>> = classes
        .par_iter()
        .map(|c| list_dir(&root.join(c)))
        .collect();
    let mut found = Vec::new();
    for (wnid, files) in classes.into_iter().zip(listed) {
        let dir = scan.dirs.len() as u32;
        scan.dirs.push(root.join(&wnid));
        let class = scan.wnid_id(&wnid);
        for e in files? {
            if e.is_dir() {
                continue;
            }
            if !is_image_name(&e.name) {
                scan.ignored_files.push((
                    root.join(&wnid).join(&e.name).display().to_string(),
                    "not an image file name".into(),
                ));
                continue;
            }
            let (size, loc) = file_input(&e, dir);
            found.push(Found {
                label: class,
                name: e.name,
                size,
                loc,
            });
        }
    }
    Ok(found)
}

/// A window `[base, base + len)` of a file, readable and seekable (for the tar crate).
struct Region<'a> {
    file: &'a File,
    base: u64,
    len: u64,
    pos: u64,
}

impl Read for Region<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.len.saturating_sub(self.pos);
        let n = (buf.len() as u64).min(left) as usize;
        if n == 0 {
            return Ok(0);
        }
        let got = self.file.read_at(&mut buf[..n], self.base + self.pos)?;
        self.pos += got as u64;
        Ok(got)
    }
}

impl Seek for Region<'_> {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        let new = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
            SeekFrom::End(d) => self.len.checked_add_signed(d),
        };
        self.pos = new.ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "seek before start")
        })?;
        Ok(self.pos)
    }
}

/// One regular-file member of a tar: (path inside the tar, absolute data offset, size).
type Member = (String, u64, u64);

/// Lists the regular-file members of the tar stored at `[base, base + len)` of `file`.
fn tar_members(file: &File, base: u64, len: u64, what: &Path) -> Result<Vec<Member>> {
    let mut magic = [0u8; 2];
    if len >= 2 && file.read_exact_at(&mut magic, base).is_ok() && magic == [0x1f, 0x8b] {
        return Err(input_err(
            what,
            "is gzip-compressed; ddl-pack reads uncompressed tars (gunzip it first)",
        ));
    }
    let region = Region {
        file,
        base,
        len,
        pos: 0,
    };
    let bad = |e: std::io::Error| input_err(what, format!("unreadable tar: {e}"));
    let mut archive = tar::Archive::new(region);
    let mut out = Vec::new();
    for entry in archive.entries_with_seek().map_err(bad)? {
        let entry = entry.map_err(bad)?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        out.push((name, base + entry.raw_file_position(), entry.size()));
    }
    Ok(out)
}

fn wnid_of_tar(name: &str) -> Option<&str> {
    let file = name.rsplit('/').next()?;
    file.strip_suffix(".tar")
}

/// Adds the image members of one per-synset tar (`archive` already registered in `scan`).
fn add_synset_members(
    found: &mut Vec<Found>,
    scan: &mut Scan,
    wnid: &str,
    archive: u32,
    prefix: &str,
    members: Vec<Member>,
) {
    let class = scan.wnid_id(wnid);
    for (name, offset, size) in members {
        let full = format!("{prefix}{name}");
        if !is_image_name(&name) {
            let at = format!("{}:{full}", scan.archives[archive as usize].display());
            scan.ignored_files
                .push((at, "not an image file name".into()));
            continue;
        }
        found.push(Found {
            label: class,
            name: full,
            size,
            loc: Loc::Archive { archive, offset },
        });
    }
}

/// Scans the `*.tar` files of `dir`: per-synset tars (`<wnid>.tar`, images inside) and outer
/// tars whose members are per-synset tars.
fn scan_tars(dir: &Path, tars: &[String], scan: &mut Scan) -> Result<Vec<Found>> {
    let mut found = Vec::new();
    for t in tars {
        let path = dir.join(t);
        let file = File::open(&path).map_err(|e| LoaderError::io("open", &path, e))?;
        let len = file
            .metadata()
            .map_err(|e| LoaderError::io("stat", &path, e))?
            .len();
        let members = tar_members(&file, 0, len, &path)?;
        let archive = scan.archives.len() as u32;
        scan.archives.push(path.clone());
        let inner_tars = members.iter().filter(|m| m.0.ends_with(".tar")).count();
        if inner_tars > 0 {
            // An outer tar of per-synset tars (fall11_whole.tar, winter21_whole.tar).
            for (name, offset, size) in members {
                let Some(wnid) = wnid_of_tar(&name) else {
                    scan.ignored_files.push((
                        format!("{}:{name}", path.display()),
                        "not a per-synset tar inside an outer tar".into(),
                    ));
                    continue;
                };
                let inner_path = PathBuf::from(format!("{}:{name}", path.display()));
                let inner = tar_members(&file, offset, size, &inner_path)?;
                add_synset_members(&mut found, scan, wnid, archive, &format!("{name}/"), inner);
            }
        } else {
            let wnid = wnid_of_tar(t).expect("listed as *.tar");
            add_synset_members(&mut found, scan, wnid, archive, "", members);
        }
    }
    Ok(found)
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

/// Labels for flat validation files by image id (file stem), from `LOC_val_solution.csv`.
fn read_loc_csv(path: &Path) -> Result<HashMap<String, String>> {
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
        out.insert(id.trim().to_string(), wnid.to_string());
    }
    Ok(out)
}

/// Labels from the devkit ground truth: line k holds the 1-based ILSVRC id of validation image
/// k, mapped to a wnid through the synset list.
fn read_devkit(path: &Path, synsets: &Path) -> Result<HashMap<u64, String>> {
    let ids = read_wnid_list(synsets)?;
    let text = std::fs::read_to_string(path).map_err(|e| LoaderError::io("read", path, e))?;
    let mut out = HashMap::new();
    for (n, line) in text.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        let id: usize = line.trim().parse().map_err(|_| {
            input_err(
                path,
                format!("line {}: {:?} is not an ILSVRC id", n + 1, line.trim()),
            )
        })?;
        let wnid = id.checked_sub(1).and_then(|i| ids.get(i)).ok_or_else(|| {
            input_err(
                path,
                format!(
                    "line {}: ILSVRC id {id} is not in {} ({} synsets)",
                    n + 1,
                    synsets.display(),
                    ids.len()
                ),
            )
        })?;
        out.insert(n as u64 + 1, wnid.clone());
    }
    Ok(out)
}

/// Trailing decimal number of a file stem ("ILSVRC2012_val_00000042" -> 42).
fn trailing_number(stem: &str) -> Option<u64> {
    let digits = stem.len() - stem.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    stem[stem.len() - digits..].parse().ok()
}

/// How the images of a flat validation folder are labelled.
enum ValLabels {
    /// `LOC_val_solution.csv`: image id -> wnid.
    Csv(HashMap<String, String>),
    /// The devkit ground truth read through the synset list: image number -> wnid.
    Devkit(HashMap<u64, String>),
}

impl ValLabels {
    /// The wnid of the validation image with file stem `stem`, if labelled.
    fn wnid(&self, stem: &str) -> Option<String> {
        match self {
            ValLabels::Csv(m) => m.get(stem).cloned(),
            ValLabels::Devkit(m) => trailing_number(stem).and_then(|k| m.get(&k).cloned()),
        }
    }
}

/// Finds and reads the labels of the flat validation folder `val`, with the layout in words.
fn val_labels(input: &Path, val: &Path, opts: &SourceOptions) -> Result<(ValLabels, String)> {
    // Where label files may sit: val/, the input root, and up to three levels above it (the
    // Kaggle layout keeps LOC_val_solution.csv next to ILSVRC/ while the images are in
    // ILSVRC/Data/CLS-LOC/{train,val}).
    let mut places = vec![val.to_path_buf(), input.to_path_buf()];
    places.extend(input.canonicalize().ok().iter().flat_map(|c| {
        c.ancestors()
            .skip(1)
            .take(3)
            .map(Path::to_path_buf)
            .collect::<Vec<_>>()
    }));
    let find = |name: &str| {
        places
            .iter()
            .map(|d| d.join(name))
            .chain([input.join("ILSVRC2012_devkit_t12").join("data").join(name)])
            .find(|p| p.is_file())
    };
    if let Some(csv) = find("LOC_val_solution.csv") {
        let layout = format!(
            "flat folder {} labelled by {}",
            val.display(),
            csv.display()
        );
        return Ok((ValLabels::Csv(read_loc_csv(&csv)?), layout));
    }
    let Some(dk) = find("ILSVRC2012_validation_ground_truth.txt") else {
        return Err(input_err(
            val,
            "holds image files but no class folders, and neither LOC_val_solution.csv nor \
             ILSVRC2012_validation_ground_truth.txt was found in it, in the input directory \
             or up to three levels above it",
        ));
    };
    let Some(synsets) = &opts.synsets else {
        return Err(LoaderError::Option {
            path: dk,
            source: OptionError {
                option: PackOption::Synsets,
                value: None,
                problem: "is needed: the devkit ground truth holds ILSVRC ids; give the ILSVRC \
                          synset list (FILE: one wnid per line in ILSVRC id order) to map them \
                          to wnids"
                    .into(),
            },
        });
    };
    let layout = format!(
        "flat folder {} labelled by {} via {}",
        val.display(),
        dk.display(),
        synsets.display()
    );
    Ok((ValLabels::Devkit(read_devkit(&dk, synsets)?), layout))
}

/// Scans a flat validation folder, labelling files from the CSV or the devkit file.
fn scan_flat_val(
    input: &Path,
    val: &Path,
    files: Vec<Entry>,
    opts: &SourceOptions,
    scan: &mut Scan,
) -> Result<(Vec<Found>, String)> {
    let (labels, layout) = val_labels(input, val, opts)?;
    let dir = scan.dirs.len() as u32;
    scan.dirs.push(val.to_path_buf());
    let mut found = Vec::new();
    for e in files {
        if e.is_dir() {
            continue;
        }
        let shown = val.join(&e.name).display().to_string();
        if !is_image_name(&e.name) {
            scan.ignored_files
                .push((shown, "not an image file name".into()));
            continue;
        }
        let stem = Path::new(&e.name)
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or(&e.name);
        let Some(wnid) = labels.wnid(stem) else {
            scan.ignored_files
                .push((shown, "no label for this validation image".into()));
            continue;
        };
        let (size, loc) = file_input(&e, dir);
        found.push(Found {
            label: scan.wnid_id(&wnid),
            name: e.name,
            size,
            loc,
        });
    }
    Ok((found, layout))
}

/// Scans a directory that is either a class-folder tree or a folder of tars.
fn scan_split_dir(dir: &Path, scan: &mut Scan) -> Result<Option<(Vec<Found>, String)>> {
    let entries = list_dir(dir)?;
    let mut tars = Vec::new();
    for e in entries
        .iter()
        .filter(|e| !e.is_dir() && e.name.ends_with(".tar"))
    {
        // A per-synset tar is a whole class: one that cannot be opened stops the pack.
        let why = match &e.kind {
            Kind::Broken(err) => Some(format!("cannot be opened ({err}); fix or remove it")),
            _ if !e.utf8 => {
                Some("tar name is not valid UTF-8 (shown with U+FFFD); rename it".into())
            }
            _ => None,
        };
        if let Some(why) = why {
            return Err(input_err(&dir.join(&e.name), why));
        }
        tars.push(e.name.clone());
    }
    if !tars.is_empty() {
        let f = scan_tars(dir, &tars, scan)?;
        return Ok(Some((
            f,
            format!("{} tars in {}", tars.len(), dir.display()),
        )));
    }
    if entries.iter().any(Entry::is_dir) {
        let f = scan_tree(dir, scan)?;
        return Ok(Some((f, format!("class folders in {}", dir.display()))));
    }
    Ok(None)
}

/// Scans `input` when it is a file: a per-synset tar or an outer tar of them.
fn scan_tar_file(input: &Path, scan: &mut Scan) -> Result<(Vec<Found>, String)> {
    let name = input
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| n.ends_with(".tar"))
        .ok_or_else(|| {
            input_err(
                input,
                "is neither a directory nor a .tar file (an outer tar such as \
                 fall11_whole.tar, or one <wnid>.tar)",
            )
        })?;
    let dir = input.parent().unwrap_or(Path::new(""));
    let f = scan_tars(dir, &[name.to_string()], scan)?;
    Ok((f, format!("tar file {}", input.display())))
}

/// Scans an input directory: `train/` and `val/`, or the directory itself as the training set.
fn scan_input_dir(
    input: &Path,
    opts: &SourceOptions,
    scan: &mut Scan,
    found: &mut BTreeMap<String, Vec<Found>>,
    layouts: &mut BTreeMap<String, String>,
) -> Result<()> {
    let train = input.join("train");
    let val = input.join("val");
    if train.is_dir() {
        if let Some((f, l)) = scan_split_dir(&train, scan)? {
            found.insert("train".into(), f);
            layouts.insert("train".into(), l);
        }
    } else if !val.is_dir() {
        // No train/ or val/: the input itself is the training set (class folders or tars).
        if let Some((f, l)) = scan_split_dir(input, scan)? {
            found.insert("train".into(), f);
            layouts.insert("train".into(), l);
        }
    }
    scan.train_classes = scan.wnids.len();
    if val.is_dir() {
        let entries = list_dir(&val)?;
        if entries.iter().any(Entry::is_dir) {
            found.insert("val".into(), scan_tree(&val, scan)?);
            layouts.insert("val".into(), format!("class folders in {}", val.display()));
        } else if !entries.is_empty() {
            let (f, l) = scan_flat_val(input, &val, entries, opts, scan)?;
            found.insert("val".into(), f);
            layouts.insert("val".into(), l);
        }
    }
    Ok(())
}

/// Usable inputs per class in the split the classes come from: the training split, where
/// every class folder or tar counts (0 for an empty one), and so does a class with images
/// only in val (0); or, for an input with val alone, the classes with val images.
fn usable_counts(found: &BTreeMap<String, Vec<Found>>, scan: &Scan) -> BTreeMap<String, u64> {
    let train = found.get("train").filter(|f| !f.is_empty());
    let from = train
        .or_else(|| found.get("val"))
        .expect("some split has images");
    let mut per_id = vec![0u64; scan.wnids.len()];
    for f in from {
        per_id[f.label as usize] += 1;
    }
    let mut class = vec![false; scan.wnids.len()];
    if train.is_some() {
        class[..scan.train_classes].fill(true);
        for f in found.get("val").into_iter().flatten() {
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
    let mut found: BTreeMap<String, Vec<Found>> = BTreeMap::new();
    let mut layouts = BTreeMap::new();
    if input.is_dir() {
        scan_input_dir(input, opts, &mut scan, &mut found, &mut layouts)?;
    } else if input.exists() {
        let (f, l) = scan_tar_file(input, &mut scan)?;
        found.insert("train".into(), f);
        layouts.insert("train".into(), l);
        scan.train_classes = scan.wnids.len();
    } else {
        return Err(input_err(input, "does not exist"));
    }
    if found.values().all(|f| f.is_empty()) {
        return Err(input_err(
            input,
            "no images found: expected train/<wnid>/*.JPEG (and val/), <wnid>.tar files, or an \
             outer tar of <wnid>.tar files",
        ));
    }
    let listed = match &opts.classes {
        Some(path) => {
            let list = read_wnid_list(path)?;
            classes::check_list(path, &list)?;
            Some(list)
        }
        None => None,
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
    for (split, mut items) in found {
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
        items.sort_unstable_by(|a, b| (a.label, &a.name, a.size).cmp(&(b.label, &b.name, b.size)));
        if !items.is_empty() {
            splits.insert(split, items);
        }
    }
    Ok(Inputs {
        classes: selection.classes,
        splits,
        dirs: scan.dirs,
        archives: scan.archives,
        layouts,
        ignored_classes,
        dropped_classes: selection.dropped,
        ignored_files: scan.ignored_files,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_names() {
        assert_eq!(trailing_number("ILSVRC2012_val_00000042"), Some(42));
        assert_eq!(trailing_number("abc"), None);
        assert!(is_image_name("a.JPEG") && is_image_name("b.png") && !is_image_name("c.txt"));
        assert_eq!(wnid_of_tar("x/n01440764.tar"), Some("n01440764"));
    }
}
