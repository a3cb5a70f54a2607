//! The `priority` schedule of one rank across steps ([`Schedule`]); `serve.rs` runs it.

use std::time::Instant;

use ddl_comm::priority::Negotiator;
use ddl_comm::CommOrder;

use super::buckets::Layout;
use crate::device::Event;

/// The `priority` schedule of one rank, across steps.
pub(super) struct Schedule {
    pub(super) negotiator: Negotiator,
    /// Per bucket, the instance being reduced: the bucket sequence number before its step's
    /// first bucket, the event after its copy to the host buffer, and when it was handed over.
    pub(super) in_flight: Vec<Option<(u64, Event, Instant)>>,
    /// Buckets whose reduction or update is still pending after a step returned.
    pub(super) unflushed: bool,
}

impl Schedule {
    /// The schedule of `layout`'s buckets in `order` (none under `fifo`): each bucket's
    /// priority is its stage.
    pub(super) fn of(order: CommOrder, layout: &Layout) -> Option<Self> {
        let CommOrder::Priority { chunk_bytes } = order else {
            return None;
        };
        let buckets = layout.buckets.iter().map(|b| (b.stage, b.len));
        let negotiator = Negotiator::new(buckets, (chunk_bytes / 4).max(1));
        Some(Schedule {
            in_flight: (0..negotiator.buckets()).map(|_| None).collect(),
            negotiator,
            unflushed: false,
        })
    }

    /// Whether updates are pending (a flush must come before the weights are read).
    pub(super) fn unflushed(&self) -> bool {
        self.unflushed
    }
}
