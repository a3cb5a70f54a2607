//! What the two transports made of point-to-point messages, TCP ([`crate::tcp`]) and
//! in-process ([`crate::thread`]), share: the operation timeout and its deadlines
//! ([`OpTimeout`]), an exchange as its sends then its receives ([`exchange`]), and the round of
//! a split in which the ranks tell each other their colour and key ([`split_round`]). Each
//! transport brings how it posts and takes one message.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::transport::{receive_all, Op};

/// An endpoint's operation timeout, which one thread may change while others wait.
pub(crate) struct OpTimeout(AtomicU64);

impl OpTimeout {
    /// Operations fail after `timeout`.
    pub(crate) fn new(timeout: Duration) -> OpTimeout {
        OpTimeout(AtomicU64::new(nanos(timeout)))
    }

    /// The timeout in force.
    pub(crate) fn get(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::Relaxed))
    }

    /// Changes the timeout of the operations that start from now on.
    pub(crate) fn set(&self, timeout: Duration) {
        self.0.store(nanos(timeout), Ordering::Relaxed);
    }

    /// When an operation starting now fails (a year ahead where the timeout is too large to
    /// add).
    pub(crate) fn deadline(&self) -> Instant {
        let now = Instant::now();
        now.checked_add(self.get())
            .unwrap_or(now + Duration::from_secs(365 * 24 * 3600))
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// [`Transport::exchange`](crate::Transport::exchange) of a message transport: every send
/// posted (`post(to, tag, data)`), then every receive taken in order, all by one deadline
/// (`take(from, tag, buf, deadline, up_to)`, returning the message's length).
pub(crate) fn exchange(
    ops: &mut [Op<'_>],
    timeout: &OpTimeout,
    mut post: impl FnMut(usize, u32, &[u8]) -> Result<()>,
    mut take: impl FnMut(usize, u32, &mut [u8], Instant, bool) -> Result<usize>,
) -> Result<()> {
    for op in ops.iter() {
        if let Op::Send { to, tag, data } = op {
            post(*to, *tag, data)?;
        }
    }
    let deadline = timeout.deadline();
    receive_all(ops, |from, tag, buf, up_to| {
        take(from, tag, buf, deadline, up_to)
    })
}

/// The round of [`Transport::split`](crate::Transport::split) over a group of `size` ranks:
/// this rank's `color` and `key` posted to every rank (`post(to, message)`), every rank's taken
/// (`take(from, message, deadline)`). Returns the ranks of this rank's colour ordered by key,
/// then rank (the new group's ranks in order), and the deadline the round ran under.
pub(crate) fn split_round(
    size: usize,
    (color, key): (usize, usize),
    timeout: &OpTimeout,
    mut post: impl FnMut(usize, &[u8; 16]) -> Result<()>,
    mut take: impl FnMut(usize, &mut [u8; 16], Instant) -> Result<()>,
) -> Result<(Vec<usize>, Instant)> {
    let mut info = [0u8; 16];
    info[..8].copy_from_slice(&(color as u64).to_le_bytes());
    info[8..].copy_from_slice(&(key as u64).to_le_bytes());
    for d in 0..size {
        post(d, &info)?;
    }
    let deadline = timeout.deadline();
    let mut members = Vec::new();
    let mut buf = [0u8; 16];
    for s in 0..size {
        take(s, &mut buf, deadline)?;
        let c = u64::from_le_bytes(buf[..8].try_into().expect("8 bytes"));
        let k = u64::from_le_bytes(buf[8..].try_into().expect("8 bytes"));
        if c == color as u64 {
            members.push((k, s));
        }
    }
    members.sort_unstable();
    Ok((members.into_iter().map(|(_, s)| s).collect(), deadline))
}
