//! What makes two runs the same pack: the input directory and every option value that shapes
//! the shards (not the thread count, the skip limit or `force`). The resume state records the
//! pack's identity; a run whose identity matches resumes the directory, any other run meets
//! another pack's files (see `output.rs` and `loader/FORMAT.md`).
//!
//! Identity v2 (this build) hashes the option values themselves, so renaming a command-line
//! flag changes no pack's identity. Version 1 (ddl-pack up to 959e01e) hashed the flags in
//! words; a state carrying a v1 fingerprint is still recognised ([`super::identity_v1`]) and is
//! rewritten as v2 when the run claims the directory.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::fnv::Fnv;
use super::identity_v1;
use super::options::{PackOptions, ShardCount, ShardOrder};
use super::split::{ValRule, ValSplit};

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
    /// The spec of a pack with `opts`.
    pub fn of(opts: &PackOptions) -> PackSpec {
        PackSpec {
            input: opts
                .input
                .canonicalize()
                .unwrap_or_else(|_| opts.input.clone()),
            shards: opts.shards,
            order: opts.order,
            max_short_side: opts.convert.max_short_side,
            quality: opts.convert.quality,
            reencode: opts.convert.reencode,
            nodes: opts.nodes,
            classes: opts.classes.clone(),
            synsets: opts.synsets.clone(),
            min_per_class: opts.min_per_class,
            keep_empty_classes: opts.keep_empty_classes,
            val_split: opts.val_split,
        }
    }

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

/// A pack's identity: its spec and the fingerprints that recognise it on disk.
pub(crate) struct Identity {
    /// The option values.
    pub spec: PackSpec,
    /// Identity v2: a stable hash of the spec and the content of its lists.
    pub fingerprint: String,
    /// The version-1 fingerprint of the same pack, by which states written before v2 are
    /// recognised; none for a pack in class order, which no v1 build wrote.
    pub fingerprint_v1: Option<String>,
}

/// Adds the content of the list file `path` (or its absence): the lists shape the labels, and
/// a file that cannot be read was refused by discovery already.
fn hash_list(h: &mut Fnv, path: Option<&Path>) {
    match path.and_then(|p| std::fs::read(p).ok()) {
        Some(text) => {
            h.bytes(&[1]);
            h.bytes(&text);
        }
        None => h.bytes(&[0]),
    }
}

impl Identity {
    /// The identity of a pack with `opts` (the input must exist: [`super::source::discover`]
    /// has checked it).
    pub fn of(opts: &PackOptions) -> Identity {
        let spec = PackSpec::of(opts);
        let mut h = Fnv::new();
        h.bytes(b"ddl-pack identity v2");
        h.bytes(spec.input.as_os_str().as_encoded_bytes());
        match spec.shards {
            ShardCount::Count(n) => h.bytes(&[&[0u8][..], &(n as u64).to_le_bytes()].concat()),
            ShardCount::Size(b) => h.bytes(&[&[1u8][..], &b.to_le_bytes()].concat()),
        }
        h.bytes(&spec.max_short_side.to_le_bytes());
        h.bytes(&[spec.quality, u8::from(spec.reencode)]);
        h.bytes(&(spec.nodes as u64).to_le_bytes());
        hash_list(&mut h, spec.classes.as_deref());
        hash_list(&mut h, spec.synsets.as_deref());
        h.bytes(&spec.min_per_class.to_le_bytes());
        h.bytes(&[u8::from(spec.keep_empty_classes)]);
        match spec.val_split {
            None => h.bytes(&[0]),
            Some(ValSplit { rule, seed }) => {
                let (tag, value) = match rule {
                    ValRule::Fraction(f) => (1u8, f.to_bits()),
                    ValRule::PerClass(n) => (2u8, n),
                };
                h.bytes(&[tag]);
                h.bytes(&value.to_le_bytes());
                h.bytes(&seed.to_le_bytes());
            }
        }
        // Added after the rest, and only for the class order: a pack in the interleaved order
        // keeps the identity it had before there was a choice.
        let interleaved = spec.order == ShardOrder::Interleaved;
        if !interleaved {
            h.bytes(b"class order");
        }
        Identity {
            fingerprint_v1: interleaved.then(|| identity_v1::fingerprint(&spec)),
            fingerprint: h.hex(),
            spec,
        }
    }

    /// Whether the fingerprint `recorded` in a state is this pack's (v2, or v1 from an older
    /// build).
    pub fn recognises(&self, recorded: &str) -> bool {
        recorded == self.fingerprint || self.fingerprint_v1.as_deref() == Some(recorded)
    }
}
