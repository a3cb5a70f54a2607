//! What makes two runs the same pack: the input directory and every option value that shapes
//! the shards (not the thread count, the skip limit or `force`). The resume state records the
//! pack's identity; a run whose identity matches resumes the directory, any other run meets
//! another pack's files (see `output.rs` and `loader/FORMAT.md`).
//!
//! Identity v2 (this build) hashes the option values themselves, so renaming a command-line
//! flag changes no pack's identity. Version 1 (ddl-pack up to 959e01e) hashed the flags in
//! words; a state carrying a v1 fingerprint is still recognised ([`super::identity_v1`]) and is
//! rewritten as v2 when the run claims the directory.

use std::path::Path;

use super::fnv::Fnv;
use super::identity_v1;
use super::options::PackOptions;
use super::spec::{PackSpec, ShardCount, ShardOrder};
use super::val_split::{ValRule, ValSplit};

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
