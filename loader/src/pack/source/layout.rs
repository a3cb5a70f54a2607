//! What an input holds, and which scanner reads each split. A directory may hold any mix of
//! ImageNet's downloads and their extracted forms:
//!
//! | split | read from, first found wins |
//! |---|---|
//! | train | `train/` (class folders, or per-synset tars, or an outer tar of them, or images named by their wnid); tars in the input: outer tars (`ILSVRC2012_img_train.tar`, `winter21_whole.tar.gz`) and `<wnid>.tar` per-synset tars, or Hugging Face's tars of images named by their wnid (`named.rs`); the input's own class folders. Class folders beside tars (an extraction that stopped part way) are read with them, a class a tar holds from the tar |
//! | val | `val/` (class folders, or flat images labelled as `val.rs` says or by the wnid ending their names, never both; each checked against the devkit and Kaggle's CSV found beside them); ImageNet's flat val tars (`ILSVRC2012_img_val.tar`) or Hugging Face's `val_images.tar.gz` in the input, labelled the same way |
//!
//! Any tar may be gzip-compressed (`.tar.gz`, `.tgz`: `gzip.rs`); Hugging Face's tars are found
//! in the input's `data/` as its download leaves them. Kaggle's zip, given as the input, is a
//! layout of its own (`zipped.rs`).
//!
//! A form that loses to another is listed as not read, never merged (the same images twice);
//! ImageNet's test images (no labels exist) and the task-3 train subset beside the full train
//! tar are listed as not packed. Hugging Face's parquet layout (`parquet.rs`), WebDataset
//! shards (`wds.rs`) and TFRecord files (`tfrecord.rs`) are layouts of their own. Kaggle's
//! download is read from its `ILSVRC/Data/CLS-LOC/`. A tar that holds images but states no
//! label for them is refused, never packed as a class named after the tar.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::devkit::is_devkit_name;
use super::inputs::{LabelSource, SourceOptions};
use super::listing::{
    class_folders, flat_images, input_err, is_image_name, is_wnid, list_dir, Entry, Kind,
};
use super::scan::{Found, Scan, SplitFound};
use super::tars::{is_tar_name, scan_outer, scan_synset, Claims, Tar, TarKind};
use super::tree::{scan_classes, scan_tree};
use super::val::{check_folders, find_labels, label_flat};
use super::{named, parquet, tar_tree, tfrecord, wds, zipped};
use crate::error::Result;

/// The refusal of an input in which nothing was found.
pub(super) const NOTHING_FOUND: &str = "no images found: expected train/<wnid>/*.JPEG (and \
    val/), ImageNet's ILSVRC2012_img_train.tar / ILSVRC2012_img_val.tar with the devkit, \
    <wnid>.tar files or an outer tar of them (winter21_whole.tar.gz), Hugging Face's \
    data/*.parquet or data/*.tar.gz, WebDataset shards, or TFRecord files (Kaggle's .zip is \
    given as the input itself)";

/// How a class of a folder tree or a tar is labelled, in words.
const BY_NAME: &str = "label: the position of the class's wnid in manifest.json's classes";

/// Scans `input` (a directory or a tar file), returning every split found.
pub(super) fn scan(
    input: &Path,
    opts: &SourceOptions,
    scan: &mut Scan,
) -> Result<BTreeMap<String, SplitFound>> {
    if input.is_dir() {
        let input = &hugging_face_snapshot(input)?;
        let kaggle = input.join("ILSVRC").join("Data").join("CLS-LOC");
        let root = if kaggle.is_dir() { &kaggle } else { input };
        if let Some(found) = parquet::scan_dir(root, scan)? {
            return Ok(found);
        }
        if let Some(found) = tfrecord::scan_dir(root, opts, scan)? {
            return Ok(found);
        }
        let data = input.join("data");
        if holds_tars(&data)? && !holds_tars(root)? && !root.join("train").is_dir() {
            // Hugging Face's imagenet-1k before its parquet conversion: data/*.tar.gz.
            return scan_dir(&data, opts, scan);
        }
        return scan_dir(root, opts, scan);
    }
    if !input.exists() {
        return Err(input_err(input, "does not exist"));
    }
    if input.to_string_lossy().ends_with(".zip") {
        return zipped::scan(input, scan);
    }
    if !is_tar_name(&input.to_string_lossy()) {
        return Err(input_err(
            input,
            "is neither a directory, a tar (.tar, .tar.gz, .tgz: an outer tar such as \
             winter21_whole.tar.gz, one <wnid>.tar, or a WebDataset shard) nor Kaggle's .zip",
        ));
    }
    let tar = Tar::open(input, scan.progress)?;
    let mut found = BTreeMap::new();
    match tar.kind() {
        TarKind::WebDataset => return wds::scan(vec![tar], opts, scan),
        TarKind::Outer | TarKind::Synset => {
            found.insert("train".into(), train_tars(vec![tar], None, scan)?);
        }
        TarKind::NamedTrain => {
            found.insert("train".into(), named::train(vec![tar], scan)?);
        }
        TarKind::Unlabelled => match tar_tree::depth(&tar) {
            Some(depth) => return tar_tree::scan(tar, depth, scan),
            None => return Err(refusal(&tar, TarKind::Unlabelled)),
        },
        kind => return Err(refusal(&tar, kind)),
    }
    scan.train_classes = scan.wnids.len();
    Ok(found)
}

/// The folder to read for the directory `input`: itself, or, when it is a Hugging Face cache
/// folder as `huggingface-cli download` leaves one without `--local-dir`
/// (`datasets--ILSVRC--imagenet-1k/`: `blobs/`, `refs/`, `snapshots/REVISION/` of links into
/// `blobs/`), its one snapshot.
fn hugging_face_snapshot(input: &Path) -> Result<PathBuf> {
    let snapshots = input.join("snapshots");
    if !snapshots.is_dir() || !input.join("blobs").is_dir() {
        return Ok(input.to_path_buf());
    }
    let revisions: Vec<String> = list_dir(&snapshots)?
        .into_iter()
        .filter(Entry::is_dir)
        .map(|e| e.name)
        .collect();
    match revisions.as_slice() {
        [one] => Ok(snapshots.join(one)),
        _ => Err(input_err(
            input,
            format!(
                "is a Hugging Face cache folder holding {} revisions in snapshots/ ({}): give \
                 the folder of one, snapshots/REVISION/",
                revisions.len(),
                revisions.join(", ")
            ),
        )),
    }
}

/// Whether `dir` is a directory that holds a tar.
fn holds_tars(dir: &Path) -> Result<bool> {
    Ok(dir.is_dir()
        && list_dir(dir)?
            .iter()
            .any(|e| !e.is_dir() && is_tar_name(&e.name) && !is_devkit_name(&e.name)))
}

/// The refusal of a tar that cannot be packed on its own.
fn refusal(tar: &Tar, kind: TarKind) -> crate::error::LoaderError {
    let why = match kind {
        TarKind::Val => "holds ImageNet's validation images, whose labels are in the devkit: \
                         pack the folder that holds it and ILSVRC2012_devkit_t12.tar.gz"
            .to_string(),
        TarKind::NamedVal => "holds validation images: pack the folder that holds it and the \
                              training tars"
            .to_string(),
        TarKind::Test => "holds ImageNet's test images, for which no labels exist".into(),
        TarKind::Empty => "holds no images".into(),
        _ => "holds images but states no label for them: it is not a per-synset tar (its name \
              is not a WordNet id like n01440764.tar), an outer tar of them, ImageNet's \
              validation tar, a tar of class folders (two or more, every image at one depth, a \
              train or val split folder above them if any), nor a WebDataset shard (KEY.cls \
              beside KEY.jpg)"
            .into(),
    };
    input_err(&tar.path, why)
}

/// The entries of an input directory, sorted by role.
#[derive(Default)]
struct Roles {
    /// Indexed `.tar` files (devkit archives excluded).
    tars: Vec<Tar>,
    /// Folders other than train/, val/, test/ and the devkit's.
    folders: Vec<Entry>,
    /// Other files.
    files: Vec<Entry>,
}

/// Sorts the entries of `root` by role; a tar that cannot be examined is refused.
fn roles(root: &Path, scan: &Scan) -> Result<Roles> {
    let mut roles = Roles::default();
    let mut tar_paths = Vec::new();
    for e in list_dir(root)? {
        let path = root.join(&e.name);
        if ["train", "val", "test"].contains(&e.name.as_str()) || is_devkit_name(&e.name) {
            continue;
        }
        match &e.kind {
            Kind::Dir => roles.folders.push(e),
            Kind::Broken(err) if is_tar_name(&e.name) => {
                return Err(input_err(
                    &path,
                    format!("cannot be opened ({err}); fix or remove it"),
                ))
            }
            _ if is_tar_name(&e.name) => tar_paths.push(path),
            _ => roles.files.push(e),
        }
    }
    roles.tars = Tar::open_all(&tar_paths, scan.progress)?;
    Ok(roles)
}

/// Scans an input directory that is not a parquet dataset.
fn scan_dir(
    root: &Path,
    opts: &SourceOptions,
    scan: &mut Scan,
) -> Result<BTreeMap<String, SplitFound>> {
    let Roles {
        tars,
        folders,
        files,
    } = roles(root, scan)?;
    let mut by_kind: BTreeMap<TarKind, Vec<Tar>> = BTreeMap::new();
    let mut trees = Vec::new();
    for tar in tars {
        let kind = tar.kind();
        match kind {
            // ImageNet's bounding boxes (ILSVRC2012_bbox_train_v2.tar.gz) hold no images.
            TarKind::Empty if tar.gzip => {
                scan.ignore(
                    tar.path.display(),
                    "holds no images: not an input ddl-pack reads",
                );
                continue;
            }
            TarKind::Unlabelled | TarKind::Val if tar_tree::depth(&tar).is_some() => {
                trees.push(tar)
            }
            TarKind::Unlabelled | TarKind::Empty => return Err(refusal(&tar, kind)),
            TarKind::Test => {
                scan.ignore(
                    tar.path.display(),
                    "ImageNet's test images: no labels exist",
                );
                continue;
            }
            _ => by_kind.entry(kind).or_default().push(tar),
        }
    }
    if let Some(tree) = trees.first() {
        // Tars of class folders are read only on their own: one per split, as image-net.org's
        // face-blurred ImageNet is (train_blurred.tar.gz, val_blurred.tar.gz), the val folders
        // checked against a devkit or Kaggle's CSV beside them.
        let (train, val) = (root.join("train"), root.join("val"));
        if !by_kind.is_empty() || !folders.is_empty() || train.is_dir() || val.is_dir() {
            return Err(input_err(
                &tree.path,
                "holds class folders: give it as the input itself (ddl-pack THIS.tar ...), or \
                 put it in a folder holding only it and the tar of class folders of the other \
                 split",
            ));
        }
        for e in &files {
            scan.ignore(root.join(&e.name).display(), "not an input ddl-pack reads");
        }
        let mut found = tar_tree::scan_all(trees, scan)?;
        if let Some(val) = found.get_mut("val") {
            let checked = check_folders(&val.items, &find_labels(root, root, opts)?, scan)?;
            val.labels.add_checks(checked);
        }
        return Ok(found);
    }
    let mut take = |k: TarKind| by_kind.remove(&k).unwrap_or_default();
    let (wds_tars, val_tars) = (take(TarKind::WebDataset), take(TarKind::Val));
    let (named_train, named_val) = (take(TarKind::NamedTrain), take(TarKind::NamedVal));
    let mut train_tars = take(TarKind::Outer);
    train_tars.extend(take(TarKind::Synset));
    if let (Some(named), Some(other)) = (named_train.first(), train_tars.first()) {
        return Err(input_err(
            &named.path,
            format!(
                "holds training images named by their wnid, beside {}, which holds training \
                 images too: two forms of the training split; keep one of them",
                other.path.display()
            ),
        ));
    }
    if !wds_tars.is_empty() {
        let named = named_train.iter().chain(&named_val);
        if let Some(other) = train_tars.iter().chain(&val_tars).chain(named).next() {
            return Err(input_err(
                &other.path,
                "lies beside WebDataset shards: a folder holds one layout; move it out",
            ));
        }
        return wds::scan(wds_tars, opts, scan);
    }
    let mut found = BTreeMap::new();
    let (train, val, test) = (root.join("train"), root.join("val"), root.join("test"));
    // The input's own class folders are the training split only when nothing else is.
    let own_tree = !train.is_dir()
        && train_tars.is_empty()
        && named_train.is_empty()
        && !val.is_dir()
        && !folders.is_empty();
    // Beside training tars in the input, its folders named by wnids are class folders.
    let root_classes: Vec<String> = match train.is_dir() || train_tars.is_empty() {
        true => Vec::new(),
        false => folders
            .iter()
            .filter(|e| is_wnid(&e.name))
            .map(|e| e.name.clone())
            .collect(),
    };
    let train_split = if train.is_dir() {
        let tars = train_tars.iter().chain(&named_train);
        not_read(scan, tars.map(|t| &t.path), &train);
        scan_split_dir(&train, scan)?
    } else if !named_train.is_empty() {
        Some(named::train(named_train, scan)?)
    } else if !train_tars.is_empty() {
        let tars = leave_out_subset(train_tars, scan);
        let classes = Some((root, root_classes.clone()));
        Some(self::train_tars(tars, classes, scan)?)
    } else if own_tree {
        // The devkit and test/ are never classes (roles() left them out of `folders`).
        let entries: Vec<Entry> = list_dir(root)?
            .into_iter()
            .filter(|e| !e.is_dir() || folders.contains(e))
            .collect();
        let classes = class_folders(root, &entries, scan)?;
        Some(tree_split(scan_classes(root, classes, scan)?, root))
    } else {
        None
    };
    if !own_tree {
        let not_read = folders.iter().filter(|e| !root_classes.contains(&e.name));
        for e in not_read.chain(&files) {
            let why = match e.name.ends_with(".zip") {
                true => "a zip: ddl-pack reads Kaggle's ImageNet zip given as the input itself",
                false => "not an input ddl-pack reads",
            };
            scan.ignore(root.join(&e.name).display(), why);
        }
    }
    if let Some(s) = train_split {
        found.insert("train".to_string(), s);
    }
    scan.train_classes = scan.wnids.len();
    let val_split = if val.is_dir() {
        let tars = val_tars.iter().chain(&named_val);
        not_read(scan, tars.map(|t| &t.path), &val);
        scan_val_dir(root, &val, opts, scan)?
    } else if !val_tars.is_empty() {
        not_read(scan, named_val.iter().map(|t| &t.path), &val_tars[0].path);
        Some(scan_val_tars(root, val_tars, opts, scan)?)
    } else if !named_val.is_empty() {
        Some(named::val(root, named_val, opts, scan)?)
    } else {
        None
    };
    if let Some(s) = val_split {
        found.insert("val".to_string(), s);
    }
    if test.is_dir() {
        scan.ignore(test.display(), "test images: no labels exist; not packed");
    }
    Ok(found)
}

/// Lists `paths` as not read because `instead` is.
fn not_read<'a>(scan: &mut Scan, paths: impl Iterator<Item = &'a PathBuf>, instead: &Path) {
    for p in paths {
        scan.ignore(
            p.display(),
            format!("not read: {} holds the same split", instead.display()),
        );
    }
}

/// Leaves out ImageNet's task-3 train subset (`ILSVRC2012_img_train_t3.tar`, dog classes also
/// in the full train tar) when another train tar is there.
fn leave_out_subset(tars: Vec<Tar>, scan: &mut Scan) -> Vec<Tar> {
    let is_subset = |t: &Tar| t.file_name().contains("train_t3");
    if tars.iter().all(is_subset) {
        return tars;
    }
    let (subset, keep): (Vec<Tar>, Vec<Tar>) = tars.into_iter().partition(is_subset);
    for t in subset {
        scan.ignore(
            t.path.display(),
            "not read: ImageNet's task-3 subset, whose images the full train tar holds",
        );
    }
    keep
}

/// The training split of outer and per-synset tars, no class from two of them, and of the class
/// `folders` beside them (a folder of `dir` per class, named by its wnid), if any.
fn train_tars(
    tars: Vec<Tar>,
    folders: Option<(&Path, Vec<String>)>,
    scan: &mut Scan,
) -> Result<SplitFound> {
    let paths: Vec<PathBuf> = tars.iter().map(|t| t.path.clone()).collect();
    let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    let mut claims = Claims::default();
    let mut items = Vec::new();
    let mut inner = false;
    for tar in tars {
        if tar.kind() == TarKind::Outer {
            inner = true;
            items.extend(scan_outer(tar, scan, &mut claims)?);
        } else {
            items.extend(scan_synset(tar, scan, &mut claims)?);
        }
    }
    let dir = folders.as_ref().map(|(dir, _)| *dir);
    let read = match folders {
        Some(folders) => add_folders(&mut items, folders, &claims, scan)?,
        None => 0,
    };
    let mut layout = match (names.as_slice(), folder_of(&paths)) {
        ([one], _) => format!("tar file {one}"),
        (_, Some(dir)) => format!("{} tars in {}", names.len(), dir.display()),
        (_, None) => format!("{} tars", names.len()),
    };
    let mut rule = match inner {
        true => "class: the wnid naming each per-synset tar (<wnid>.tar) inside the outer tar",
        false => "class: the wnid naming each per-synset tar (<wnid>.tar)",
    }
    .to_string();
    let mut files = if names.len() <= 4 {
        names
    } else {
        vec![format!("{} tars", names.len())]
    };
    if let Some(dir) = dir.filter(|_| read > 0) {
        layout += &format!(" and {read} class folders in {}", dir.display());
        files.push(dir.display().to_string());
        rule += "; in a class folder: the folder's name";
    }
    Ok(SplitFound {
        items,
        layout,
        labels: LabelSource::new(files, format!("{rule}; {BY_NAME}")),
    })
}

/// The folder that holds all of `paths`, if one does.
fn folder_of(paths: &[PathBuf]) -> Option<&Path> {
    let first = paths.first()?.parent()?;
    paths
        .iter()
        .all(|p| p.parent() == Some(first))
        .then_some(first)
}

/// Adds to `items` the images of the class folders `classes` of `dir` beside tars: a class a
/// tar holds (`claims`) is read from the tar and its folder listed as not read, since an
/// extraction of the tars that stopped part way leaves both. Returns the folders read.
fn add_folders(
    items: &mut Vec<Found>,
    (dir, classes): (&Path, Vec<String>),
    claims: &Claims,
    scan: &mut Scan,
) -> Result<usize> {
    let mut read = Vec::new();
    for class in classes {
        match claims.holder(&class) {
            Some(tar) => scan.ignore(
                dir.join(&class).display(),
                format!("not read: {tar} holds the same class"),
            ),
            None => read.push(class),
        }
    }
    let count = read.len();
    items.extend(scan_classes(dir, read, scan)?);
    Ok(count)
}

/// A split read from the class folders of `root`.
fn tree_split(items: Vec<Found>, root: &Path) -> SplitFound {
    SplitFound {
        items,
        layout: format!("class folders in {}", root.display()),
        labels: LabelSource::new(
            vec![root.display().to_string()],
            format!("class: the name of the image's folder; {BY_NAME}"),
        ),
    }
}

/// Scans a training directory: class folders, or tars (per-synset or outer), or images named
/// by their wnid; other images there are refused.
fn scan_split_dir(dir: &Path, scan: &mut Scan) -> Result<Option<SplitFound>> {
    let entries = list_dir(dir)?;
    let mut paths = Vec::new();
    for e in entries
        .iter()
        .filter(|e| !e.is_dir() && is_tar_name(&e.name))
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
        paths.push(dir.join(&e.name));
    }
    if !paths.is_empty() {
        let tars = Tar::open_all(&paths, scan.progress)?;
        if tars.iter().all(|t| t.kind() == TarKind::NamedTrain) {
            for e in entries
                .iter()
                .filter(|e| e.is_dir() || !is_tar_name(&e.name))
            {
                scan.ignore(
                    dir.join(&e.name).display(),
                    "not read: the tars beside it hold the training split",
                );
            }
            return Ok(Some(named::train(tars, scan)?));
        }
        for t in &tars {
            let kind = t.kind();
            if !matches!(kind, TarKind::Outer | TarKind::Synset) {
                return Err(refusal(t, kind));
            }
        }
        // Class folders beside the tars: an extraction of the tars that stopped part way.
        let others: Vec<Entry> = entries
            .into_iter()
            .filter(|e| e.is_dir() || !is_tar_name(&e.name))
            .collect();
        let classes = class_folders(dir, &others, scan)?;
        return Ok(Some(train_tars(tars, Some((dir, classes)), scan)?));
    }
    if entries.iter().any(Entry::is_dir) {
        return Ok(Some(tree_split(scan_tree(dir, scan)?, dir)));
    }
    if let Some(items) = named::label_folder(dir, &entries, true, scan)? {
        return Ok(Some(named::train_folder(dir, items)));
    }
    // Images without a class folder would be left out: their class is stated nowhere.
    let images: Vec<&Entry> = entries.iter().filter(|e| is_image_name(&e.name)).collect();
    if let Some(first) = images.first() {
        return Err(input_err(
            dir,
            format!(
                "holds {} images ({}, ...) but no class folders: their class is stated \
                 nowhere; sort them into <wnid>/ folders",
                images.len(),
                first.name
            ),
        ));
    }
    Ok(None)
}

/// Scans `val/`: class folders, or flat images labelled by the CSV or the devkit.
fn scan_val_dir(
    root: &Path,
    val: &Path,
    opts: &SourceOptions,
    scan: &mut Scan,
) -> Result<Option<SplitFound>> {
    let entries = list_dir(val)?;
    if entries.iter().any(Entry::is_dir) {
        refuse_part_sorted(val, &entries)?;
        let items = scan_tree(val, scan)?;
        let checked = check_folders(&items, &find_labels(root, val, opts)?, scan)?;
        let mut split = tree_split(items, val);
        split.labels.add_checks(checked);
        return Ok(Some(split));
    }
    if entries.is_empty() {
        return Ok(None);
    }
    let labels = find_labels(root, val, opts)?;
    if let Some(items) = named::label_folder(val, &entries, false, scan)? {
        return Ok(Some(named::val_folder(val, items, &labels, scan)?));
    }
    // Labelled next, by the devkit or Kaggle's CSV.
    let images = flat_images(val, &entries, scan, |_, _| Ok(0))?;
    let (items, labels) = label_flat(images, (root, val), &labels, scan)?;
    Ok(Some(SplitFound {
        items,
        layout: format!("flat folder {}", val.display()),
        labels,
    }))
}

/// Refuses a `val/` that holds class folders and images beside them: a sort into class folders
/// that stopped part way, whose images beside the folders would be left out.
fn refuse_part_sorted(val: &Path, entries: &[Entry]) -> Result<()> {
    let flat: Vec<&Entry> = entries
        .iter()
        .filter(|e| !e.is_dir() && is_image_name(&e.name))
        .collect();
    let Some(first) = flat.first() else {
        return Ok(());
    };
    let folders = entries.iter().filter(|e| e.is_dir()).count();
    Err(input_err(
        val,
        format!(
            "holds {folders} class folders and {} images beside them ({}, ...): a sort into \
             class folders that stopped part way? Those images would be left out. Finish the \
             sort, or move the sorted images back beside the others (a flat val/ is labelled \
             by the devkit or Kaggle's CSV)",
            flat.len(),
            first.name
        ),
    ))
}

/// Scans ImageNet's flat val tars, labelled by the CSV or the devkit.
fn scan_val_tars(
    root: &Path,
    tars: Vec<Tar>,
    opts: &SourceOptions,
    scan: &mut Scan,
) -> Result<SplitFound> {
    let val = tars[0].path.clone();
    let labels = find_labels(root, &val, opts)?;
    let layout = tars
        .iter()
        .map(|t| format!("tar file {}", t.path.display()))
        .collect::<Vec<_>>()
        .join(", ");
    let mut images = Vec::new();
    for mut tar in tars {
        let archive = scan.archive(&tar.path);
        for m in std::mem::take(&mut tar.members) {
            if !is_image_name(m.file_name()) {
                scan.ignore(
                    format!("{}:{}", tar.path.display(), m.name),
                    "not an image file name",
                );
                continue;
            }
            images.push(Found {
                label: 0,
                name: m.name,
                size: m.size,
                loc: tar.loc(archive, m.offset),
            });
        }
    }
    let (items, labels) = label_flat(images, (root, &val), &labels, scan)?;
    Ok(SplitFound {
        items,
        layout,
        labels,
    })
}
