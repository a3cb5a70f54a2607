//! Reduce-scatter: each rank ends with its part of a buffer summed (or maxed) over all ranks.
//! The ring passes partial results around in `p - 1` steps; parts may have any lengths
//! ([`Parts`]).

use super::ops::{ring_neighbours, Reduce};
use crate::allreduce::util::{ensure_len, RawBuf};
use crate::error::Result;
use crate::parts::Parts;
use crate::tags::REDUCE_SCATTER;
use crate::transport::Transport;

/// One implementation of the reduce-scatter.
pub(crate) trait ReduceScatter {
    /// Leaves in this rank's part of `buf` that part combined with `op` over every rank's
    /// `buf`; the other parts of `buf` are left undefined. Every rank calls it with the same
    /// `parts` and `op`.
    fn reduce_scatter(
        &mut self,
        t: &dyn Transport,
        buf: &mut [f32],
        parts: &Parts,
        op: Reduce,
    ) -> Result<()>;
}

/// The ring: in step `s` rank `q` sends its running result of part `q - s - 1` to its right
/// neighbour, receives that of part `q - s - 2` from its left and combines it with its own
/// values, so part `k` is combined in ring order from rank `k + 1`:
/// `((x[k+1] op x[k+2]) op ...) op x[k]`, as the ring allreduce's first half does.
#[derive(Default)]
pub(crate) struct RingReduceScatter {
    /// What arrives in a step (grown to the largest part, never shrunk).
    recv: Vec<f32>,
}

impl ReduceScatter for RingReduceScatter {
    fn reduce_scatter(
        &mut self,
        t: &dyn Transport,
        buf: &mut [f32],
        parts: &Parts,
        op: Reduce,
    ) -> Result<()> {
        let (p, me) = (t.size(), t.rank());
        let (left, right) = ring_neighbours(me, p);
        let tag = REDUCE_SCATTER.tag(0);
        let largest = (0..p).map(|q| parts.count(q)).max().unwrap_or(0);
        ensure_len(&mut self.recv, largest);
        let raw = RawBuf::new(buf);
        for s in 0..p.saturating_sub(1) {
            let send = parts.range((me + 2 * p - s - 1) % p);
            let recv = parts.range((me + 2 * p - s - 2) % p);
            let got = &mut self.recv[..recv.len()];
            // SAFETY: the part sent is not the part combined below; the buffer outlives it.
            let data = unsafe { raw.bytes(send) };
            t.sendrecv(
                right,
                tag,
                data,
                left,
                tag,
                crate::transport::f32_bytes_mut(got),
            )?;
            // SAFETY: the exchange is complete; no other view of this part is alive.
            let mine = unsafe { std::slice::from_raw_parts_mut(raw.ptr_at(recv.start), got.len()) };
            op.combine(mine, got);
        }
        Ok(())
    }
}
