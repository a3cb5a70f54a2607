//! Ring reduce-scatter and allgather over a strided group of ranks; the flat ring and the
//! multi-dimensional ring are built from them.

use std::ops::Range;

use super::util::{add_into, ensure_len, part};
use crate::error::Result;
use crate::transport::{f32_bytes, f32_bytes_mut, Op, Transport};

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

/// Reduce-scatter of `buf[region]` cut into `g.len` parts: afterwards member `me` holds the
/// sum of part `me` over the group. The sum of part k is accumulated in ring order starting
/// at member k+1: `((x[k+1] + x[k+2]) + ...) + x[k]`.
pub(crate) fn reduce_scatter(
    t: &dyn Transport,
    g: Group,
    buf: &mut [f32],
    region: Range<usize>,
    scratch: &mut Vec<f32>,
    tag: u32,
) -> Result<()> {
    let p = g.len;
    if p == 1 {
        return Ok(());
    }
    let right = g.rank(g.me + 1);
    let left = g.rank(g.me + p - 1);
    ensure_len(scratch, part(&region, p, 0).len());
    for s in 0..p - 1 {
        let send = part(&region, p, (g.me + 2 * p - s - 1) % p);
        let recv = part(&region, p, (g.me + 2 * p - s - 2) % p);
        let tmp = &mut scratch[..recv.len()];
        t.exchange(&mut [
            Op::Send {
                to: right,
                tag,
                data: f32_bytes(&buf[send]),
            },
            Op::Recv {
                from: left,
                tag,
                buf: f32_bytes_mut(tmp),
            },
        ])?;
        add_into(&mut buf[recv], tmp);
    }
    Ok(())
}

/// Allgather of `buf[region]` cut into `g.len` parts, member `me` holding part `me`.
pub(crate) fn allgather(
    t: &dyn Transport,
    g: Group,
    buf: &mut [f32],
    region: Range<usize>,
    tag: u32,
) -> Result<()> {
    let p = g.len;
    if p == 1 {
        return Ok(());
    }
    let right = g.rank(g.me + 1);
    let left = g.rank(g.me + p - 1);
    for s in 0..p - 1 {
        let send = part(&region, p, (g.me + p - s) % p);
        let recv = part(&region, p, (g.me + 2 * p - s - 1) % p);
        let (send_bytes, recv_bytes) = disjoint(buf, send, recv);
        t.exchange(&mut [
            Op::Send {
                to: right,
                tag,
                data: send_bytes,
            },
            Op::Recv {
                from: left,
                tag,
                buf: recv_bytes,
            },
        ])?;
    }
    Ok(())
}

/// Borrows two disjoint element ranges of `buf`: one shared (as bytes), one mutable.
fn disjoint(buf: &mut [f32], a: Range<usize>, b: Range<usize>) -> (&[u8], &mut [u8]) {
    if a.is_empty() {
        return (&[], f32_bytes_mut(&mut buf[b]));
    }
    if b.is_empty() {
        return (f32_bytes(&buf[a]), &mut []);
    }
    if a.end <= b.start {
        let (lo, hi) = buf.split_at_mut(b.start);
        (f32_bytes(&lo[a]), f32_bytes_mut(&mut hi[..b.end - b.start]))
    } else {
        assert!(b.end <= a.start, "ranges {a:?} and {b:?} overlap");
        let (lo, hi) = buf.split_at_mut(a.start);
        (f32_bytes(&hi[..a.end - a.start]), f32_bytes_mut(&mut lo[b]))
    }
}

/// Multi-dimensional ring over `dims` (rank = c0 + d0*(c1 + d1*(c2 + ...))): reduce-scatter
/// along each dimension in order, then allgather back in reverse. `dims = [p]` is the flat
/// ring. Every element is summed by exactly one rank and then copied, so all ranks end
/// bitwise identical.
pub(crate) fn multiring(
    t: &dyn Transport,
    dims: &[usize],
    buf: &mut [f32],
    scratch: &mut Vec<f32>,
    regions: &mut Vec<Range<usize>>,
) -> Result<()> {
    let me = t.rank();
    regions.clear();
    let mut region = 0..buf.len();
    let mut stride = 1;
    let mut groups = [Group {
        base: 0,
        stride: 1,
        len: 1,
        me: 0,
    }; MAX_DIMS];
    for (l, &d) in dims.iter().enumerate() {
        let c = (me / stride) % d;
        let g = Group {
            base: me - c * stride,
            stride,
            len: d,
            me: c,
        };
        groups[l] = g;
        reduce_scatter(t, g, buf, region.clone(), scratch, 2 * l as u32)?;
        regions.push(region.clone());
        region = part(&region, d, c);
        stride *= d;
    }
    for l in (0..dims.len()).rev() {
        allgather(t, groups[l], buf, regions[l].clone(), 2 * l as u32 + 1)?;
    }
    Ok(())
}

/// Most dimensions a multi-dimensional ring may have.
pub(crate) const MAX_DIMS: usize = 16;
