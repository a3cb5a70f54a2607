//! The multi-dimensional ring ([`crate::Algorithm::Multiring`]): the ring's executor
//! ([`super::ring::multiring`]) over the dimensions of the topology or the user's, the buffer
//! cut into pipeline segments whose tiers overlap.

use super::messages::{Messages, Scratch};
use super::ring::multiring;
use super::Context;
use crate::cost::CostModel;
use crate::error::{CommError, Result};
use crate::tags::{MAX_DIMS, MAX_SEGMENTS};
use crate::topology::Topology;
use crate::transport::Transport;

/// The multi-dimensional ring over `dims` (empty: the topology's) in `segments` pipeline
/// segments (0: as [`segments_for`] picks).
pub(crate) struct Multiring {
    dims: Vec<usize>,
    segments: usize,
}

impl Multiring {
    /// Over `dims` (empty: the topology's) in `segments` segments (0: automatic).
    pub(crate) fn new(dims: Vec<usize>, segments: usize) -> Multiring {
        Multiring { dims, segments }
    }

    /// Its dimensions in `topo`.
    fn dims_in<'a>(&'a self, topo_dims: &'a [usize]) -> &'a [usize] {
        if self.dims.is_empty() {
            topo_dims
        } else {
            &self.dims
        }
    }
}

impl Messages for Multiring {
    fn setup(&mut self, cx: &Context) -> Result<()> {
        let p = cx.transport.size();
        let dims = self.dims_in(&cx.dims);
        if dims.iter().product::<usize>() != p || dims.len() > MAX_DIMS {
            return Err(CommError::InvalidArgument(format!(
                "multiring dimensions {dims:?} do not multiply to {p} ranks (at most {MAX_DIMS} dimensions)"
            )));
        }
        Ok(())
    }

    fn run(
        &self,
        cx: &Context,
        t: &dyn Transport,
        buf: &mut [f32],
        scratch: &mut Scratch,
    ) -> Result<()> {
        let dims = self.dims_in(&cx.dims);
        let segments = segments_for(dims, std::mem::size_of_val(buf), self.segments);
        multiring(
            t,
            dims,
            segments,
            buf,
            &mut scratch.recv,
            &mut scratch.steps,
        )
    }

    fn cost(&self, model: &CostModel, bytes: usize, topo: Topology) -> f64 {
        let topo_dims = topo.dims();
        let dims = self.dims_in(&topo_dims);
        let segments = segments_for(dims, bytes, self.segments);
        model.multiring_time(dims, segments, bytes as f64, topo)
    }
}

/// Smallest message per rank and round that the automatic segment count allows: a segment
/// of `b` bytes over `p` ranks moves messages of `b / p` bytes in its last-tier rounds. Smaller
/// messages make every round pay rendezvous handshakes queued behind a loaded link
/// (BENCHMARKS.md, "Figures behind the defaults").
pub(crate) const MIN_SEGMENT_MESSAGE: usize = 512 << 10;

/// Most pipeline segments chosen automatically.
pub(crate) const AUTO_MAX_SEGMENTS: usize = 16;

/// The number of pipeline segments for `bytes` over `dims`: `requested` if non-zero,
/// otherwise, when at least two dimensions exceed 1 (with one there is nothing to overlap),
/// as many as keep every message at [`MIN_SEGMENT_MESSAGE`] or more (at most
/// [`AUTO_MAX_SEGMENTS`]); clamped to `1..=MAX_SEGMENTS`.
pub(crate) fn segments_for(dims: &[usize], bytes: usize, requested: usize) -> usize {
    let tiers = dims.iter().filter(|&&d| d > 1).count();
    let ranks: usize = dims.iter().product();
    let s = if requested > 0 {
        requested
    } else if tiers >= 2 {
        (bytes / (ranks.max(1) * MIN_SEGMENT_MESSAGE)).clamp(1, AUTO_MAX_SEGMENTS)
    } else {
        1
    };
    s.clamp(1, MAX_SEGMENTS)
}
