//! Ring reduce-scatter and allgather over strided groups of ranks, as lists of steps
//! ([`super::ring_steps`]) run by one executor, and its cost: the flat ring ([`Ring`]) is the multi-dimensional ring
//! ([`super::multiring`]) over one dimension.

use std::ops::Range;

use super::context::{Allreduce, Context, Scratch};
use super::declare::{no_args, Declare, Declared};
use super::element::add_into;
use super::messages::Messages;
use super::ring_steps::{multiring_steps, segment_offset, Step};
use super::util::{ensure_len, part, RawBuf};
use crate::cost::{CostModel, Round};
use crate::error::Result;
use crate::tags::{MAX_DIMS, MAX_SEGMENTS, RING};
use crate::topology::Topology;
use crate::transport::{Op, Transport};

/// Multi-dimensional ring over `dims` (rank = c0 + d0*(c1 + d1*(c2 + ...))): reduce-scatter
/// along each dimension in order, then allgather back in reverse. `dims = [p]` is the flat
/// ring.
///
/// The buffer is cut into `segments` pipeline segments, each running the whole multi-ring;
/// segment s starts [`segment_offset`] rounds after segment s - 1, and each round posts the
/// current step of every running segment in one exchange, so the fast tiers of some
/// segments overlap the slow tier of another. Every element is summed by exactly one rank
/// and then copied, so all ranks end bitwise identical.
pub(crate) fn multiring(
    t: &dyn Transport,
    dims: &[usize],
    segments: usize,
    buf: &mut [f32],
    scratch: &mut Vec<f32>,
    steps: &mut Vec<Step>,
) -> Result<()> {
    let me = t.rank();
    let n = buf.len();
    let segs = segments.clamp(1, MAX_SEGMENTS);
    steps.clear();
    let whole = 0..n;
    for s in 0..segs {
        multiring_steps(
            me,
            dims,
            part(&whole, segs, s),
            RING.tag((s * 2 * MAX_DIMS) as u32),
            steps,
        );
    }
    let per_seg = steps.len() / segs;
    // Largest part a segment ever receives to add: its first reduce-scatter part.
    let slot = part(&whole, segs, 0).len().div_ceil(dims[0].max(1));
    ensure_len(scratch, slot * segs);
    let offset = segment_offset(dims);
    let rounds = per_seg + (segs - 1) * offset;
    let raw = RawBuf::new(buf);
    let tmp = RawBuf::new(scratch);
    let mut ops: Vec<Op<'_>> = Vec::with_capacity(2 * segs);
    let mut adds: Vec<(usize, Range<usize>)> = Vec::with_capacity(segs);
    for round in 0..rounds {
        ops.clear();
        adds.clear();
        for s in 0..segs {
            let Some(i) = round.checked_sub(s * offset).filter(|&i| i < per_seg) else {
                continue;
            };
            let step = &steps[s * per_seg + i];
            // SAFETY: segments are disjoint; within a step the sent and received parts are
            // different parts of the segment, and each segment has its own scratch slot.
            let (data, dst) = unsafe {
                let data = raw.bytes(step.send.clone());
                let dst = if step.reduce {
                    let off = s * slot;
                    adds.push((off, step.recv.clone()));
                    tmp.bytes_mut(off..off + step.recv.len())
                } else {
                    raw.bytes_mut(step.recv.clone())
                };
                (data, dst)
            };
            ops.push(Op::Send {
                to: step.to,
                tag: step.tag,
                data,
            });
            ops.push(Op::Recv {
                from: step.from,
                tag: step.tag,
                buf: dst,
            });
        }
        t.exchange(&mut ops)?;
        ops.clear();
        for (off, range) in adds.drain(..) {
            // SAFETY: the exchange is complete; no other view of these ranges is alive.
            unsafe {
                let dst = std::slice::from_raw_parts_mut(raw.ptr_at(range.start), range.len());
                let src = std::slice::from_raw_parts(tmp.ptr_at(off), range.len());
                add_into(dst, src);
            }
        }
    }
    Ok(())
}

/// The flat ring ([`crate::Algorithm::Ring`]): reduce-scatter then allgather, `2(p-1)` steps
/// of `n/p`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Ring;

impl Declare for Ring {
    const DECLARED: Declared = Declared {
        name: "ring",
        syntax: "ring",
        help: "reduce-scatter then allgather around the ranks: 2(p-1) steps of n/p",
        auto: true,
    };

    fn parse(args: Option<&str>) -> Result<Ring> {
        no_args(&Self::DECLARED, args).map(|()| Ring)
    }

    fn build(&self) -> Box<dyn Allreduce> {
        Box::new(Ring)
    }
}

impl Messages for Ring {
    fn run(
        &self,
        _: &Context,
        t: &dyn Transport,
        buf: &mut [f32],
        scratch: &mut Scratch,
    ) -> Result<()> {
        multiring(
            t,
            &[t.size()],
            1,
            buf,
            &mut scratch.recv,
            &mut scratch.steps,
        )
    }

    fn cost(&self, model: &CostModel, bytes: usize, topo: Topology) -> f64 {
        model.multiring_time(&[topo.ranks()], 1, bytes as f64, topo)
    }
}

/// The executor's cost formula: the ring's, multiring's and part of `mpi`'s.
impl CostModel {
    /// Rounds of one segment of `n` bytes of a multi-dimensional ring over `dims` (of a
    /// `buffer`-byte allreduce).
    fn multiring_rounds(&self, dims: &[usize], buffer: f64, n: f64, topo: Topology) -> Vec<Round> {
        let mut per_dim = Vec::new();
        let (mut size, mut stride) = (n, 1usize);
        for &d in dims {
            if d > 1 {
                let msg = size / d as f64;
                let right = |r: usize| {
                    let c = (r / stride) % d;
                    r - c * stride + (c + 1) % d * stride
                };
                per_dim.push((
                    d,
                    self.pairs_round(topo, buffer, msg, true, right),
                    self.pairs_round(topo, buffer, msg, false, right),
                ));
                size = msg;
            }
            stride *= d;
        }
        let mut rounds = Vec::new();
        for (d, rs, _) in &per_dim {
            rounds.extend(std::iter::repeat_n(*rs, d - 1));
        }
        for (d, _, ag) in per_dim.iter().rev() {
            rounds.extend(std::iter::repeat_n(*ag, d - 1));
        }
        rounds
    }

    /// Seconds of a multi-dimensional ring in `segments` pipeline segments: the executor's
    /// rounds, each costing the sum of what its running segments do (see
    /// [`Round::time`]).
    pub(crate) fn multiring_time(
        &self,
        dims: &[usize],
        segments: usize,
        n: f64,
        topo: Topology,
    ) -> f64 {
        let segments = segments.max(1);
        let steps = self.multiring_rounds(dims, n, n / segments as f64, topo);
        let offset = segment_offset(dims);
        let rounds = steps.len() + (segments - 1) * offset;
        (0..rounds)
            .map(|round| {
                (0..segments)
                    .filter_map(|s| round.checked_sub(s * offset).and_then(|i| steps.get(i)))
                    .fold(Round::default(), |a, b| a.with(b))
                    .time()
            })
            .sum()
    }
}
