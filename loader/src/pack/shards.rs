//! Producing a split's shards: keeping those a previous run finished for the same plan (the
//! file on disk still intact), and converting and writing the others, each on its own in
//! order-preserving parallel windows so that the bytes do not depend on the thread count.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use rayon::prelude::*;

use super::convert::{convert_read, process, ConvertOptions, Converted, How, Skip};
use super::output::{save_state, DoneShard, PackState};
use super::progress::PackProgress;
use super::shard_plan::{shard_file_name, SplitPlan};
use super::source::{place, read_together, Inputs, Item};
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
/// (saved after each shard, so that an interruption loses at most the shard being written, or
/// the group of shards of the streamed splits). The streamed splits are written together, in
/// one pass over their inputs per group of shards (a gzip stream read once, not once per
/// split).
pub(crate) fn write_missing(
    w: &Writing<'_>,
    plans: &[SplitPlan<'_>],
    state: &mut PackState,
    tally: &mut Tally,
) -> Result<()> {
    // Inputs converted per parallel window: large enough that waiting for the slowest input of
    // a window costs little, small enough to keep memory bounded (a few MiB of JPEGs).
    let window = (w.pool.current_num_threads() * 256).max(512);
    let missing: Vec<Vec<usize>> = plans
        .iter()
        .map(|p| {
            (0..p.shards)
                .filter(|s| !tally.outcomes.contains_key(&(p.name.clone(), *s)))
                .collect()
        })
        .collect();
    let (streamed, shard_by_shard): (Vec<usize>, Vec<usize>) =
        (0..plans.len()).partition(|&k| plans[k].streamed);
    let shards: Vec<(usize, usize)> = streamed
        .iter()
        .enumerate()
        .flat_map(|(j, &k)| missing[k].iter().map(move |&s| (j, s)))
        .collect();
    let streamed: Vec<&SplitPlan<'_>> = streamed.iter().map(|&k| &plans[k]).collect();
    for group in shards.chunks(MAX_STREAMED_SHARDS) {
        for ((j, s), o, per_label) in stream_shards(w, &streamed, group, window)? {
            state.shards.insert(o.info.file.clone(), o.done.clone());
            save_state(w.out, state)?;
            tally.add(&streamed[j].name, s, o, &per_label);
        }
    }
    for k in shard_by_shard {
        for &s in &missing[k] {
            let (o, per_label) = pack_shard(w, &plans[k], s, window)?;
            state.shards.insert(o.info.file.clone(), o.done.clone());
            save_state(w.out, state)?;
            tally.add(&plans[k].name, s, o, &per_label);
        }
    }
    Ok(())
}

/// A shard of a streamed split, written: (split, shard), its outcome and its records per label.
type Streamed = ((usize, usize), ShardOutcome, LabelCounts);

/// Shards written at once from one pass over the streamed splits' inputs: each holds an open
/// file and a write buffer, so that a pack of more shards takes one pass per group.
const MAX_STREAMED_SHARDS: usize = 256;

/// A shard being produced: its writer, its outcome so far and its records per label.
struct Open {
    writer: ShardWriter,
    done: DoneShard,
    per_label: LabelCounts,
}

impl Open {
    /// Adds input `i`'s conversion `r` to the shard.
    fn add(
        &mut self,
        i: usize,
        item: &Item,
        r: std::result::Result<Converted, Skip>,
    ) -> Result<()> {
        match r {
            Ok(c) => {
                self.writer.push(&c.bytes, item.label, c.height, c.width)?;
                self.per_label[item.label as usize] += 1;
                match c.how {
                    How::Copied => self.done.copied += 1,
                    How::Reencoded => self.done.reencoded += 1,
                    How::Resized => self.done.resized += 1,
                }
            }
            Err(sk) => {
                self.done
                    .skipped
                    .push((i as u64, sk.reason.as_str().to_string(), sk.detail))
            }
        }
        Ok(())
    }

    /// Finishes the shard `s` of `p`.
    fn finish(self, w: &Writing<'_>, s: usize) -> Result<(ShardOutcome, LabelCounts)> {
        let Open {
            writer,
            mut done,
            per_label,
        } = self;
        let file = writer
            .path()
            .file_name()
            .expect("a shard file")
            .to_string_lossy()
            .into_owned();
        let summary = writer.finish()?;
        done.records = summary.records;
        done.bytes = summary.bytes;
        done.crc32c = summary.crc32c;
        let info = ShardInfo {
            file,
            records: summary.records,
            bytes: summary.bytes,
            crc32c: summary.crc32c,
            node: s % w.nodes,
        };
        Ok((
            ShardOutcome {
                info,
                done,
                kept: false,
            },
            per_label,
        ))
    }
}

/// Starts shard `s` of `p`, to hold `records` inputs.
fn open_shard(w: &Writing<'_>, p: &SplitPlan<'_>, s: usize, records: usize) -> Result<Open> {
    let path = w.out.join(shard_file_name(&p.name, s));
    Ok(Open {
        writer: ShardWriter::with_capacity(&path, records as u64)?,
        done: DoneShard {
            plan: p.plan.clone(),
            records: 0,
            bytes: 0,
            crc32c: 0,
            copied: 0,
            reencoded: 0,
            resized: 0,
            skipped: Vec::new(),
        },
        per_label: vec![0u64; w.inputs.classes.len()],
    })
}

/// Produces the shards `group` ((split, shard) pairs, a split by its index in `plans`) of
/// streamed splits in one pass over their inputs in their place in the sources, a window at a
/// time: runs of inputs read together (a parquet row group's rows, a gzip-compressed tar's
/// members) are read as one task each ([`read_window`]), the next window while this one is
/// converted in parallel, and each record goes to its shard in its split's order, so that every
/// shard's bytes are those [`pack_shard`] would write.
fn stream_shards(
    w: &Writing<'_>,
    plans: &[&SplitPlan<'_>],
    group: &[(usize, usize)],
    window: usize,
) -> Result<Vec<Streamed>> {
    let shard_of: Vec<Vec<u32>> = plans.iter().map(|p| p.shard_of_each()).collect();
    let mut open: BTreeMap<(usize, usize), Open> = BTreeMap::new();
    for &(k, s) in group {
        let p = plans[k];
        open.insert((k, s), open_shard(w, p, s, p.inputs_of(s).len())?);
    }
    // Every split's inputs are in place order: merged (stably) into one pass over the sources.
    let mut wanted: Vec<(usize, usize)> = Vec::new();
    for (k, p) in plans.iter().enumerate() {
        let of = &shard_of[k];
        wanted.extend(
            (0..p.items.len())
                .filter(|&i| open.contains_key(&(k, of[i] as usize)))
                .map(|i| (k, i)),
        );
    }
    let item = |&(k, i): &(usize, usize)| &plans[k].items[i];
    wanted.sort_by(|a, b| place(item(a)).cmp(&place(item(b))));
    let chunks: Vec<&[(usize, usize)]> = wanted.chunks(window).collect();
    let mut next = w
        .pool
        .install(|| read_window(w, plans, chunks.first().copied()));
    for (c, chunk) in chunks.iter().enumerate() {
        // The next window is read (a gzip stream: on one thread) while this one converts.
        let bytes = std::mem::take(&mut next);
        let (converted, following): (Vec<std::result::Result<Converted, Skip>>, _) =
            w.pool.install(|| {
                rayon::join(
                    || {
                        bytes
                            .into_par_iter()
                            .map(|b| convert_read(b, w.convert))
                            .collect()
                    },
                    || read_window(w, plans, chunks.get(c + 1).copied()),
                )
            });
        next = following;
        for (&(k, i), r) in chunk.iter().zip(converted) {
            let s = shard_of[k][i] as usize;
            open.get_mut(&(k, s))
                .expect("an open shard")
                .add(i, &plans[k].items[i], r)?;
        }
        w.progress.advance(chunk.len() as u64);
    }
    open.into_iter()
        .map(|((k, s), o)| o.finish(w, s).map(|(o, per_label)| ((k, s), o, per_label)))
        .collect()
}

/// The bytes of the inputs `chunk` ((split, input) pairs) of `plans` (none without a chunk), in
/// order: each run of inputs read together is read by one task, the runs in parallel.
fn read_window(
    w: &Writing<'_>,
    plans: &[&SplitPlan<'_>],
    chunk: Option<&[(usize, usize)]>,
) -> Vec<std::io::Result<Vec<u8>>> {
    let Some(chunk) = chunk else {
        return Vec::new();
    };
    let item = |&(k, i): &(usize, usize)| &plans[k].items[i];
    let runs: Vec<&[(usize, usize)]> = chunk
        .chunk_by(|a, b| read_together(item(a), item(b)))
        .collect();
    let read: Vec<Vec<std::io::Result<Vec<u8>>>> = runs
        .par_iter()
        .map(|run| w.inputs.read_run(&run.iter().map(item).collect::<Vec<_>>()))
        .collect();
    read.into_iter().flatten().collect()
}

/// Produces shard `s` of plan `p`; returns it with its records per label.
fn pack_shard(
    w: &Writing<'_>,
    p: &SplitPlan<'_>,
    s: usize,
    window: usize,
) -> Result<(ShardOutcome, LabelCounts)> {
    let idx = p.inputs_of(s);
    let mut open = open_shard(w, p, s, idx.len())?;
    for chunk in idx.chunks(window) {
        let results: Vec<_> = w.pool.install(|| {
            chunk
                .par_iter()
                .map(|&i| process(w.inputs, &p.items[i], w.convert))
                .collect()
        });
        for (&i, r) in chunk.iter().zip(results) {
            open.add(i, &p.items[i], r)?;
        }
        w.progress.advance(chunk.len() as u64);
    }
    let path = open.writer.path().to_path_buf();
    let done = open.finish(w, s)?;
    debug_assert!(!tmp_path(&path).exists());
    Ok(done)
}
