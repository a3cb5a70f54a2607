//! Class-folder trees: `root/<wnid>/*` (one directory per class, the wnid its name).

use std::path::Path;

use rayon::prelude::*;

use super::listing::{class_folders, file_input, is_image_name, list_dir, Entry};
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
        let dir = scan.dir(&root.join(&wnid));
        let class = scan.wnid_id(&wnid);
        for e in files? {
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
