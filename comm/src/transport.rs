//! The `Transport` trait: point-to-point byte messaging within a group of ranks.

use std::time::Duration;

use crate::error::{CommError, Result};
pub use crate::tags::MAX_TAG;

/// Default operation timeout: a blocked operation fails after this long.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// One operation of a non-blocking batch ([`Transport::exchange`]).
#[derive(Debug)]
pub enum Op<'a> {
    /// Send `data` to rank `to` with tag `tag`.
    Send {
        /// Destination rank.
        to: usize,
        /// Message tag (`<= MAX_TAG`).
        tag: u32,
        /// Bytes to send.
        data: &'a [u8],
    },
    /// Receive exactly `buf.len()` bytes from rank `from` with tag `tag`.
    Recv {
        /// Source rank.
        from: usize,
        /// Message tag (`<= MAX_TAG`).
        tag: u32,
        /// Buffer to fill; the message must have exactly this length.
        buf: &'a mut [u8],
    },
    /// Receive a message of at most `buf.len()` bytes from rank `from` with tag `tag`, and
    /// its length into `got` (the allreduce call check, whose first message is no longer than
    /// agreed but may be shorter).
    RecvUpTo {
        /// Source rank.
        from: usize,
        /// Message tag (`<= MAX_TAG`).
        tag: u32,
        /// Buffer to fill; a longer message fails the operation.
        buf: &'a mut [u8],
        /// The message's length, once received.
        got: &'a mut usize,
    },
}

impl Op<'_> {
    /// The peer rank of this operation.
    pub fn peer(&self) -> usize {
        match self {
            Op::Send { to, .. } => *to,
            Op::Recv { from, .. } | Op::RecvUpTo { from, .. } => *from,
        }
    }
}

/// Point-to-point messaging within a group of `size()` ranks.
///
/// Messages between a pair of ranks with the same tag are delivered in order (MPI's
/// non-overtaking rule). Every blocking operation fails with
/// [`CommError::Timeout`](crate::CommError::Timeout) naming the operation and peer after
/// [`Transport::timeout`], so a dead rank never hangs the job forever.
pub trait Transport: Send + Sync {
    /// This rank, in `0..size()`.
    fn rank(&self) -> usize;
    /// Number of ranks in the group.
    fn size(&self) -> usize;
    /// Sends `data` to rank `to` (blocks until the buffer may be reused).
    fn send(&self, to: usize, tag: u32, data: &[u8]) -> Result<()>;
    /// Receives exactly `buf.len()` bytes from rank `from`.
    fn recv(&self, from: usize, tag: u32, buf: &mut [u8]) -> Result<()>;
    /// Posts all sends and receives of `ops` at once, then completes all of them. Ops to and
    /// from any mix of peers never deadlock with the matching batches of those peers.
    fn exchange(&self, ops: &mut [Op<'_>]) -> Result<()>;
    /// Sends `data` to `to` while receiving `buf` from `from` (one exchange of two ops).
    fn sendrecv(
        &self,
        to: usize,
        send_tag: u32,
        data: &[u8],
        from: usize,
        recv_tag: u32,
        buf: &mut [u8],
    ) -> Result<()> {
        self.exchange(&mut [
            Op::Send {
                to,
                tag: send_tag,
                data,
            },
            Op::Recv {
                from,
                tag: recv_tag,
                buf,
            },
        ])
    }
    /// Splits the group (collective over all ranks): ranks with equal `color` form a new group,
    /// ordered by `(key, old rank)`.
    fn split(&self, color: usize, key: usize) -> Result<Box<dyn Transport>>;
    /// Blocks until every rank of the group has entered the barrier.
    fn barrier(&self) -> Result<()>;
    /// The operation timeout in force.
    fn timeout(&self) -> Duration;
    /// Changes the operation timeout of this rank's endpoint.
    fn set_timeout(&self, timeout: Duration);
    /// Whether [`Transport::native_allreduce_f32`] is available (MPI only).
    fn has_native_allreduce(&self) -> bool {
        false
    }
    /// Sums `buf` over all ranks with the transport's own collective (MPI_Allreduce).
    fn native_allreduce_f32(&self, buf: &mut [f32]) -> Result<()> {
        let _ = buf;
        Err(CommError::Unsupported(
            "native allreduce (the `mpi` algorithm) needs the MPI transport".into(),
        ))
    }
    /// Every rank's `word` into `all` (one slot per rank, in rank order): the allreduce call
    /// check ([`crate::allreduce::signature`]), as one exchange with every other rank on the
    /// call check's tag ([`crate::tags::CALL_CHECK`]), so that a dead rank is named within the
    /// timeout.
    fn allgather_u64(&self, word: u64, all: &mut [u64]) -> Result<()> {
        let (p, me) = (self.size(), self.rank());
        if all.len() != p {
            return Err(CommError::InvalidArgument(format!(
                "allgather_u64: {} slots for {p} ranks",
                all.len()
            )));
        }
        let tag = crate::tags::CALL_CHECK.tag(0);
        let mine = word.to_le_bytes();
        let mut theirs = vec![[0u8; 8]; p];
        let mut ops: Vec<Op<'_>> = Vec::with_capacity(2 * p);
        for (q, buf) in theirs.iter_mut().enumerate().filter(|(q, _)| *q != me) {
            ops.push(Op::Recv { from: q, tag, buf });
            ops.push(Op::Send {
                to: q,
                tag,
                data: &mine,
            });
        }
        self.exchange(&mut ops)?;
        drop(ops);
        theirs[me] = mine;
        for (slot, bytes) in all.iter_mut().zip(theirs) {
            *slot = u64::from_le_bytes(bytes);
        }
        Ok(())
    }
    /// Tells the other ranks of the job that this rank failed and why, without waiting: their
    /// operations that wait then fail within a fraction of a second with
    /// [`CommError::PeerFailed`](crate::CommError::PeerFailed) naming it and `reason`, as do
    /// this rank's own (its part of the job is over). Nothing when this rank knows of a
    /// failure already (another rank's caused this one). Transports that carry no notices
    /// do nothing: over threads and TCP a rank that ends closes its channels, which its
    /// peers see at once.
    fn announce_failure(&self, reason: &str) {
        let _ = reason;
    }
    /// The failure of a rank of the job that this rank knows of (announced by another rank,
    /// or by this one), as the error of operation `op`; `None` where the transport carries
    /// no notices.
    fn failure(&self, op: &'static str) -> Option<CommError> {
        let _ = op;
        None
    }
    /// [`Transport::allgather_u64`] with the transport's own collective where it has one
    /// (MPI_Allgather: faster, but blocking without the timeout, as MPI_Allreduce is; the
    /// check of the `mpi` algorithm).
    fn native_allgather_u64(&self, word: u64, all: &mut [u64]) -> Result<()> {
        self.allgather_u64(word, all)
    }
}

impl<T: Transport + ?Sized> Transport for Box<T> {
    fn rank(&self) -> usize {
        (**self).rank()
    }
    fn size(&self) -> usize {
        (**self).size()
    }
    fn send(&self, to: usize, tag: u32, data: &[u8]) -> Result<()> {
        (**self).send(to, tag, data)
    }
    fn recv(&self, from: usize, tag: u32, buf: &mut [u8]) -> Result<()> {
        (**self).recv(from, tag, buf)
    }
    fn exchange(&self, ops: &mut [Op<'_>]) -> Result<()> {
        (**self).exchange(ops)
    }
    fn split(&self, color: usize, key: usize) -> Result<Box<dyn Transport>> {
        (**self).split(color, key)
    }
    fn barrier(&self) -> Result<()> {
        (**self).barrier()
    }
    fn timeout(&self) -> Duration {
        (**self).timeout()
    }
    fn set_timeout(&self, timeout: Duration) {
        (**self).set_timeout(timeout)
    }
    fn has_native_allreduce(&self) -> bool {
        (**self).has_native_allreduce()
    }
    fn native_allreduce_f32(&self, buf: &mut [f32]) -> Result<()> {
        (**self).native_allreduce_f32(buf)
    }
    fn allgather_u64(&self, word: u64, all: &mut [u64]) -> Result<()> {
        (**self).allgather_u64(word, all)
    }
    fn native_allgather_u64(&self, word: u64, all: &mut [u64]) -> Result<()> {
        (**self).native_allgather_u64(word, all)
    }
    fn announce_failure(&self, reason: &str) {
        (**self).announce_failure(reason)
    }
    fn failure(&self, op: &'static str) -> Option<CommError> {
        (**self).failure(op)
    }
}

/// Validates a peer rank against the group size.
pub(crate) fn check_peer(op: &'static str, rank: usize, peer: usize, size: usize) -> Result<()> {
    if peer >= size {
        return Err(CommError::InvalidPeer {
            op,
            rank,
            peer,
            size,
        });
    }
    Ok(())
}

/// Completes the receives of an exchange whose sends are posted: `take(from, tag, buf, up_to)`
/// fills `buf` with the next message from `from` (exactly its length, or at most with
/// `up_to`) and returns the message's length.
pub(crate) fn receive_all(
    ops: &mut [Op<'_>],
    mut take: impl FnMut(usize, u32, &mut [u8], bool) -> Result<usize>,
) -> Result<()> {
    for op in ops.iter_mut() {
        match op {
            Op::Recv { from, tag, buf } => {
                take(*from, *tag, buf, false)?;
            }
            Op::RecvUpTo {
                from,
                tag,
                buf,
                got,
            } => **got = take(*from, *tag, buf, true)?,
            Op::Send { .. } => {}
        }
    }
    Ok(())
}

/// A dissemination barrier of `n` ranks: in round k, rank r signals rank r + 2^k and waits for
/// rank r - 2^k (ceil(log2 n) rounds).
pub(crate) fn dissemination_barrier(
    rank: usize,
    n: usize,
    mut signal: impl FnMut(usize, u32) -> Result<()>,
    mut wait: impl FnMut(usize, u32) -> Result<()>,
) -> Result<()> {
    let (mut dist, mut round) = (1, 0u32);
    while dist < n {
        signal((rank + dist) % n, round)?;
        wait((rank + n - dist) % n, round)?;
        dist *= 2;
        round += 1;
    }
    Ok(())
}

/// Reinterprets an f32 slice as bytes.
pub fn f32_bytes(s: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and u8 has alignment 1; the length covers the same memory.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}

/// Reinterprets a mutable f32 slice as bytes (every bit pattern is a valid f32).
pub fn f32_bytes_mut(s: &mut [f32]) -> &mut [u8] {
    // SAFETY: as above, and every byte pattern written is a valid f32.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}
