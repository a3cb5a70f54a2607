//! Tars of class-folder trees: image-net.org's `imagenet21k_resized.tar.gz` (ImageNet-21K-P:
//! `imagenet21k_resized/imagenet21k_train/<wnid>/*.JPEG`, `.../imagenet21k_val/<wnid>/`, and
//! `.../imagenet21k_small_classes/`), ImageNetV2's `imagenetv2-matched-frequency.tar.gz`
//! (`imagenetv2-matched-frequency-format-val/<0..999>/*.jpeg`). Every image sits at the same
//! depth; its folder names its class, and the folder above that its split when its name has a
//! `train` or `val` word (`imagenet21k_train`, `...-format-val`); a tar of one level of class
//! folders is a training split. Other folders at the split level (`imagenet21k_small_classes`,
//! a `test` split) are listed as not packed. Such a tar is read as the input itself, or with the
//! other split's beside it in a folder of their own (image-net.org's face-blurred ImageNet:
//! `train_blurred.tar.gz`, `val_blurred.tar.gz` of `{train,val}_blurred/<wnid>/*.jpg`).

use std::collections::BTreeMap;

use super::inputs::LabelSource;
use super::listing::{input_err, is_image_name};
use super::scan::{Found, Scan, SplitFound};
use super::tars::{Member, Tar};
use crate::error::Result;

/// The rule, in words.
const RULE: &str = "class: the name of the folder holding the image in the tar; label: the \
    position of the class's wnid in manifest.json's classes";

/// Where an image of a tree sits: its split's folder (if the tree has that level) and its class.
fn place(member: &Member, depth: usize) -> (Option<&str>, &str) {
    let parts: Vec<&str> = member.name.trim_start_matches("./").split('/').collect();
    let split = (depth >= 3).then(|| parts[depth - 3]);
    (split, parts[depth - 2])
}

/// The split a split folder's name says (`imagenet21k_train` -> train), if it says one.
fn split_named(folder: &str) -> Option<&'static str> {
    let words: Vec<String> = folder
        .split(['_', '-', '.', ' '])
        .map(str::to_ascii_lowercase)
        .collect();
    let has = |w: &str| words.iter().any(|x| x == w);
    if has("train") {
        Some("train")
    } else if has("val") || has("validation") {
        Some("val")
    } else if has("test") {
        Some("test")
    } else {
        None
    }
}

/// The depth at which every image of `tar` sits, when it is a class-folder tree: two or more
/// class folders, every image at the same depth (at least in a class folder), and, where the
/// tree has a split level, a train or val split among its folders.
pub(super) fn depth(tar: &Tar) -> Option<usize> {
    let mut images = tar.members.iter().filter(|m| is_image_name(m.file_name()));
    let depth = images
        .next()?
        .name
        .trim_start_matches("./")
        .split('/')
        .count();
    if depth < 2
        || images
            .clone()
            .any(|m| m.name.trim_start_matches("./").split('/').count() != depth)
    {
        return None;
    }
    let all = tar.members.iter().filter(|m| is_image_name(m.file_name()));
    let places: std::collections::BTreeSet<(Option<&str>, &str)> =
        all.map(|m| place(m, depth)).collect();
    let split_ok = depth == 2
        || places
            .iter()
            .any(|(s, _)| matches!(s.and_then(split_named), Some("train" | "val")));
    (places.len() >= 2 && split_ok).then_some(depth)
}

/// The splits of the class-folder tree `tar` (its images at `depth`), the training split's
/// classes registered first.
pub(super) fn scan(
    mut tar: Tar,
    depth: usize,
    scan: &mut Scan,
) -> Result<BTreeMap<String, SplitFound>> {
    let archive = scan.archive(&tar.path);
    let members = std::mem::take(&mut tar.members);
    let mut by_split: BTreeMap<&str, Vec<&Member>> = BTreeMap::new();
    let mut not_packed: BTreeMap<String, (u64, &str)> = BTreeMap::new();
    for m in &members {
        if !is_image_name(m.file_name()) {
            scan.ignore(
                format!("{}:{}", tar.path.display(), m.name),
                "not an image file name",
            );
            continue;
        }
        let (folder, _) = place(m, depth);
        let why = match folder.map_or(Some("train"), split_named) {
            Some(split @ ("train" | "val")) => {
                by_split.entry(split).or_default().push(m);
                continue;
            }
            Some(_) => "test images: no labels exist; not packed",
            None => "a folder that is not a train or val split; not packed",
        };
        let folder = folder.unwrap_or_default().to_string();
        not_packed.entry(folder).or_insert((0, why)).0 += 1;
    }
    for (folder, (n, why)) in not_packed {
        scan.ignore(
            format!("{}:.../{folder}/ ({n} images)", tar.path.display()),
            why,
        );
    }
    let mut found = BTreeMap::new();
    for split in ["train", "val"] {
        let Some(images) = by_split.remove(split) else {
            continue;
        };
        let items: Vec<Found> = images
            .into_iter()
            .map(|m| Found {
                label: scan.wnid_id(place(m, depth).1),
                name: m.name.clone(),
                size: m.size,
                loc: tar.loc(archive, m.offset),
            })
            .collect();
        if split == "train" {
            scan.train_classes = scan.wnids.len();
        }
        let file = tar.path.display().to_string();
        found.insert(
            split.to_string(),
            SplitFound {
                items,
                layout: format!("class folders in tar file {file}"),
                labels: LabelSource::new(vec![file], RULE),
            },
        );
    }
    Ok(found)
}

/// The splits of tars of class folders in one folder, each split from one of them (a split in
/// two is refused, naming both).
pub(super) fn scan_all(tars: Vec<Tar>, scan: &mut Scan) -> Result<BTreeMap<String, SplitFound>> {
    let mut found: BTreeMap<String, (SplitFound, std::path::PathBuf)> = BTreeMap::new();
    for tar in tars {
        let (path, depth) = (
            tar.path.clone(),
            depth(&tar).expect("a tar of class folders"),
        );
        for (split, f) in self::scan(tar, depth, scan)? {
            if let Some((_, first)) = found.get(&split) {
                return Err(input_err(
                    &path,
                    format!(
                        "holds a {split} split, as {} does: two tars of one split; keep one",
                        first.display()
                    ),
                ));
            }
            found.insert(split, (f, path.clone()));
        }
    }
    Ok(found.into_iter().map(|(s, (f, _))| (s, f)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_folders_by_their_words() {
        assert_eq!(split_named("imagenet21k_train"), Some("train"));
        assert_eq!(
            split_named("imagenetv2-matched-frequency-format-val"),
            Some("val")
        );
        assert_eq!(split_named("imagenet21k_small_classes"), None);
        assert_eq!(split_named("Test"), Some("test"));
        assert_eq!(split_named("trainval_notes"), None);
    }
}
