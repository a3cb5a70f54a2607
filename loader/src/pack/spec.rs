//! The option values that make a pack's identity ([`PackSpec`]) and the shard layout among
//! them: types every part of the packer and its errors name, kept below them all.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::val_split::{ValRule, ValSplit};

/// How many shards each split gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardCount {
    /// Exactly this many shards per split (capped at the split's input count).
    Count(usize),
    /// Shards of about this many bytes. The split's output size is estimated by converting an
    /// evenly spaced sample of up to [`super::SIZE_SAMPLE`] inputs (the first ones where a
    /// gzip-compressed tar holds them, read from its start; deterministic, so a rerun
    /// plans the same count); the count is rounded up to a multiple of the node count so every
    /// node holds the same number of shards.
    Size(u64),
}

/// Which inputs of a split's (label, name) order each of its `S` shards holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum ShardOrder {
    /// Input `i` goes to shard `i % S`: every shard holds every class, as training wants.
    #[default]
    Interleaved,
    /// Shard `s` holds inputs `s * n / S` to `(s + 1) * n / S - 1` of the `n`: consecutive
    /// shards hold consecutive classes, so a node of `P` (the shards `s % P == n`) holds about
    /// `1 / P` of the classes. Node-local order at its worst, for experiments that exchange
    /// records between nodes.
    Class,
}

impl ShardOrder {
    /// The order in words, as the manifest records it.
    pub fn describe(self) -> &'static str {
        match self {
            ShardOrder::Interleaved => {
                "per split, inputs sorted by (label, name) (parquet rows: by file and row); \
                 input i goes to shard i % shards"
            }
            ShardOrder::Class => {
                "per split, inputs sorted by (label, name) (parquet rows: by file and row); \
                 shard s holds inputs s * n / shards \
                 to (s + 1) * n / shards - 1 of the n (class order)"
            }
        }
    }
}

/// The option values of a pack that make its identity, as the state records them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PackSpec {
    /// The input, canonicalised where it exists.
    pub input: PathBuf,
    /// Shard count or size.
    pub shards: ShardCount,
    /// Which inputs each shard holds (interleaved in states written before there was a
    /// choice).
    #[serde(default)]
    pub order: ShardOrder,
    /// Shorter side limit (0: original size).
    pub max_short_side: u32,
    /// JPEG quality of re-encoded images.
    pub quality: u8,
    /// Every image re-encoded.
    pub reencode: bool,
    /// Nodes the shards are assigned to.
    pub nodes: usize,
    /// Class list file.
    pub classes: Option<PathBuf>,
    /// ILSVRC synset list.
    pub synsets: Option<PathBuf>,
    /// Smallest class kept (0: all).
    pub min_per_class: u64,
    /// Classes without training inputs kept.
    pub keep_empty_classes: bool,
    /// Held-out validation split.
    pub val_split: Option<ValSplit>,
}

impl PackSpec {
    /// The spec in this library's words (a command line writes its flags instead).
    pub fn in_words(&self) -> String {
        let mut s = format!("{} with ", self.input.display());
        match self.shards {
            ShardCount::Count(n) => s.push_str(&format!("{n} shards per split")),
            ShardCount::Size(b) => s.push_str(&format!("shards of about {b} bytes")),
        }
        if self.order == ShardOrder::Class {
            s.push_str(" in class order");
        }
        s.push_str(&format!(
            ", shorter side at most {} (0: original), quality {}{}, {} node(s)",
            self.max_short_side,
            self.quality,
            if self.reencode {
                ", all re-encoded"
            } else {
                ""
            },
            self.nodes
        ));
        if let Some(c) = &self.classes {
            s.push_str(&format!(", classes from {}", c.display()));
        }
        if let Some(c) = &self.synsets {
            s.push_str(&format!(", synsets from {}", c.display()));
        }
        if self.min_per_class > 0 {
            s.push_str(&format!(
                ", at least {} inputs per class",
                self.min_per_class
            ));
        }
        if self.keep_empty_classes {
            s.push_str(", empty classes kept");
        }
        if let Some(vs) = &self.val_split {
            let rule = match vs.rule {
                ValRule::Fraction(_) => "fraction",
                ValRule::PerClass(_) => "per class",
            };
            s.push_str(&format!(
                ", val held out by {rule} {} seed {}",
                vs.value(),
                vs.seed
            ));
        }
        s
    }
}
