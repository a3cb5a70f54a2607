//! Class-folder trees: `root/<wnid>/*` (one directory per class, the wnid its name).

use std::path::Path;

use rayon::prelude::*;

use super::listing::{class_folders, file_input, input_err, is_image_name, list_dir, Entry};
use super::scan::{Found, Scan};
use crate::error::Result;

/// Scans the folder tree `root/<wnid>/*`.
pub(super) fn scan_tree(root: &Path, scan: &mut Scan) -> Result<Vec<Found>> {
    let classes = class_folders(root, &list_dir(root)?, scan)?;
    scan_classes(root, classes, scan)
}

/// Scans the class folders `classes` of `root`.
pub(super) fn scan_classes(
    root: &Path,
    classes: Vec<String>,
    scan: &mut Scan,
) -> Result<Vec<Found>> {
    let listed: Vec<Result<Vec<Entry>>> = classes
        .par_iter()
        .map(|c| list_dir(&root.join(c)))
        .collect();
    let mut found = Vec::new();
    for (wnid, files) in classes.into_iter().zip(listed) {
        let files = files?;
        refuse_folder_of_folders(&root.join(&wnid), &files)?;
        let dir = scan.dir(&root.join(&wnid));
        let class = scan.wnid_id(&wnid);
        for e in files {
            if e.is_dir() {
                scan.ignore(
                    root.join(&wnid).join(&e.name).display(),
                    "a folder inside a class folder: its images are not read",
                );
                continue;
            }
            if !is_image_name(&e.name) {
                scan.ignore(
                    root.join(&wnid).join(&e.name).display(),
                    "not an image file name",
                );
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

/// Refuses a class folder that holds folders and no image: the tree is read a level too high
/// (`ILSVRC2012_img_train/<wnid>/` given as a class beside `ILSVRC2012_img_val/`), and packing
/// it would make a class of each such folder, or drop it.
fn refuse_folder_of_folders(dir: &Path, entries: &[Entry]) -> Result<()> {
    let folders: Vec<&Entry> = entries.iter().filter(|e| e.is_dir()).collect();
    let images = entries
        .iter()
        .any(|e| !e.is_dir() && is_image_name(&e.name));
    match folders.first() {
        Some(first) if !images => Err(input_err(
            dir,
            format!(
                "is read as a class folder, but holds {} folders ({}, ...) and no images: \
                 ddl-pack reads a class's images from its own folder. If it is a split, name it \
                 train/ (its validation images val/) or give it as the input itself",
                folders.len(),
                first.name
            ),
        )),
        _ => Ok(()),
    }
}
