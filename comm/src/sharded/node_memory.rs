//! The allgather and reduce-scatter of the ranks of one node, through a [`SharedRegion`]
//! instead of messages.
//!
//! The buffer goes through in chunks of `chunk_bytes`. For each chunk every rank copies into
//! its slot what the others need from it (allgather: its own part of the chunk; reduce-scatter:
//! the whole chunk) and announces it; then each rank takes what it needs from the others'
//! slots (allgather: their parts; reduce-scatter: its own part of every slot, combined in rank
//! order) and says it is done with the chunk. Slots are reused every [`SLOTS`] chunks, once
//! every rank is done with the chunk that used them before. Each element of a reduce-scatter
//! is combined by its owner alone, in rank order, so the result does not depend on timing.

use super::allgather::Allgather;
use super::ops::Reduce;
use super::reduce_scatter::ReduceScatter;
use crate::error::Result;
use crate::parts::Parts;
use crate::shared_region::{Pace, SharedRegion, COUNTER_BYTES, LINE};
use crate::transport::Transport;

impl ShmSharded {
    /// Default chunk of the buffer per round, in bytes: each rank's slot holds one
    /// ([`ShardAlgorithm::SHM`](crate::ShardAlgorithm::SHM)).
    pub(crate) const DEFAULT_CHUNK_BYTES: usize = 256 << 10;
}

/// Slots per rank: chunk `j` uses slot `j % SLOTS`.
const SLOTS: usize = 2;

/// Counter 0 of a rank: chunks whose slot it has filled.
const ANNOUNCED: usize = 0;
/// Counter 1 of a rank: chunks it has taken what it needs from.
const DONE: usize = 1;

/// What a waiting rank reports in a timeout.
const OP: &str = "shm allgather/reduce-scatter";

/// The region of one node's group and how far this rank has got.
pub(crate) struct ShmSharded {
    region: SharedRegion,
    /// f32 elements of a chunk.
    chunk: usize,
    pace: Pace,
    /// Chunks this rank has started over all calls (the counters' next targets).
    started: u64,
}

/// What a round does with the chunk: [`Allgather`] or [`ReduceScatter`] with an operation.
#[derive(Clone, Copy)]
enum Work {
    Gather,
    Scatter(Reduce),
}

/// Elements of `part` that fall in the chunk `lo..hi`, relative to `lo`.
fn within(part: std::ops::Range<usize>, lo: usize, hi: usize) -> std::ops::Range<usize> {
    let (a, b) = (part.start.clamp(lo, hi), part.end.clamp(lo, hi));
    a - lo..b - lo
}

impl ShmSharded {
    /// Collective over `t`: the region for chunks of `chunk_bytes`, or `None` when the ranks do
    /// not all share one node's memory.
    pub(crate) fn create(t: &dyn Transport, chunk_bytes: usize) -> Result<Option<ShmSharded>> {
        let chunk_bytes = chunk_bytes.max(LINE).div_ceil(LINE) * LINE;
        let pace = Pace::of(t)?;
        let segment = COUNTER_BYTES + SLOTS * chunk_bytes;
        Ok(SharedRegion::create(t, segment)?.map(|region| ShmSharded {
            region,
            chunk: chunk_bytes / 4,
            pace,
            started: 0,
        }))
    }

    /// Slot `slot` of rank `q`.
    fn slot(&self, q: usize, slot: usize) -> *mut f32 {
        // SAFETY: within rank q's segment (see `create`).
        unsafe {
            self.region
                .segment(q)
                .add(COUNTER_BYTES + slot * self.chunk * 4)
                .cast()
        }
    }

    /// Runs every chunk of `buf` through the region (see the module doc).
    fn run(&mut self, t: &dyn Transport, buf: &mut [f32], parts: &Parts, work: Work) -> Result<()> {
        let (p, me) = (t.size(), t.rank());
        for (i, chunk) in buf.chunks_mut(self.chunk).enumerate() {
            let j = self.started;
            self.started += 1;
            let slot = (j % SLOTS as u64) as usize;
            let (lo, hi) = (i * self.chunk, i * self.chunk + chunk.len());
            if j >= SLOTS as u64 {
                // Every rank is done with the chunk that used this slot before.
                let target = j + 1 - SLOTS as u64;
                self.region.wait_all(t, 0..p, DONE, target, self.pace, OP)?;
            }
            let give = match work {
                Work::Gather => within(parts.range(me), lo, hi),
                Work::Scatter(_) => 0..chunk.len(),
            };
            // SAFETY: the slot holds a whole chunk, which no rank reads any more (waited above).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    chunk[give.clone()].as_ptr(),
                    self.slot(me, slot).add(give.start),
                    give.len(),
                )
            };
            self.region.publish(me, ANNOUNCED, j + 1);
            self.region
                .wait_all(t, 0..p, ANNOUNCED, j + 1, self.pace, OP)?;
            self.take(chunk, parts, (lo, hi), slot, work, (p, me));
            self.region.publish(me, DONE, j + 1);
        }
        Ok(())
    }

    /// What this rank takes from the others' slots of the chunk `bounds` of the buffer.
    fn take(
        &self,
        chunk: &mut [f32],
        parts: &Parts,
        (lo, hi): (usize, usize),
        slot: usize,
        work: Work,
        (p, me): (usize, usize),
    ) {
        // SAFETY (both arms): every rank has announced this chunk, so its slot holds what it
        // gives of it, unchanged until this rank says it is done.
        let from = |q: usize, r: &std::ops::Range<usize>| unsafe {
            std::slice::from_raw_parts(self.slot(q, slot).add(r.start).cast_const(), r.len())
        };
        match work {
            Work::Gather => {
                for q in (0..p).filter(|&q| q != me) {
                    let r = within(parts.range(q), lo, hi);
                    chunk[r.clone()].copy_from_slice(from(q, &r));
                }
            }
            Work::Scatter(op) => {
                let r = within(parts.range(me), lo, hi);
                let mine = &mut chunk[r.clone()];
                mine.copy_from_slice(from(0, &r));
                for q in 1..p {
                    op.combine(mine, from(q, &r));
                }
            }
        }
    }
}

impl Allgather for ShmSharded {
    fn all_gather(&mut self, t: &dyn Transport, buf: &mut [f32], parts: &Parts) -> Result<()> {
        self.run(t, buf, parts, Work::Gather)
    }
}

impl ReduceScatter for ShmSharded {
    fn reduce_scatter(
        &mut self,
        t: &dyn Transport,
        buf: &mut [f32],
        parts: &Parts,
        op: Reduce,
    ) -> Result<()> {
        self.run(t, buf, parts, Work::Scatter(op))
    }
}
