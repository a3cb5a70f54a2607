//! How a split becomes shards: the shard count, the file names, and the plan fingerprint that
//! tells a resumed run whether a finished shard still holds what this run would write.
//! Record `i` of a split's (label, name) order goes to shard `i % S`, or, in class order, to
//! the shard of its run of `n / S` consecutive records ([`ShardOrder`]).

use rayon::prelude::*;

use super::convert::{convert_read, process, ConvertOptions, Converted};
use super::fnv::Fnv;
use super::options::PackOptions;
use super::source::{read_in_place_order, read_together, sequential_only, Inputs, Item};
use super::spec::{ShardCount, ShardOrder};
use crate::format::{INDEX_ROW_LEN, RECORD_ALIGN};

/// Inputs converted per split to estimate its output size for [`ShardCount::Size`].
pub const SIZE_SAMPLE: usize = 128;

/// One split's plan.
pub(crate) struct SplitPlan<'a> {
    /// "train" or "val".
    pub name: String,
    /// Its inputs in (label, name) order.
    pub items: &'a [Item],
    /// Its shard count.
    pub shards: usize,
    /// Which inputs each shard holds.
    pub order: ShardOrder,
    /// Whether the inputs are read in their order in the source, every missing shard written
    /// at once ([`super::source::read_in_place_order`]), rather than shard by shard.
    pub streamed: bool,
    /// [`plan_fingerprint`] of it.
    pub plan: String,
}

/// The plan of every split of `inputs` under `opts`.
pub(crate) fn plan_splits<'a>(
    pool: &rayon::ThreadPool,
    inputs: &'a Inputs,
    opts: &PackOptions,
) -> Vec<SplitPlan<'a>> {
    inputs
        .splits
        .iter()
        .map(|(name, items)| {
            let bytes = match opts.shards {
                ShardCount::Size(_) => estimate_output_bytes(pool, inputs, items, &opts.convert),
                ShardCount::Count(_) => 0,
            };
            let shards = shard_count(opts.shards, items.len(), bytes, opts.nodes);
            SplitPlan {
                name: name.clone(),
                items,
                shards,
                order: opts.order,
                streamed: opts.order == ShardOrder::Interleaved && read_in_place_order(items),
                plan: plan_fingerprint(name, shards, opts, &inputs.classes, items),
            }
        })
        .collect()
}

impl SplitPlan<'_> {
    /// The positions in [`SplitPlan::items`] of the inputs of shard `s`, ascending.
    pub fn inputs_of(&self, s: usize) -> Vec<usize> {
        let n = self.items.len();
        match self.order {
            ShardOrder::Interleaved => (s..n).step_by(self.shards).collect(),
            ShardOrder::Class => (s * n / self.shards..(s + 1) * n / self.shards).collect(),
        }
    }

    /// The shard of every input, by position in [`SplitPlan::items`].
    pub fn shard_of_each(&self) -> Vec<u32> {
        let mut of = vec![0u32; self.items.len()];
        for s in 0..self.shards {
            for i in self.inputs_of(s) {
                of[i] = s as u32;
            }
        }
        of
    }
}

/// Fingerprint of everything that determines a split's shards (the interleaved order adds
/// nothing, so that its shards keep the fingerprints of builds without the class order).
fn plan_fingerprint(
    split: &str,
    shards: usize,
    opts: &PackOptions,
    classes: &[String],
    items: &[Item],
) -> String {
    let copts = &opts.convert;
    let mut h = Fnv::new();
    h.bytes(b"ddl-pack plan v1");
    h.bytes(split.as_bytes());
    h.bytes(&(shards as u64).to_le_bytes());
    h.bytes(&copts.max_short_side.to_le_bytes());
    h.bytes(&[copts.quality, u8::from(copts.reencode)]);
    h.bytes(env!("CARGO_PKG_VERSION").as_bytes());
    for c in classes {
        h.bytes(c.as_bytes());
    }
    for it in items {
        h.bytes(&it.label.to_le_bytes());
        h.bytes(it.name.as_bytes());
        h.bytes(&it.size.to_le_bytes());
    }
    if opts.order == ShardOrder::Class {
        h.bytes(b"class order");
    }
    h.hex()
}

/// Estimated bytes of a split's shards: the mean stored size (record, index row and alignment
/// padding) of an evenly spaced sample of converted inputs (the first inputs, where a gzip
/// stream holds them), times the input count. Falls back to the input bytes when no sampled
/// input converts.
fn estimate_output_bytes(
    pool: &rayon::ThreadPool,
    inputs: &Inputs,
    items: &[Item],
    copts: &ConvertOptions,
) -> u64 {
    let n = items.len();
    let k = n.min(SIZE_SAMPLE);
    let stored = |c: Converted| c.bytes.len() as u64 + INDEX_ROW_LEN as u64 + RECORD_ALIGN / 2;
    let sizes: Vec<u64> = pool.install(|| {
        if sequential_only(items) {
            // A gzip stream is read from its start: sample the first inputs, in one pass.
            let read: Vec<_> = items[..k]
                .chunk_by(read_together)
                .flat_map(|run| inputs.read_run(&run.iter().collect::<Vec<_>>()))
                .collect();
            return read
                .into_par_iter()
                .filter_map(|bytes| convert_read(bytes, copts).ok().map(stored))
                .collect();
        }
        (0..k)
            .into_par_iter()
            .filter_map(|j| process(inputs, &items[j * n / k], copts).ok().map(stored))
            .collect()
    });
    if sizes.is_empty() {
        return items.iter().map(|i| i.size).sum();
    }
    (sizes.iter().sum::<u64>() as f64 / sizes.len() as f64 * n as f64) as u64
}

/// Number of shards for a split of `items` inputs whose shards hold about `bytes`.
fn shard_count(count: ShardCount, items: usize, bytes: u64, nodes: usize) -> usize {
    let s = match count {
        ShardCount::Count(n) => n.max(1),
        ShardCount::Size(size) => {
            let s = bytes.div_ceil(size.max(1)).max(1) as usize;
            s.div_ceil(nodes) * nodes
        }
    };
    s.min(items).max(1)
}

/// The file name of shard `s` of `split`.
pub fn shard_file_name(split: &str, s: usize) -> String {
    format!("{split}-{s:05}.ddl")
}

/// The file name of every shard `plans` hold.
pub(crate) fn shard_files(plans: &[SplitPlan<'_>]) -> Vec<String> {
    plans
        .iter()
        .flat_map(|p| (0..p.shards).map(|s| shard_file_name(&p.name, s)))
        .collect()
}

/// Whether `name` looks like a shard this packer writes (`SPLIT-NNNNN.ddl`), and its split and
/// index.
pub(crate) fn parse_shard_name(name: &str) -> Option<(&str, usize)> {
    let stem = name.strip_suffix(".ddl")?;
    let (split, num) = stem.rsplit_once('-')?;
    if num.len() != 5 || !num.bytes().all(|b| b.is_ascii_digit()) || split.is_empty() {
        return None;
    }
    Some((split, num.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_counts() {
        assert_eq!(shard_count(ShardCount::Count(8), 100, 0, 3), 8);
        assert_eq!(shard_count(ShardCount::Count(8), 5, 0, 1), 5);
        assert_eq!(shard_count(ShardCount::Size(100), 1000, 1001, 1), 11);
        assert_eq!(shard_count(ShardCount::Size(100), 1000, 1001, 4), 12);
        assert_eq!(shard_count(ShardCount::Size(1 << 30), 10, 5, 4), 4);
        assert_eq!(shard_count(ShardCount::Size(1 << 30), 2, 5, 4), 2);
    }

    #[test]
    fn shard_names() {
        assert_eq!(shard_file_name("train", 7), "train-00007.ddl");
        assert_eq!(parse_shard_name("train-00007.ddl"), Some(("train", 7)));
        assert_eq!(parse_shard_name("val-12345.ddl"), Some(("val", 12345)));
        assert_eq!(parse_shard_name("train-7.ddl"), None);
        assert_eq!(parse_shard_name("notes.txt"), None);
    }
}
