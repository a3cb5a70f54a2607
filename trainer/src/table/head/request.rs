//! What replica 0 asks of the communication thread ([`Request`]); `exchange.rs` runs it.

use crate::device::Event;

/// What an exchange combines and runs across the ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// Rows concatenated in replica order, then all-gathered in rank order; every rank has as
    /// many rows (training).
    Gather,
    /// As `Gather`, with every rank's row count (and whether it still has batches) exchanged
    /// first (evaluation).
    GatherCounted,
    /// The element-wise maximum.
    Max,
    /// The element-wise sum.
    Sum,
    /// Summed, then each rank keeps its rows (every rank has as many).
    Scatter,
}

/// What replica 0 asks of the communication thread: exchange `seq`, whose rank-wide values
/// (`len` elements, rows of `width`) are at the start of the host buffer once `copied` is
/// complete; `rows`: the rank's rows of a gather, every rank's share of a reduce-scatter.
pub(crate) struct Request {
    pub(super) seq: u64,
    pub(super) op: Op,
    pub(super) rows: usize,
    pub(super) width: usize,
    pub(super) len: usize,
    pub(super) more: bool,
    pub(super) copied: Event,
}
