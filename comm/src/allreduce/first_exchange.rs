//! The call check of the message-based algorithms at two ranks, riding on their first
//! exchange: at two ranks it is one message each way (every one of ring, rhd, multiring and
//! multicolor with two colors or more, whatever the length), and each rank puts its
//! [`Signature`] word in front of its message. A separate round would cost a quarter of a
//! 4 KiB call (BENCHMARKS.md, "The allreduce call check").
//!
//! A message longer than the receive posted for it is not safe to send (see
//! [`super::signature`]), and before the check neither rank knows the other's length. So the
//! first message each way is a head of at most [`HEAD`] bytes, received into a buffer of that
//! size whatever its length: the word, and the message itself when it fits. A message that
//! does not fit goes whole once the words agree, in a second exchange (the round the check
//! costs anyway). Buffers up to about 8 KiB at two ranks fit: their check costs two copies of
//! the head and nothing else.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::call_check::agree;
use super::signature::Signature;
use crate::error::{CommError, Result};
use crate::transport::{Op, Transport};

/// Largest first message each way, word included: Open MPI's shared-memory eager limit, so
/// that the head goes in one copy without a rendezvous.
const HEAD: usize = 4096;

/// Bytes of the word in front of the head.
const WORD: usize = 8;

/// Data bytes a head carries.
const HEAD_DATA: usize = HEAD - WORD;

/// The two heads (reused across calls, so that the check allocates nothing).
#[derive(Default)]
pub(crate) struct Staging {
    out: Vec<u8>,
    back: Vec<u8>,
}

/// The transport of one two-rank call of `mine` over `inner` (see the module documentation).
pub(crate) struct FirstExchange<'a> {
    inner: &'a dyn Transport,
    mine: Signature,
    /// Whether the first exchange has yet to happen: the one caller that turns it false runs
    /// it, and only that one touches `staging`.
    pending: AtomicBool,
    staging: UnsafeCell<&'a mut Staging>,
}

// SAFETY: `staging` is used only by the single `first` call that `pending` lets through (see
// `exchange`); every other field is Sync.
unsafe impl Sync for FirstExchange<'_> {}

impl<'a> FirstExchange<'a> {
    pub(crate) fn new(
        inner: &'a dyn Transport,
        mine: Signature,
        staging: &'a mut Staging,
    ) -> FirstExchange<'a> {
        FirstExchange {
            inner,
            mine,
            pending: AtomicBool::new(true),
            staging: UnsafeCell::new(staging),
        }
    }

    /// Fails if the algorithm sent nothing: the other rank would wait for its head.
    pub(crate) fn finish(&self) -> Result<()> {
        if self.pending.load(Ordering::Relaxed) {
            return Err(shape_error("the algorithm sent nothing"));
        }
        Ok(())
    }

    /// The first exchange, `[send, receive]` in either order, as head and tail.
    fn first(&self, ops: &mut [Op<'_>]) -> Result<()> {
        let (data, to, tag, buf, from, rtag) = match ops {
            [Op::Send { to, tag, data }, Op::Recv {
                from,
                tag: rtag,
                buf,
            }]
            | [Op::Recv {
                from,
                tag: rtag,
                buf,
            }, Op::Send { to, tag, data }] => (&**data, *to, *tag, &mut **buf, *from, *rtag),
            _ => {
                return Err(shape_error(
                    "its first exchange is not one message each way",
                ))
            }
        };
        // SAFETY: `first` runs once per call, from the caller that turned `pending` false.
        let Staging { out, back } = unsafe { &mut **self.staging.get() };
        // A message that fits goes in its head; a longer one after the check, whole.
        let (send_in_head, recv_in_head) = (data.len() <= HEAD_DATA, buf.len() <= HEAD_DATA);
        out.clear();
        out.extend_from_slice(&self.mine.to_word().to_le_bytes());
        if send_in_head {
            out.extend_from_slice(data);
        }
        back.resize(HEAD, 0);
        let mut got = 0;
        self.inner.exchange(&mut [
            Op::Send { to, tag, data: out },
            Op::RecvUpTo {
                from,
                tag: rtag,
                buf: back,
                got: &mut got,
            },
        ])?;
        let word = back[..WORD.min(got)].try_into().map(u64::from_le_bytes);
        let theirs = word
            .ok()
            .and_then(Signature::from_word)
            .ok_or_else(|| shape_error("the other rank's first message carries no call"))?;
        let me = self.inner.rank();
        if theirs != self.mine {
            let calls = if me == 0 {
                vec![self.mine, theirs]
            } else {
                vec![theirs, self.mine]
            };
            return agree(me, calls);
        }
        // The lengths agree: the other rank decided as this one did, message by message.
        let head = if recv_in_head { buf.len() } else { 0 };
        if got != WORD + head {
            return Err(CommError::SizeMismatch {
                op: "allreduce first exchange",
                rank: me,
                peer: from,
                expected: WORD + head,
                got,
            });
        }
        buf[..head].copy_from_slice(&back[WORD..got]);
        let mut rest = [
            Op::Send { to, tag, data },
            Op::Recv {
                from,
                tag: rtag,
                buf,
            },
        ];
        let (start, end) = (usize::from(send_in_head), 2 - usize::from(recv_in_head));
        if start < end {
            self.inner.exchange(&mut rest[start..end])?;
        }
        Ok(())
    }
}

fn shape_error(why: &str) -> CommError {
    CommError::InvalidArgument(format!(
        "allreduce call check at two ranks: {why} (a bug of the algorithm)"
    ))
}

impl Transport for FirstExchange<'_> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn send(&self, to: usize, tag: u32, data: &[u8]) -> Result<()> {
        self.exchange(&mut [Op::Send { to, tag, data }])
    }
    fn recv(&self, from: usize, tag: u32, buf: &mut [u8]) -> Result<()> {
        self.exchange(&mut [Op::Recv { from, tag, buf }])
    }
    fn exchange(&self, ops: &mut [Op<'_>]) -> Result<()> {
        if self.pending.swap(false, Ordering::Relaxed) {
            self.first(ops)
        } else {
            self.inner.exchange(ops)
        }
    }
    fn split(&self, color: usize, key: usize) -> Result<Box<dyn Transport>> {
        self.inner.split(color, key)
    }
    fn barrier(&self) -> Result<()> {
        self.inner.barrier()
    }
    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }
    fn set_timeout(&self, timeout: Duration) {
        self.inner.set_timeout(timeout)
    }
    fn announce_failure(&self, reason: &str) {
        self.inner.announce_failure(reason)
    }
    fn failure(&self, op: &'static str) -> Option<CommError> {
        self.inner.failure(op)
    }
}
