//! Finding the packer's inputs and their labels, in every form ImageNet is downloaded in
//! (`layout.rs` tells them apart):
//!
//! - image-net.org's archives as downloaded (`ILSVRC2012_img_train.tar`, a tar of per-class
//!   tars; `ILSVRC2012_img_val.tar`, flat; `ILSVRC2012_devkit_t12.tar.gz`) or extracted
//!   (`train/<wnid>/`, a flat `val/`, the devkit folder), in any mix;
//! - Kaggle's CLS-LOC folders with `LOC_val_solution.csv`, or its zip as downloaded
//!   (`zipped.rs`);
//! - Hugging Face's `imagenet-1k` parquet files (`parquet.rs`), or its older tars of images named
//!   by their wnid, as they are or extracted (`named.rs`);
//! - WebDataset shards, as timm publishes ImageNet (`wds.rs`);
//! - TFRecord files, as TensorFlow Datasets and the TPU reference prepare it (`tfrecord.rs`);
//! - ImageNet-22k's per-synset tars, on disk or in an outer `winter21_whole.tar.gz` /
//!   `fall11_whole.tar` (which may also be the input itself); a tar of class folders, such as
//!   ImageNet-21K-P's (`tar_tree.rs`); any class-folder tree.
//!
//! Labels come only from a source that states them: a class folder's or per-synset tar's wnid,
//! the devkit's ground truth through its `meta.mat` (`devkit.rs`), Kaggle's CSV, a parquet
//! row's label, a WebDataset sample's `.cls` or a TFRecord's label number (`numbered.rs`), a
//! TFRecord's synset, the wnid ending an image's name. An input whose label cannot be vouched for is
//! refused, never guessed (`val.rs`); each split's label source is recorded in the report and
//! the manifest.
//!
//! Tars are indexed with the tar crate (headers only, seeking over member data) and never
//! extracted: members are later read with positioned reads at the recorded offsets, so nested
//! tars are never unpacked and each member can be read independently. A gzip-compressed tar is
//! listed in one pass over its stream and read in its order (`gzip.rs`).

mod devkit;
mod gzip;
mod inputs;
mod layout;
mod listing;
mod named;
mod numbered;
mod parquet;
mod parquet_file;
mod scan;
mod tar_tree;
mod tars;
mod tfrecord;
mod tfrecord_file;
mod tree;
mod val;
mod wds;
mod zipped;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use super::classes;
use super::progress::PackProgress;
use crate::error::Result;
pub use inputs::{
    place, read_in_place_order, read_together, sequential_only, sort_by_label, Inputs, Item,
    LabelSource, Loc, Rejected, SourceOptions, IMAGE_EXTENSIONS, MAX_INPUT_BYTES,
};
use listing::input_err;
use scan::{read_class_list, Scan, SplitFound};

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

/// Finds the inputs under `input` (see the module documentation for the layouts), telling
/// `progress` of the long reads (a gzip-compressed tar is listed by reading all of it).
pub fn discover(input: &Path, opts: &SourceOptions, progress: &dyn PackProgress) -> Result<Inputs> {
    let mut scan = Scan {
        progress: Some(progress),
        ..Scan::default()
    };
    let found = layout::scan(input, opts, &mut scan)?;
    if found.values().all(|f| f.items.is_empty()) {
        return Err(input_err(input, layout::NOTHING_FOUND));
    }
    let listed = match &opts.classes {
        Some(path) => Some(read_class_list(path)?),
        None => scan.declared.clone(),
    };
    // A file a split's labels were read or checked from is an input, not an ignored file.
    let read: HashSet<&String> = found
        .values()
        .flat_map(|f| f.labels.files.iter().chain(&f.labels.checked))
        .collect();
    scan.ignored_files.retain(|(path, _)| !read.contains(path));
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
            items.sort_unstable_by(|a, b| place(a).cmp(&place(b)));
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
        gzip: Default::default(),
        parquet: scan.parquet,
        layouts,
        labels,
        ignored_classes,
        dropped_classes: selection.dropped,
        ignored_files: scan.ignored_files,
        rejected: scan.rejected,
    })
}
