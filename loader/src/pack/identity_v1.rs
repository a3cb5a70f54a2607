//! Identity version 1, frozen: how ddl-pack up to 959e01e fingerprinted a pack, kept only so
//! that the directories it wrote are still recognised as the same pack (see `identity.rs` and
//! `loader/FORMAT.md`). It hashed the command-line flags in words; those byte strings are data
//! here, not flags, and must never change: a change would orphan every v1 directory.

use super::fnv::Fnv;
use super::spec::{PackSpec, ShardCount};
use super::val_split::ValRule;

/// The words v1 hashed for each value, byte for byte.
const SHARDS: &str = "--shards";
const SHARD_SIZE: &str = "--shard-size";
const MIN_PER_CLASS: &str = "--min-per-class";
const KEEP_EMPTY_CLASSES: &str = "--keep-empty-classes";
const VAL_FRACTION: &str = "--val-fraction";
const VAL_PER_CLASS: &str = "--val-per-class";
const VAL_SEED: &str = "--val-seed";

/// The v1 fingerprint of a pack with `spec`.
pub(crate) fn fingerprint(spec: &PackSpec) -> String {
    let mut h = Fnv::new();
    h.bytes(b"ddl-pack identity v1");
    h.bytes(spec.input.as_os_str().as_encoded_bytes());
    let shards = match spec.shards {
        ShardCount::Count(n) => format!("{SHARDS} {n}"),
        ShardCount::Size(b) => format!("{SHARD_SIZE} {b}B"),
    };
    h.bytes(shards.as_bytes());
    h.bytes(&spec.max_short_side.to_le_bytes());
    h.bytes(&[spec.quality, u8::from(spec.reencode)]);
    h.bytes(&(spec.nodes as u64).to_le_bytes());
    for list in [&spec.classes, &spec.synsets] {
        let text = list.as_ref().and_then(|p| std::fs::read(p).ok());
        h.bytes(text.as_deref().unwrap_or(b"-"));
    }
    // v1 hashed these only when given.
    let mut selection = String::new();
    if spec.min_per_class > 0 {
        selection.push_str(&format!(" {MIN_PER_CLASS} {}", spec.min_per_class));
    }
    if spec.keep_empty_classes {
        selection.push_str(&format!(" {KEEP_EMPTY_CLASSES}"));
    }
    if let Some(vs) = &spec.val_split {
        let flag = match vs.rule {
            ValRule::Fraction(_) => VAL_FRACTION,
            ValRule::PerClass(_) => VAL_PER_CLASS,
        };
        selection.push_str(&format!(" {flag} {} {VAL_SEED} {}", vs.value(), vs.seed));
    }
    if !selection.is_empty() {
        h.bytes(selection.as_bytes());
    }
    h.hex()
}
