//! WebDataset shards, as timm publishes ImageNet (`imagenet1k-train-0000.tar`,
//! `imagenet1k-validation-00.tar`; `imagenet22k-*` alike): each sample is the members sharing a
//! key (the path up to the first dot of the file name), `KEY.jpg` beside `KEY.cls`, whose text
//! is the sample's class number. The split comes from the shard's name; the test split (no
//! labels) is left out with a line.
//!
//! The class numbers are the labels and keep their order. Each number's wnid comes from the
//! class list when one is given (line k: class k), or else from the training keys, which
//! ImageNet names after their synset (`n01440764_10026`). A key whose wnid prefix disagrees
//! with its `.cls`, a number given two wnids or a wnid two numbers, and a number with no wnid
//! are refused, naming the samples. A sample without an image or without a `.cls` is skipped
//! and counted toward the skip limit.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use rayon::prelude::*;

use super::inputs::{LabelSource, Loc, Rejected, SourceOptions};
use super::listing::{input_err, is_image_name, prefix_wnid, split_named};
use super::numbered::{name_numbers, NumberList, Numbered};
use super::scan::{read_class_list, Found, Scan, SplitFound};
use super::tars::{Member, Tar};
use crate::error::{LoaderError, Result};

/// Largest `.cls` member read (a class number and a newline).
const MAX_CLS_BYTES: u64 = 64;

/// One sample of a shard: its key, its image member and its class number.
struct Sample {
    key: String,
    image: Option<Member>,
    class: Option<u32>,
}

/// A member's sample key and extension (`dir/n01_5.jpg` -> (`dir/n01_5`, `jpg`)): the
/// WebDataset convention splits at the first dot of the file name.
fn key_and_ext(name: &str) -> (&str, &str) {
    let start = name.rfind('/').map_or(0, |i| i + 1);
    match name[start..].find('.') {
        Some(dot) => (&name[..start + dot], &name[start + dot + 1..]),
        None => (name, ""),
    }
}

/// The samples of one shard, in key order; `.cls` members are read (small positioned reads).
fn samples(tar: &Tar) -> Result<Vec<Sample>> {
    if tar.gzip {
        return Err(input_err(
            &tar.path,
            "is a gzip-compressed WebDataset shard: ddl-pack reads WebDataset shards \
             uncompressed (gunzip it first)",
        ));
    }
    let file = File::open(&tar.path).map_err(|e| LoaderError::io("open", &tar.path, e))?;
    let mut by_key: BTreeMap<&str, Sample> = BTreeMap::new();
    for m in &tar.members {
        let (key, ext) = key_and_ext(&m.name);
        let s = by_key.entry(key).or_insert_with(|| Sample {
            key: key.to_string(),
            image: None,
            class: None,
        });
        if ext == "cls" {
            let at = format!("{}:{}", tar.path.display(), m.name);
            if m.size > MAX_CLS_BYTES {
                return Err(input_err(Path::new(&at), "is too large for a class number"));
            }
            let mut buf = vec![0u8; m.size as usize];
            file.read_exact_at(&mut buf, m.offset)
                .map_err(|e| LoaderError::io("read", Path::new(&at), e))?;
            let text = String::from_utf8_lossy(&buf);
            let class = text.trim().parse().map_err(|_| {
                input_err(
                    Path::new(&at),
                    format!("{:?} is not a class number", text.trim()),
                )
            })?;
            s.class = Some(class);
        } else if is_image_name(&m.name) && s.image.is_none() {
            s.image = Some(m.clone());
        }
    }
    Ok(by_key.into_values().collect())
}

/// Each class number's wnid: the class list's, or the keys' (`numbered.rs`).
fn class_wnids(
    shards: &[(Tar, &'static str, Vec<Sample>)],
    opts: &SourceOptions,
) -> Result<Vec<String>> {
    let listed = match &opts.classes {
        Some(path) => Some((path, read_class_list(path)?)),
        None => None,
    };
    let list = listed
        .as_ref()
        .map(|(path, wnids)| NumberList { path, wnids });
    let (mut inputs, mut place) = (Vec::new(), Vec::new());
    for (t, (_, _, samples)) in shards.iter().enumerate() {
        for (k, s) in samples.iter().enumerate() {
            if let Some(class) = s.class {
                inputs.push(Numbered {
                    class,
                    wnid: prefix_wnid(&s.key),
                });
                place.push((t, k));
            }
        }
    }
    name_numbers(&inputs, list.as_ref(), ".cls", |i| {
        let (t, k) = place[i];
        format!("{}:{}", shards[t].0.path.display(), shards[t].2[k].key)
    })
}

/// Scans WebDataset shards into their splits.
pub(super) fn scan(
    tars: Vec<Tar>,
    opts: &SourceOptions,
    scan: &mut Scan,
) -> Result<BTreeMap<String, SplitFound>> {
    let mut kept = Vec::new();
    for tar in tars {
        match split_named(&tar.file_name()) {
            Some(Some(split)) => kept.push((tar, split)),
            Some(None) => scan.ignore(tar.path.display(), "the test split: no labels exist"),
            None => {
                return Err(input_err(
                    &tar.path,
                    "is a WebDataset shard whose name says no split (train, validation, test)",
                ))
            }
        }
    }
    let listed: Vec<Result<Vec<Sample>>> = kept.par_iter().map(|(t, _)| samples(t)).collect();
    let shards: Vec<(Tar, &'static str, Vec<Sample>)> = kept
        .into_iter()
        .zip(listed)
        .map(|((t, sp), s)| s.map(|s| (t, sp, s)))
        .collect::<Result<_>>()?;
    let wnids = class_wnids(&shards, opts)?;
    for (class, w) in wnids.iter().enumerate() {
        // Unique: a list is checked, and keys give a wnid one class.
        let id = scan.wnid_id(w);
        debug_assert_eq!(id as usize, class);
    }
    scan.train_classes = wnids.len();
    scan.declared = Some(wnids.clone());
    let mut found: BTreeMap<String, SplitFound> = BTreeMap::new();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for (tar, split, samples) in shards {
        *counts.entry(split).or_default() += 1;
        let archive = scan.archive(&tar.path);
        let entry = found.entry(split.to_string()).or_default();
        for s in samples {
            let at = format!("{}:{}", tar.path.display(), s.key);
            // name_numbers() checked every class number against the classes.
            let missing = match (&s.image, s.class) {
                (Some(_), Some(_)) => None,
                (None, _) => Some(("no image", "the sample has no image member")),
                (_, None) => Some(("no label", "the sample has no .cls member")),
            };
            if let Some((reason, detail)) = missing {
                scan.rejected.push(Rejected {
                    split: split.to_string(),
                    path: at,
                    reason: reason.into(),
                    detail: detail.into(),
                });
                continue;
            }
            let m = s.image.expect("checked");
            entry.items.push(Found {
                label: s.class.expect("checked"),
                name: m.name,
                size: m.size,
                loc: Loc::Archive {
                    archive,
                    offset: m.offset,
                },
            });
        }
    }
    let by = if opts.classes.is_some() {
        "the class list's line of that number"
    } else {
        "the training keys' wnid prefix (n01440764_10026)"
    };
    for (split, f) in &mut found {
        let n = counts[split.as_str()];
        f.layout = format!("{n} WebDataset shards");
        f.labels = LabelSource::new(
            vec![format!("{n} WebDataset shards ({split})")],
            format!("the class number in each sample's KEY.cls; its wnid from {by}"),
        );
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_splits_and_wnids() {
        assert_eq!(key_and_ext("a/n01_5.jpg"), ("a/n01_5", "jpg"));
        assert_eq!(
            key_and_ext("n01440764_10026.cls"),
            ("n01440764_10026", "cls")
        );
    }
}
