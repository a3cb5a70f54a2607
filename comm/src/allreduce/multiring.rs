//! The multi-dimensional ring ([`crate::Algorithm::Multiring`]): the ring's executor
//! ([`super::ring::multiring`]) over the dimensions of the topology or the user's, the buffer
//! cut into pipeline segments whose tiers overlap.

use super::context::{Allreduce, Context, Scratch};
use super::declare::{positive, Declare, Declared};
use super::messages::Messages;
use super::ring::multiring;
use crate::cost::CostModel;
use crate::error::{CommError, Result};
use crate::tags::{MAX_DIMS, MAX_SEGMENTS};
use crate::topology::Topology;
use crate::transport::Transport;

/// The multi-dimensional ring's parameters ([`crate::Algorithm::Multiring`]): rings along each
/// of `dims` (fastest tier first), the buffer cut into `segments` pipeline segments whose
/// tiers overlap.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Multiring {
    /// Ring dimensions; their product must equal the number of ranks. Empty: the topology's.
    pub dims: Vec<usize>,
    /// Pipeline segments; 0 = automatic: as many as keep each rank's messages at 512 KiB or
    /// more (at most 16) when two or more dimensions exceed 1, otherwise 1 ([`segments_for`]).
    pub segments: usize,
}

impl Declare for Multiring {
    const DECLARED: Declared = Declared {
        name: "multiring",
        syntax: "multiring[:D1xD2x...[:SEGMENTS]]",
        help: "a ring along each dimension of the topology (or D1xD2x..., fastest tier first), \
               in pipeline segments whose tiers overlap (multiring::8: the topology's, 8 \
               segments)",
        auto: true,
    };

    fn parse(args: Option<&str>) -> Result<Multiring> {
        let mut it = args.unwrap_or("").splitn(2, ':');
        let dims = match it.next() {
            None | Some("") => Vec::new(),
            Some(d) => d
                .split('x')
                .map(|v| positive(v, "ring dimension"))
                .collect::<Result<Vec<_>>>()?,
        };
        let segments = match it.next() {
            None => 0,
            Some(v) => positive(v, "segment count")?,
        };
        Ok(Multiring { dims, segments })
    }

    fn args(&self) -> Option<String> {
        if self.dims.is_empty() && self.segments == 0 {
            return None;
        }
        let dims: Vec<String> = self.dims.iter().map(|d| d.to_string()).collect();
        let mut args = dims.join("x");
        if self.segments > 0 {
            args += &format!(":{}", self.segments);
        }
        Some(args)
    }

    fn build(&self) -> Box<dyn Allreduce> {
        Box::new(self.clone())
    }
}

impl Multiring {
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
