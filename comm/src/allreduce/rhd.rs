//! Rabenseifner's allreduce: reduce-scatter by recursive halving, allgather by recursive
//! doubling, for any rank count (ranks beyond the largest power of two are folded in).

use std::ops::Range;

use super::context::{Allreduce, Context, Scratch};
use super::declare::{no_args, Declare, Declared};
use super::element::add_into;
use super::messages::Messages;
use super::util::{ensure_len, RawBuf};
use crate::cost::CostModel;
use crate::error::Result;
use crate::tags::RHD;
use crate::topology::Topology;
use crate::transport::{f32_bytes, f32_bytes_mut, Op, Transport};

const TAG_FOLD: u32 = RHD.tag(0);
const TAG_HALVE: u32 = RHD.tag(1);
const TAG_DOUBLE: u32 = RHD.tag(2);
const TAG_UNFOLD: u32 = RHD.tag(3);

/// Element range of blocks `b` when `n` elements are cut into `blocks` near-equal blocks.
fn block_elems(n: usize, blocks: usize, b: Range<usize>) -> Range<usize> {
    let start = |i: usize| i * (n / blocks) + i.min(n % blocks);
    start(b.start)..start(b.end)
}

/// Sums `buf` over all ranks of `t`.
///
/// With p' the largest power of two <= p and e = p - p': ranks 2i and 2i+1 (i < e) first
/// combine into the odd rank; the p' remaining ranks halve the buffer at distances
/// 1, 2, 4, ... (so the largest transfers stay between neighbouring, node-local ranks),
/// each ending with one block summed, then double it back; the odd ranks finally send the
/// result to their even partners. Each block is summed by one rank only and then copied,
/// so all ranks end bitwise identical.
pub(crate) fn allreduce(t: &dyn Transport, buf: &mut [f32], scratch: &mut Vec<f32>) -> Result<()> {
    let p = t.size();
    let r = t.rank();
    if p == 1 {
        return Ok(());
    }
    let n = buf.len();
    let pow = 1usize << (usize::BITS - 1 - p.leading_zeros());
    let extra = p - pow;
    // Fold.
    let newrank = if r < 2 * extra {
        if r % 2 == 0 {
            t.send(r + 1, TAG_FOLD, f32_bytes(buf))?;
            None
        } else {
            ensure_len(scratch, n);
            t.recv(r - 1, TAG_FOLD, f32_bytes_mut(&mut scratch[..n]))?;
            add_into(buf, &scratch[..n]);
            Some(r / 2)
        }
    } else {
        Some(r - extra)
    };
    let real = |nr: usize| if nr < extra { 2 * nr + 1 } else { nr + extra };
    if let Some(nr) = newrank {
        ensure_len(scratch, n);
        // Block ranges kept at each halving step, to walk back while doubling.
        let mut stack: [Range<usize>; usize::BITS as usize] = std::array::from_fn(|_| 0..0);
        let mut blocks = 0..pow;
        let mut d = 1;
        let mut level = 0;
        while d < pow {
            let partner = real(nr ^ d);
            let half = blocks.start + (blocks.end - blocks.start) / 2;
            let (keep, give) = if nr & d == 0 {
                (blocks.start..half, half..blocks.end)
            } else {
                (half..blocks.end, blocks.start..half)
            };
            let keep_e = block_elems(n, pow, keep.clone());
            let give_e = block_elems(n, pow, give);
            let tmp = &mut scratch[..keep_e.len()];
            t.exchange(&mut [
                Op::Send {
                    to: partner,
                    tag: TAG_HALVE,
                    data: f32_bytes(&buf[give_e]),
                },
                Op::Recv {
                    from: partner,
                    tag: TAG_HALVE,
                    buf: f32_bytes_mut(tmp),
                },
            ])?;
            add_into(&mut buf[keep_e], tmp);
            stack[level] = blocks.clone();
            blocks = keep;
            d *= 2;
            level += 1;
        }
        let raw = RawBuf::new(buf);
        while level > 0 {
            level -= 1;
            d /= 2;
            let partner = real(nr ^ d);
            let parent = stack[level].clone();
            let other = if blocks.start == parent.start {
                blocks.end..parent.end
            } else {
                parent.start..blocks.start
            };
            // SAFETY: `blocks` and `other` are disjoint halves of `parent`; `buf` outlives
            // the exchange.
            let (mine, theirs) = unsafe {
                (
                    raw.bytes(block_elems(n, pow, blocks.clone())),
                    raw.bytes_mut(block_elems(n, pow, other)),
                )
            };
            t.exchange(&mut [
                Op::Send {
                    to: partner,
                    tag: TAG_DOUBLE,
                    data: mine,
                },
                Op::Recv {
                    from: partner,
                    tag: TAG_DOUBLE,
                    buf: theirs,
                },
            ])?;
            blocks = parent;
        }
    }
    // Unfold.
    if r < 2 * extra {
        if r % 2 == 0 {
            t.recv(r + 1, TAG_UNFOLD, f32_bytes_mut(buf))?;
        } else {
            t.send(r - 1, TAG_UNFOLD, f32_bytes(buf))?;
        }
    }
    Ok(())
}

/// Rabenseifner's allreduce ([`crate::Algorithm::Rhd`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Rhd;

impl Declare for Rhd {
    const DECLARED: Declared = Declared {
        name: "rhd",
        syntax: "rhd",
        help: "Rabenseifner's recursive halving then doubling: 2 log2(p) steps, ranks beyond a \
               power of two folded in",
        auto: true,
    };

    fn parse(args: Option<&str>) -> Result<Rhd> {
        no_args(&Self::DECLARED, args).map(|()| Rhd)
    }

    fn build(&self) -> Box<dyn Allreduce> {
        Box::new(Rhd)
    }
}

impl Messages for Rhd {
    fn run(
        &self,
        _: &Context,
        t: &dyn Transport,
        buf: &mut [f32],
        scratch: &mut Scratch,
    ) -> Result<()> {
        allreduce(t, buf, &mut scratch.recv)
    }

    fn cost(&self, model: &CostModel, bytes: usize, topo: Topology) -> f64 {
        model.recursive_time(bytes as f64, topo, true)
    }
}

/// The cost formula of recursive halving and doubling (`rhd`'s, and part of `mpi`'s).
impl CostModel {
    /// Seconds of recursive halving and doubling (Rabenseifner; `halving`) or recursive
    /// doubling of the whole buffer (otherwise), with the extra ranks folded in and out.
    pub(crate) fn recursive_time(&self, n: f64, topo: Topology, halving: bool) -> f64 {
        let p = topo.ranks();
        let pow = 1usize << (usize::BITS - 1 - p.leading_zeros());
        let extra = p - pow;
        let real = |nr: usize| if nr < extra { 2 * nr + 1 } else { nr + extra };
        let virt = |r: usize| {
            if r < 2 * extra {
                (r % 2 == 1).then_some(r / 2)
            } else {
                Some(r - extra)
            }
        };
        let mut t = 0.0;
        if extra > 0 {
            let fold = |r: usize| {
                if r < 2 * extra && r % 2 == 0 {
                    r + 1
                } else {
                    r
                }
            };
            let unfold = |r: usize| {
                if r < 2 * extra && r % 2 == 1 {
                    r - 1
                } else {
                    r
                }
            };
            t += self.pairs_round(topo, n, n, true, fold).time();
            t += self.pairs_round(topo, n, n, false, unfold).time();
        }
        let mut d = 1;
        let mut size = n;
        while d < pow {
            if halving {
                size /= 2.0;
            }
            let partner = |r: usize| virt(r).map_or(r, |nr| real(nr ^ d));
            t += self.pairs_round(topo, n, size, true, partner).time();
            if halving {
                t += self.pairs_round(topo, n, size, false, partner).time();
            }
            d *= 2;
        }
        t
    }
}
