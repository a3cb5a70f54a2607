//! Allgather: every rank's part of a buffer ends on every rank. The ring passes each part
//! around in `p - 1` steps; parts may have any lengths ([`Parts`]).

use super::ops::ring_neighbours;
use crate::allreduce::util::RawBuf;
use crate::error::Result;
use crate::parts::Parts;
use crate::tags::ALLGATHER;
use crate::transport::Transport;

/// One implementation of the allgather.
pub(crate) trait Allgather {
    /// Fills every other rank's part of `buf` with that rank's part of its `buf`; this rank's
    /// own part is its input and stays as it is. Every rank calls it with the same `parts`.
    fn all_gather(&mut self, t: &dyn Transport, buf: &mut [f32], parts: &Parts) -> Result<()>;
}

/// The ring: in step `s` rank `q` sends part `q - s` to its right neighbour and receives part
/// `q - s - 1` from its left, so each rank sends every part but its right neighbour's once.
pub(crate) struct RingAllgather;

impl Allgather for RingAllgather {
    fn all_gather(&mut self, t: &dyn Transport, buf: &mut [f32], parts: &Parts) -> Result<()> {
        let (p, me) = (t.size(), t.rank());
        let (left, right) = ring_neighbours(me, p);
        let tag = ALLGATHER.tag(0);
        let raw = RawBuf::new(buf);
        for s in 0..p.saturating_sub(1) {
            let send = parts.range((me + p - s) % p);
            let recv = parts.range((me + 2 * p - s - 1) % p);
            // SAFETY: two different parts of the buffer, which outlives the call.
            let (data, into) = unsafe { (raw.bytes(send), raw.bytes_mut(recv)) };
            t.sendrecv(right, tag, data, left, tag, into)?;
        }
        Ok(())
    }
}
