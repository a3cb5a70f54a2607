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

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use rayon::prelude::*;

use super::inputs::{LabelSource, Loc, Rejected, SourceOptions};
use super::listing::{input_err, is_image_name, is_wnid};
use super::scan::{read_wnid_list, Found, Scan, SplitFound};
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

/// The split a shard belongs to, by its name: `None` for the test split.
fn split_of(file_name: &str) -> Option<Option<&'static str>> {
    let stem = file_name.strip_suffix(".tar").unwrap_or(file_name);
    let words: Vec<&str> = stem.split(['-', '_', '.']).collect();
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

/// The wnid a key states (`n01440764_10026` -> `n01440764`).
fn key_wnid(key: &str) -> Option<&str> {
    let file = key.rsplit('/').next()?;
    file.split('_').next().filter(|w| is_wnid(w))
}

/// Each class number's wnid: the class list's, or the training keys'; refuses disagreements.
fn class_wnids(
    shards: &[(Tar, &'static str, Vec<Sample>)],
    opts: &SourceOptions,
) -> Result<Vec<String>> {
    let listed = match &opts.classes {
        Some(path) => {
            let list = read_wnid_list(path)?;
            crate::pack::classes::check_list(path, &list)?;
            Some(list)
        }
        None => None,
    };
    let mut of_class: HashMap<u32, (String, String)> = HashMap::new();
    let mut class_of: HashMap<String, (u32, String)> = HashMap::new();
    for (tar, split, samples) in shards {
        for s in samples {
            let (Some(class), Some(wnid)) = (s.class, key_wnid(&s.key)) else {
                continue;
            };
            let at = format!("{}:{}", tar.path.display(), s.key);
            if let Some(list) = &listed {
                match list.get(class as usize) {
                    Some(w) if w == wnid => continue,
                    Some(w) => {
                        return Err(input_err(
                            Path::new(&at),
                            format!(
                                "is a sample of {wnid} by its key, but its .cls {class} is {w} \
                                 by line {} of {}",
                                class + 1,
                                opts.classes.as_ref().expect("listed").display()
                            ),
                        ))
                    }
                    None => continue,
                }
            }
            if *split != "train" {
                continue;
            }
            if let Some((w, first)) = of_class.get(&class) {
                if w != wnid {
                    return Err(input_err(
                        Path::new(&at),
                        format!(
                            "is a sample of {wnid} by its key, with .cls {class}, but {first} \
                             is a sample of {w} with .cls {class}"
                        ),
                    ));
                }
            } else {
                of_class.insert(class, (wnid.to_string(), at.clone()));
            }
            if let Some((c, first)) = class_of.get(wnid) {
                if *c != class {
                    return Err(input_err(
                        Path::new(&at),
                        format!(
                            "is a sample of {wnid} with .cls {class}, but {first} is a sample \
                             of {wnid} with .cls {c}"
                        ),
                    ));
                }
            } else {
                class_of.insert(wnid.to_string(), (class, at));
            }
        }
    }
    if let Some(list) = listed {
        return Ok(list);
    }
    let count = shards
        .iter()
        .flat_map(|(_, _, s)| s.iter().filter_map(|s| s.class))
        .max()
        .map_or(0, |m| m as usize + 1);
    (0..count as u32)
        .map(|c| {
            of_class.remove(&c).map(|(w, _)| w).ok_or_else(|| {
                let example = shards.iter().find_map(|(t, _, ss)| {
                    ss.iter()
                        .find(|s| s.class == Some(c))
                        .map(|s| format!("{}:{}", t.path.display(), s.key))
                });
                input_err(
                    Path::new(&example.unwrap_or_else(|| "the shards".into())),
                    format!(
                        "class {c} has no wnid: no training key of it is named after its \
                         synset (n01440764_10026){}; give the class list (line k: the wnid of \
                         class k)",
                        if c as usize + 1 == count {
                            ""
                        } else {
                            ", or no sample has it"
                        }
                    ),
                )
            })
        })
        .collect()
}

/// Scans WebDataset shards into their splits.
pub(super) fn scan(
    tars: Vec<Tar>,
    opts: &SourceOptions,
    scan: &mut Scan,
) -> Result<BTreeMap<String, SplitFound>> {
    let mut kept = Vec::new();
    for tar in tars {
        match split_of(&tar.file_name()) {
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
        let entry = found
            .entry(split.to_string())
            .or_insert_with(|| SplitFound {
                items: Vec::new(),
                layout: String::new(),
                labels: LabelSource::new(Vec::new(), ""),
            });
        for s in samples {
            let at = format!("{}:{}", tar.path.display(), s.key);
            let missing = match (&s.image, s.class) {
                (Some(_), Some(c)) if (c as usize) < wnids.len() => None,
                (Some(_), Some(c)) => {
                    return Err(input_err(
                        Path::new(&at),
                        format!(
                            "has .cls {c}, beyond the {} classes of the list",
                            wnids.len()
                        ),
                    ))
                }
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
        assert_eq!(split_of("imagenet1k-train-0000.tar"), Some(Some("train")));
        assert_eq!(split_of("imagenet1k-validation-00.tar"), Some(Some("val")));
        assert_eq!(split_of("imagenet22k-test-0001.tar"), Some(None));
        assert_eq!(split_of("shard-0001.tar"), None);
        assert_eq!(key_wnid("n01440764_10026"), Some("n01440764"));
        assert_eq!(key_wnid("ILSVRC2012_val_00000001"), None);
    }
}
