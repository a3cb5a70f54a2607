//! The steps of a ring reduce-scatter and allgather over strided groups of ranks, seen from
//! one rank: what the ring's executor ([`super::ring::multiring`]) runs and the multi-dimensional
//! ring's cost formula counts.

use std::ops::Range;

use super::util::part;
use crate::tags::MAX_DIMS;

/// Ranks `base + i * stride` for `i in 0..len`; this rank is member `me`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Group {
    pub base: usize,
    pub stride: usize,
    pub len: usize,
    pub me: usize,
}

impl Group {
    fn rank(&self, i: usize) -> usize {
        self.base + (i % self.len) * self.stride
    }
}

/// One step of a ring phase seen from one rank: send elements `send` to `to` while receiving
/// elements `recv` from `from`, then add them into the buffer (reduce-scatter) or keep them
/// as received (allgather).
#[derive(Clone, Debug)]
pub(crate) struct Step {
    pub(crate) to: usize,
    pub(crate) from: usize,
    pub(crate) send: Range<usize>,
    pub(crate) recv: Range<usize>,
    pub(crate) reduce: bool,
    pub(crate) tag: u32,
}

/// Appends the `g.len - 1` steps of a reduce-scatter (`reduce`) or allgather of `region` cut
/// into `g.len` parts. After the reduce-scatter member `me` holds the sum of part `me`,
/// accumulated in ring order starting at member `me + 1`: `((x[me+1] + x[me+2]) + ...) +
/// x[me]`; the allgather then passes every member's part around the ring.
fn ring_steps(g: Group, region: &Range<usize>, reduce: bool, tag: u32, out: &mut Vec<Step>) {
    let p = g.len;
    let right = g.rank(g.me + 1);
    let left = g.rank(g.me + p - 1);
    for s in 0..p.saturating_sub(1) {
        let (send, recv) = if reduce {
            ((g.me + 2 * p - s - 1) % p, (g.me + 2 * p - s - 2) % p)
        } else {
            ((g.me + p - s) % p, (g.me + 2 * p - s - 1) % p)
        };
        out.push(Step {
            to: right,
            from: left,
            send: part(region, p, send),
            recv: part(region, p, recv),
            reduce,
            tag,
        });
    }
}

/// Appends the steps of a multi-dimensional ring allreduce of `region` seen from rank `me`:
/// reduce-scatter along each dimension in order, then allgather back in reverse. Tags are
/// `tag_base + 2 * dimension (+ 1 for the allgather)`.
pub(crate) fn multiring_steps(
    me: usize,
    dims: &[usize],
    region: Range<usize>,
    tag_base: u32,
    out: &mut Vec<Step>,
) {
    let mut groups: [(Group, Range<usize>); MAX_DIMS] = std::array::from_fn(|_| {
        (
            Group {
                base: 0,
                stride: 1,
                len: 1,
                me: 0,
            },
            0..0,
        )
    });
    let mut region = region;
    let mut stride = 1;
    for (l, &d) in dims.iter().enumerate() {
        let c = (me / stride) % d;
        let g = Group {
            base: me - c * stride,
            stride,
            len: d,
            me: c,
        };
        groups[l] = (g, region.clone());
        ring_steps(g, &region, true, tag_base + 2 * l as u32, out);
        region = part(&region, d, c);
        stride *= d;
    }
    for l in (0..dims.len()).rev() {
        let (g, region) = &groups[l];
        ring_steps(*g, region, false, tag_base + 2 * l as u32 + 1, out);
    }
}

/// Rounds between the starts of two pipeline segments: the step count of the last (slowest)
/// tier's reduce-scatter and allgather, so that the slowest tier works on one segment after
/// the other without pause while the faster tiers work on the segments before and after.
pub(crate) fn segment_offset(dims: &[usize]) -> usize {
    let last = dims.iter().rev().find(|&&d| d > 1).copied().unwrap_or(1);
    (2 * (last - 1)).max(1)
}
