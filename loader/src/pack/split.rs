//! Holding out a validation split from an input that has none ([`ValRule::Fraction`],
//! [`ValRule::PerClass`]): ImageNet-22k ships one tar per synset and no validation set.
//!
//! Every training input gets a 64-bit key, [`key`]: FNV-1a 64 over the length-delimited seed
//! (8 bytes, little-endian), the wnid and the input's file name (the last `/`-separated part of
//! its name: a tar member's name inside its synset tar, a folder tree's file name), then the
//! SplitMix64 finaliser. The key depends on nothing else — not the thread count, the order of
//! the tars, the shard count, the outer tar, nor any other synset — so:
//!
//! - a fraction F: an input is held out when `(key >> 11) / 2^53 < F`. Its split is a
//!   function of (seed, wnid, file name) alone: adding synsets or images never moves another.
//! - N per class: the N inputs of each class with the smallest keys (ties broken by
//!   name) are held out, at most all but one, so every class keeps a training input. The choice
//!   depends on the class's own inputs only (the same in any order); adding synsets moves
//!   nothing in other classes.
//!
//! The choice is made among the inputs that discovery found (image file names), before any is
//! decoded: an input that later fails to decode is skipped from the split it was given, and the
//! report lists it there. Each input is in exactly one split, so train and val never share one.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::fnv::Fnv;
use super::option_error::OptionError;
use super::source::{Inputs, Item, LabelSource};
pub use super::val_split::{ValRule, ValSplit};
use crate::error::{LoaderError, Result};

/// The key function, in words, as the manifest and the report record it.
pub const HASH: &str = "splitmix64_finalize(fnv1a64(seed as u64 little-endian, wnid, file name; \
                        each field followed by its length as u64 little-endian))";

/// The held-out split as the manifest (`pack.val_split`) and the report record it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ValSplitReport {
    /// "fraction" or "per-class".
    pub rule: String,
    /// The fraction, for the rule "fraction".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fraction: Option<f64>,
    /// The count, for the rule "per-class".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_class: Option<u64>,
    /// The seed of the key.
    pub seed: u64,
    /// The key function ([`HASH`]).
    pub hash: String,
    /// Training inputs (before decoding).
    pub train_inputs: u64,
    /// Held-out inputs (before decoding).
    pub val_inputs: u64,
}

/// Finalises a 64-bit hash so that every output bit depends on every input bit (SplitMix64).
fn finalize(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The file name a key is taken over: the last `/`-separated part of an input's name.
fn file_name(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

/// The key of the input named `name` of class `wnid` under `seed` (see the module
/// documentation).
pub fn key(seed: u64, wnid: &str, name: &str) -> u64 {
    let mut h = Fnv::new();
    h.bytes(&seed.to_le_bytes());
    h.bytes(wnid.as_bytes());
    h.bytes(file_name(name).as_bytes());
    finalize(h.0)
}

/// Whether `key` falls in the held-out fraction `f`.
fn below(key: u64, f: f64) -> bool {
    ((key >> 11) as f64) * (1.0 / (1u64 << 53) as f64) < f
}

/// Which of one class's `items` are held out.
fn held_out(items: &[&Item], wnid: &str, vs: &ValSplit) -> Vec<bool> {
    match vs.rule {
        ValRule::Fraction(f) => items
            .iter()
            .map(|it| below(key(vs.seed, wnid, &it.name), f))
            .collect(),
        ValRule::PerClass(n) => {
            let mut order: Vec<(u64, &str, usize)> = items
                .iter()
                .enumerate()
                .map(|(i, it)| (key(vs.seed, wnid, &it.name), it.name.as_str(), i))
                .collect();
            order.sort_unstable();
            let take = (n as usize).min(items.len().saturating_sub(1));
            let mut out = vec![false; items.len()];
            for &(_, _, i) in &order[..take] {
                out[i] = true;
            }
            out
        }
    }
}

/// Moves the held-out inputs of `inputs`' training split into a new "val" split; both keep the
/// training split's order. Refused, naming the option, when the input has a validation split of
/// its own (`input` names the input in the error).
pub(crate) fn carve(
    inputs: &mut Inputs,
    vs: &ValSplit,
    input: &std::path::Path,
) -> Result<ValSplitReport> {
    if let Some(layout) = inputs.layouts.get("val") {
        return Err(LoaderError::Option {
            path: input.to_path_buf(),
            source: OptionError::new(
                vs.option(),
                vs.value(),
                format!(
                    "carves a validation split from inputs that have none, but this input has \
                     one ({layout}); leave it out to pack the input's own val split"
                ),
            ),
        });
    }
    let items = inputs.splits.remove("train").unwrap_or_default();
    // Each class's inputs, in split order (a class's are consecutive unless the split keeps the
    // order of its files, as parquet rows do).
    let mut by_class: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (i, it) in items.iter().enumerate() {
        by_class.entry(it.label).or_default().push(i as u32);
    }
    let mut held = vec![false; items.len()];
    for (label, idx) in by_class {
        let class: Vec<&Item> = idx.iter().map(|&i| &items[i as usize]).collect();
        let chosen = held_out(&class, &inputs.classes[label as usize], vs);
        for (i, v) in idx.into_iter().zip(chosen) {
            held[i as usize] = v;
        }
    }
    let mut train = Vec::with_capacity(items.len());
    let mut val = Vec::new();
    for (it, v) in items.into_iter().zip(held) {
        if v {
            val.push(it);
        } else {
            train.push(it);
        }
    }
    let report = ValSplitReport {
        rule: match vs.rule {
            ValRule::Fraction(_) => "fraction",
            ValRule::PerClass(_) => "per-class",
        }
        .into(),
        fraction: match vs.rule {
            ValRule::Fraction(f) => Some(f),
            ValRule::PerClass(_) => None,
        },
        per_class: match vs.rule {
            ValRule::PerClass(n) => Some(n),
            ValRule::Fraction(_) => None,
        },
        seed: vs.seed,
        hash: HASH.into(),
        train_inputs: train.len() as u64,
        val_inputs: val.len() as u64,
    };
    let held = format!(
        "held out of the training inputs by {} {}, seed {}",
        report.rule,
        vs.value(),
        vs.seed
    );
    if let Some(train) = inputs.labels.get("train").cloned() {
        let rule = format!("{} ({held})", train.rule);
        inputs
            .labels
            .insert("val".into(), LabelSource { rule, ..train });
    }
    inputs.layouts.insert("val".into(), held);
    for (name, split) in [("train", train), ("val", val)] {
        if !split.is_empty() {
            inputs.splits.insert(name.into(), split);
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pack::option_error::PackOption;

    #[test]
    fn key_uses_the_file_name_only_and_spreads_evenly() {
        assert_eq!(
            key(0, "n01", "n01.tar/n01_5.JPEG"),
            key(0, "n01", "n01_5.JPEG")
        );
        assert_ne!(key(0, "n01", "a.JPEG"), key(1, "n01", "a.JPEG"));
        assert_ne!(key(0, "n01", "a.JPEG"), key(0, "n02", "a.JPEG"));
        let held = (0..20_000)
            .filter(|i| below(key(7, "n01", &format!("n01_{i}.JPEG")), 0.1))
            .count();
        assert!((1_800..2_200).contains(&held), "{held} of 20000 at 0.1");
    }

    #[test]
    fn values_are_checked_naming_the_option() {
        let bad = ValSplit {
            rule: ValRule::Fraction(1.0),
            seed: 0,
        };
        let e = bad.validate().unwrap_err();
        assert_eq!(
            (e.option, e.value.as_deref()),
            (PackOption::ValFraction, Some("1"))
        );
        let bad = ValSplit {
            rule: ValRule::PerClass(0),
            seed: 0,
        };
        assert_eq!(bad.validate().unwrap_err().option, PackOption::ValPerClass);
    }
}
