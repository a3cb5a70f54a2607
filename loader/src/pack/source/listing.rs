//! Listing input directories: entries sorted by name (links followed, hidden entries skipped),
//! image file names, and the class folders of a tree.

use std::path::Path;

use super::inputs::{name_link, Loc, IMAGE_EXTENSIONS};
use super::scan::{Found, Scan};
use crate::error::{LoaderError, Result};

/// Whether `name` ends in an image file extension ([`IMAGE_EXTENSIONS`]).
pub(super) fn is_image_name(name: &str) -> bool {
    Path::new(name)
        .extension()
        .and_then(|e| e.to_str())
        .map(|e| IMAGE_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()))
        .unwrap_or(false)
}

/// Whether `s` is a WordNet id as ImageNet names its synsets: `n` and eight digits.
pub(super) fn is_wnid(s: &str) -> bool {
    s.len() == 9 && s.starts_with('n') && s[1..].bytes().all(|b| b.is_ascii_digit())
}

/// The wnid that ends an image's file name (`n01440764_10026_n01440764.JPEG` ->
/// `n01440764`), as Hugging Face's imagenet-1k names its images, if one does.
pub(super) fn name_wnid(name: &str) -> Option<&str> {
    let file = name.rsplit('/').next().unwrap_or(name);
    let stem = file.rsplit_once('.').map_or(file, |(s, _)| s);
    let (_, wnid) = stem.rsplit_once('_')?;
    is_wnid(wnid).then_some(wnid)
}

/// The wnid that starts a file name or key (`dir/n01440764_10026.JPEG` -> `n01440764`), as
/// ImageNet names its training images, if one does.
pub(super) fn prefix_wnid(name: &str) -> Option<&str> {
    let file = name.rsplit('/').next()?;
    file.split(['_', '.']).next().filter(|w| is_wnid(w))
}

/// The split a file of a sharded dataset belongs to, by the words of its name
/// (`imagenet1k-train-0000.tar`, `imagenet2012-validation.tfrecord-00000-of-00064`,
/// `validation-00127-of-00128`): `None` for the test split, `None` outside when it says none.
pub(super) fn split_named(file_name: &str) -> Option<Option<&'static str>> {
    let words: Vec<&str> = file_name.split(['-', '_', '.']).collect();
    if words.contains(&"train") {
        Some(Some("train"))
    } else if words
        .iter()
        .any(|w| ["validation", "val", "valid"].contains(w))
    {
        Some(Some("val"))
    } else if words.contains(&"test") {
        Some(None)
    } else {
        None
    }
}

/// The error of an input at `path`.
pub(super) fn input_err(path: &Path, reason: impl Into<String>) -> LoaderError {
    LoaderError::Input {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// What a directory entry is, following symbolic links.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Kind {
    /// A directory.
    Dir,
    /// Anything else that `stat` accepts, with its size.
    File(u64),
    /// `stat` failed (a dangling symbolic link, a link loop, no permission): the error.
    Broken(String),
}

/// One entry of an input directory.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Entry {
    /// The name, lossily decoded when it is not UTF-8.
    pub name: String,
    /// Whether the name is valid UTF-8 (only then can the packer open it by `name`).
    pub utf8: bool,
    /// What it is.
    pub kind: Kind,
}

impl Entry {
    /// Whether it is a directory.
    pub(super) fn is_dir(&self) -> bool {
        self.kind == Kind::Dir
    }
}

/// Entries of `dir` sorted by name, hidden entries skipped. Entries that cannot be examined
/// are listed, not fatal: each caller decides (an input file is skipped and reported, a class
/// folder that cannot be examined stops the pack).
pub(super) fn list_dir(dir: &Path) -> Result<Vec<Entry>> {
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
pub(super) fn class_folders(
    root: &Path,
    entries: &[Entry],
    scan: &mut Scan,
) -> Result<Vec<String>> {
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
            Kind::File(_) => scan.ignore(
                root.join(&e.name).display(),
                "a file among the class folders, not a class",
            ),
        }
    }
    Ok(classes)
}

/// The images among `entries` of the flat folder `dir` (registered in `scan`), each labelled
/// by `label`; its other files are listed among the ignored ones.
pub(super) fn flat_images(
    dir: &Path,
    entries: &[Entry],
    scan: &mut Scan,
    mut label: impl FnMut(&Entry, &mut Scan) -> Result<u32>,
) -> Result<Vec<Found>> {
    let index = scan.dir(dir);
    let mut found = Vec::new();
    for e in entries {
        if !is_image_name(&e.name) {
            scan.ignore(dir.join(&e.name).display(), "not an image file name");
            continue;
        }
        let (size, loc) = file_input(e, index);
        found.push(Found {
            label: label(e, scan)?,
            name: e.name.clone(),
            size,
            loc,
        });
    }
    Ok(found)
}

/// The input an image-named file entry of `dir` (index `dir` in `Scan::dirs`) becomes: an
/// entry that cannot be examined has size 0 and fails when read, a non-UTF-8 name cannot be
/// opened; both are then skipped and reported with the reason.
pub(super) fn file_input(e: &Entry, dir: u32) -> (u64, Loc) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wnid_ending_a_name() {
        assert!(is_wnid("n01440764") && !is_wnid("n0144076") && !is_wnid("x01440764"));
        assert_eq!(
            name_wnid("n01440764_10026_n01440764.JPEG"),
            Some("n01440764")
        );
        assert_eq!(
            name_wnid("d/ILSVRC2012_val_00000001_n01751748.JPEG"),
            Some("n01751748")
        );
        assert_eq!(name_wnid("n01440764_10026.JPEG"), None);
        assert_eq!(name_wnid("ILSVRC2012_test_00000001.JPEG"), None);
        assert_eq!(prefix_wnid("n01440764_10026"), Some("n01440764"));
        assert_eq!(prefix_wnid("d/n01440764_10026.JPEG"), Some("n01440764"));
        assert_eq!(prefix_wnid("ILSVRC2012_val_00000001"), None);
    }

    #[test]
    fn the_split_a_name_says() {
        assert_eq!(
            split_named("imagenet1k-train-0000.tar"),
            Some(Some("train"))
        );
        assert_eq!(
            split_named("imagenet1k-validation-00.tar"),
            Some(Some("val"))
        );
        assert_eq!(split_named("imagenet22k-test-0001.tar"), Some(None));
        assert_eq!(split_named("shard-0001.tar"), None);
        let tfds = "imagenet2012-validation.tfrecord-00000-of-00064";
        assert_eq!(split_named(tfds), Some(Some("val")));
        assert_eq!(split_named("train-00000-of-01024"), Some(Some("train")));
    }
}
