//! The message-tag registry: every algorithm and control message of ddl has its own range of
//! tags, so that no two kinds of message can ever be matched against each other, whatever
//! runs concurrently on the same communicator.
//!
//! Each range starts where the one before it ends ([`TagRange::after`]); the unit test below
//! checks that all of them are disjoint and fit below [`MAX_TAG`].

/// Largest tag an application may use (MPI guarantees at least 32767).
pub const MAX_TAG: u32 = 32767;

/// Most dimensions a multi-dimensional ring may have (the size of [`RING`]).
pub(crate) const MAX_DIMS: usize = 16;

/// Most pipeline segments of the multi-dimensional ring (the size of [`RING`]).
pub(crate) const MAX_SEGMENTS: usize = 64;

/// Most colors of the multicolor algorithm (the size of [`MULTICOLOR`]).
pub(crate) const MAX_COLORS: usize = 1024;

/// A contiguous range of message tags owned by one algorithm or control message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TagRange {
    /// What sends with these tags.
    pub owner: &'static str,
    /// First tag of the range.
    pub start: u32,
    /// Number of tags.
    pub len: u32,
}

impl TagRange {
    /// The range of `len` tags that starts right after `prev`.
    pub const fn after(prev: TagRange, owner: &'static str, len: u32) -> TagRange {
        TagRange {
            owner,
            start: prev.start + prev.len,
            len,
        }
    }

    /// The `i`-th tag of the range (`i < len`).
    pub const fn tag(self, i: u32) -> u32 {
        assert!(i < self.len, "tag index outside its range");
        self.start + i
    }

    /// One past the last tag of the range.
    pub const fn end(self) -> u32 {
        self.start + self.len
    }
}

/// Ring and multi-dimensional ring: per pipeline segment and dimension, one tag for the
/// reduce-scatter and one for the allgather.
pub const RING: TagRange = TagRange {
    owner: "ring/multiring",
    start: 0,
    len: (2 * MAX_DIMS * MAX_SEGMENTS) as u32,
};

/// Multicolor: per color, one tag for the reduce towards the leader and one for the broadcast.
pub const MULTICOLOR: TagRange = TagRange::after(RING, "multicolor", 2 * MAX_COLORS as u32);

/// Recursive halving/doubling: fold, halve, double, unfold.
pub const RHD: TagRange = TagRange::after(MULTICOLOR, "rhd", 4);

/// Control plane ([`crate::collective`]): a message's length, then its bytes.
pub const CONTROL: TagRange = TagRange::after(RHD, "control plane", 2);

/// ddl-bench's ping-pong (ping, pong).
pub const PINGPONG: TagRange = TagRange::after(CONTROL, "ping-pong", 2);

/// The ring allgather ([`crate::sharded`]).
pub const ALLGATHER: TagRange = TagRange::after(PINGPONG, "allgather", 1);

/// The ring reduce-scatter ([`crate::sharded`]).
pub const REDUCE_SCATTER: TagRange = TagRange::after(ALLGATHER, "reduce-scatter", 1);

/// The allreduce call check: every rank's element count and type, sent to every other rank
/// before a call's first message ([`Transport::allgather_u64`](crate::Transport::allgather_u64)).
pub const CALL_CHECK: TagRange = TagRange::after(REDUCE_SCATTER, "allreduce call check", 1);

/// The record exchange between nodes (ddl-exchange): a piece's length, then its bytes. It
/// runs beside the training's collectives, from its own thread.
pub const EXCHANGE: TagRange = TagRange::after(CALL_CHECK, "record exchange", 2);

/// Every range of the registry, in tag order.
pub const ALL: [TagRange; 9] = [
    RING,
    MULTICOLOR,
    RHD,
    CONTROL,
    PINGPONG,
    ALLGATHER,
    REDUCE_SCATTER,
    CALL_CHECK,
    EXCHANGE,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_disjoint_and_fit_below_max_tag() {
        for (i, a) in ALL.iter().enumerate() {
            assert!(a.len > 0, "{} is empty", a.owner);
            assert!(
                a.end() - 1 <= MAX_TAG,
                "{} ends at {} > {MAX_TAG}",
                a.owner,
                a.end()
            );
            for b in &ALL[i + 1..] {
                assert!(
                    a.end() <= b.start || b.end() <= a.start,
                    "{} {:?} overlaps {} {:?}",
                    a.owner,
                    a.start..a.end(),
                    b.owner,
                    b.start..b.end()
                );
            }
        }
    }

    #[test]
    fn the_largest_multiring_and_multicolor_tags_stay_in_their_ranges() {
        let last_ring = (MAX_SEGMENTS - 1) * 2 * MAX_DIMS + 2 * (MAX_DIMS - 1) + 1;
        assert_eq!(RING.tag(last_ring as u32), RING.end() - 1);
        assert_eq!(
            MULTICOLOR.tag(2 * (MAX_COLORS as u32 - 1) + 1),
            MULTICOLOR.end() - 1
        );
    }
}
