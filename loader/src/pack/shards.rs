//! Producing a split's shards: keeping those a previous run finished for the same plan (the
//! file on disk still intact), and converting and writing the others, each on its own in
//! order-preserving parallel windows so that the bytes do not depend on the thread count.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use rayon::prelude::*;

use super::convert::{convert, ConvertOptions, Converted, How, Skip, SkipReason};
use super::output::{save_state, DoneShard, PackState};
use super::progress::PackProgress;
use super::shard_plan::{shard_file_name, SplitPlan};
use super::source::{Inputs, Item};
use crate::error::Result;
use crate::manifest::ShardInfo;
use crate::shard::{tmp_path, ShardReader, ShardWriter};

/// Per-shard outcome gathered while packing or from the state file.
pub(crate) struct ShardOutcome {
    pub info: ShardInfo,
    pub done: DoneShard,
    /// Kept from a previous run rather than produced now.
    pub kept: bool,
}

/// Records per label of one shard, added to its split's totals as soon as the shard is done
/// (so that memory does not grow with shards x classes).
type LabelCounts = Vec<u64>;

/// The shards of every split as they are kept or written.
pub(crate) struct Tally {
    /// By (split, shard index).
    pub outcomes: BTreeMap<(String, usize), ShardOutcome>,
    /// Records per label, by split.
    pub class_records: BTreeMap<String, Vec<u64>>,
    /// Inputs in kept shards.
    pub kept_inputs: u64,
}

impl Tally {
    /// Adds shard `s` of `split` with its `per_label` records.
    fn add(&mut self, split: &str, s: usize, o: ShardOutcome, per_label: &[u64]) {
        let totals = self.class_records.get_mut(split).expect("a plan's split");
        for (t, n) in totals.iter_mut().zip(per_label) {
            *t += n;
        }
        self.outcomes.insert((split.to_string(), s), o);
    }
}

/// Keeps what a previous run finished and still matches the plan (checked in parallel: each
/// check reads the whole shard to compare its checksum); drops every other shard from `state`.
pub(crate) fn keep_finished(
    pool: &rayon::ThreadPool,
    out: &Path,
    plans: &[SplitPlan<'_>],
    state: &mut PackState,
    inputs: &Inputs,
    nodes: usize,
) -> Tally {
    let candidates: Vec<(&SplitPlan<'_>, usize)> = plans
        .iter()
        .flat_map(|p| (0..p.shards).map(move |s| (p, s)))
        .filter(|(p, s)| state.shards.contains_key(&shard_file_name(&p.name, *s)))
        .collect();
    let kept: Vec<Option<(ShardOutcome, LabelCounts)>> = pool.install(|| {
        candidates
            .par_iter()
            .map(|(p, s)| {
                let file = shard_file_name(&p.name, *s);
                kept_shard(out, &file, *s, p, state, inputs, nodes)
            })
            .collect()
    });
    let mut tally = Tally {
        outcomes: BTreeMap::new(),
        class_records: plans
            .iter()
            .map(|p| (p.name.clone(), vec![0u64; inputs.classes.len()]))
            .collect(),
        kept_inputs: 0,
    };
    for ((p, s), o) in candidates.into_iter().zip(kept) {
        if let Some((o, per_label)) = o {
            tally.kept_inputs += p.inputs_of(s).len() as u64;
            tally.add(&p.name, s, o, &per_label);
        }
    }
    let kept_files: HashSet<String> = tally
        .outcomes
        .keys()
        .map(|(sp, s)| shard_file_name(sp, *s))
        .collect();
    state.shards.retain(|f, _| kept_files.contains(f));
    tally
}

/// Returns the outcome of shard `s` if a previous run finished it for the same plan and the
/// file on disk is intact (size, whole-file checksum, index valid).
fn kept_shard(
    out: &Path,
    file: &str,
    s: usize,
    p: &SplitPlan<'_>,
    state: &PackState,
    inputs: &Inputs,
    nodes: usize,
) -> Option<(ShardOutcome, LabelCounts)> {
    let done = state.shards.get(file)?;
    if done.plan != p.plan {
        return None;
    }
    let path = out.join(file);
    let md = std::fs::metadata(&path).ok()?;
    if md.len() != done.bytes {
        return None;
    }
    let reader = ShardReader::open(&path).ok()?;
    if reader.len() as u64 != done.records || reader.file_crc32c() != done.crc32c {
        return None;
    }
    let mut per_label = vec![0u64; inputs.classes.len()];
    for i in 0..reader.len() {
        *per_label.get_mut(reader.row(i).label as usize)? += 1;
    }
    let done = done.clone();
    let outcome = ShardOutcome {
        info: ShardInfo {
            file: file.to_string(),
            records: done.records,
            bytes: done.bytes,
            crc32c: done.crc32c,
            node: s % nodes,
        },
        done,
        kept: true,
    };
    Some((outcome, per_label))
}

/// Converts one input.
pub(crate) fn process(
    inputs: &Inputs,
    item: &Item,
    copts: &ConvertOptions,
) -> std::result::Result<Converted, Skip> {
    let bytes = inputs.read(item).map_err(|e| Skip {
        reason: if e.kind() == std::io::ErrorKind::UnexpectedEof {
            SkipReason::Truncated
        } else {
            SkipReason::Unreadable
        },
        detail: e.to_string(),
    })?;
    convert(&bytes, copts)
}

/// What writing the missing shards needs besides the plans.
pub(crate) struct Writing<'a> {
    pub pool: &'a rayon::ThreadPool,
    pub out: &'a Path,
    pub inputs: &'a Inputs,
    pub convert: &'a ConvertOptions,
    pub nodes: usize,
    pub progress: &'a dyn PackProgress,
}

/// Writes every shard of `plans` that `tally` does not hold yet, recording each in `state`
/// (saved after each shard, so that an interruption loses at most the shard being written).
pub(crate) fn write_missing(
    w: &Writing<'_>,
    plans: &[SplitPlan<'_>],
    state: &mut PackState,
    tally: &mut Tally,
) -> Result<()> {
    // Inputs converted per parallel window: large enough that waiting for the slowest input of
    // a window costs little, small enough to keep memory bounded (a few MiB of JPEGs).
    let window = (w.pool.current_num_threads() * 256).max(512);
    for p in plans {
        for s in 0..p.shards {
            if tally.outcomes.contains_key(&(p.name.clone(), s)) {
                continue;
            }
            let (o, per_label) = pack_shard(w, p, s, window)?;
            state.shards.insert(o.info.file.clone(), o.done.clone());
            save_state(w.out, state)?;
            tally.add(&p.name, s, o, &per_label);
        }
    }
    Ok(())
}

/// Produces shard `s` of plan `p`; returns it with its records per label.
fn pack_shard(
    w: &Writing<'_>,
    p: &SplitPlan<'_>,
    s: usize,
    window: usize,
) -> Result<(ShardOutcome, LabelCounts)> {
    let file = shard_file_name(&p.name, s);
    let path = w.out.join(&file);
    let idx = p.inputs_of(s);
    let mut writer = ShardWriter::with_capacity(&path, idx.len() as u64)?;
    let mut done = DoneShard {
        plan: p.plan.clone(),
        records: 0,
        bytes: 0,
        crc32c: 0,
        copied: 0,
        reencoded: 0,
        resized: 0,
        skipped: Vec::new(),
    };
    let mut per_label = vec![0u64; w.inputs.classes.len()];
    for chunk in idx.chunks(window) {
        let results: Vec<_> = w.pool.install(|| {
            chunk
                .par_iter()
                .map(|&i| process(w.inputs, &p.items[i], w.convert))
                .collect()
        });
        for (&i, r) in chunk.iter().zip(results) {
            let item = &p.items[i];
            match r {
                Ok(c) => {
                    writer.push(&c.bytes, item.label, c.height, c.width)?;
                    per_label[item.label as usize] += 1;
                    match c.how {
                        How::Copied => done.copied += 1,
                        How::Reencoded => done.reencoded += 1,
                        How::Resized => done.resized += 1,
                    }
                }
                Err(sk) => done
                    .skipped
                    .push((i as u64, sk.reason.as_str().to_string(), sk.detail)),
            }
        }
        w.progress.advance(chunk.len() as u64);
    }
    let summary = writer.finish()?;
    debug_assert!(!tmp_path(&path).exists());
    done.records = summary.records;
    done.bytes = summary.bytes;
    done.crc32c = summary.crc32c;
    let outcome = ShardOutcome {
        info: ShardInfo {
            file,
            records: summary.records,
            bytes: summary.bytes,
            crc32c: summary.crc32c,
            node: s % w.nodes,
        },
        done,
        kept: false,
    };
    Ok((outcome, per_label))
}
