//! In-process transport: one rank per thread, connected by crossbeam channels.
//!
//! Used for fast tests with many simulated ranks (1..64). Sends never block (unbounded
//! channels); receives wait at most the operation timeout (`recv_timeout`).

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError, Sender};

use crate::error::{CommError, Result};
use crate::messaging::{self, OpTimeout};
use crate::transport::{check_peer, dissemination_barrier, Op, Transport, DEFAULT_TIMEOUT};

/// Message class: user data and the transport's own control traffic never match each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    User,
    SplitInfo,
    SplitGroup,
    Barrier,
}

enum Payload {
    Bytes(Vec<u8>),
    Group(Box<ThreadTransport>),
}

struct Msg {
    kind: Kind,
    tag: u32,
    payload: Payload,
}

/// One rank's endpoint of an in-process group made by [`thread_group`].
pub struct ThreadTransport {
    rank: usize,
    /// `to[d]` sends to rank d.
    to: Vec<Sender<Msg>>,
    /// `from[s]` receives from rank s.
    from: Vec<Receiver<Msg>>,
    /// Messages received from rank s that did not match the receive in progress.
    stash: Vec<Stash>,
    timeout: OpTimeout,
}

impl std::fmt::Debug for ThreadTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadTransport")
            .field("rank", &self.rank)
            .field("size", &self.to.len())
            .field("timeout", &self.timeout())
            .finish()
    }
}

/// Messages from one peer that their receiver did not want, and who is receiving: threads
/// that receive from the same peer at once take turns at its channel, and the one receiving
/// hands the others their messages through the stash.
#[derive(Default)]
struct Stash {
    queued: Mutex<Queued>,
    arrived: Condvar,
}

/// The messages of a [`Stash`] and whether a thread is receiving from the channel.
#[derive(Default)]
struct Queued {
    msgs: VecDeque<Msg>,
    receiving: bool,
}

impl Stash {
    fn lock(&self) -> MutexGuard<'_, Queued> {
        self.queued.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Creates `n` connected endpoints (rank i at index i) with the default timeout (60 s).
/// Move each into its own thread.
pub fn thread_group(n: usize) -> Vec<ThreadTransport> {
    thread_group_with_timeout(n, DEFAULT_TIMEOUT)
}

/// Creates `n` connected endpoints whose blocking operations fail after `timeout`.
pub fn thread_group_with_timeout(n: usize, timeout: Duration) -> Vec<ThreadTransport> {
    // senders[s][d] sends from s to d; receivers[d][s] receives at d from s.
    let mut senders: Vec<Vec<Sender<Msg>>> = (0..n).map(|_| Vec::with_capacity(n)).collect();
    let mut receivers: Vec<Vec<Receiver<Msg>>> = (0..n).map(|_| Vec::with_capacity(n)).collect();
    for row in senders.iter_mut() {
        for inbox in receivers.iter_mut() {
            let (tx, rx) = unbounded();
            row.push(tx);
            inbox.push(rx);
        }
    }
    senders
        .into_iter()
        .zip(receivers)
        .enumerate()
        .map(|(rank, (to, from))| ThreadTransport {
            rank,
            stash: (0..n).map(|_| Stash::default()).collect(),
            to,
            from,
            timeout: OpTimeout::new(timeout),
        })
        .collect()
}

impl ThreadTransport {
    fn post(
        &self,
        op: &'static str,
        to: usize,
        kind: Kind,
        tag: u32,
        payload: Payload,
    ) -> Result<()> {
        check_peer(op, self.rank, to, self.to.len())?;
        self.to[to]
            .send(Msg { kind, tag, payload })
            .map_err(|_| CommError::Disconnected {
                op,
                rank: self.rank,
                peer: to,
            })
    }

    /// Receives the next message of (kind, tag) from `from`, stashing others (for the threads
    /// that wait for them).
    fn take(
        &self,
        op: &'static str,
        from: usize,
        kind: Kind,
        tag: u32,
        deadline: Instant,
    ) -> Result<Payload> {
        check_peer(op, self.rank, from, self.from.len())?;
        let stash = &self.stash[from];
        let mut q = stash.lock();
        loop {
            if let Some(i) = q.msgs.iter().position(|m| m.kind == kind && m.tag == tag) {
                if let Some(m) = q.msgs.remove(i) {
                    return Ok(m.payload);
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(CommError::Timeout {
                    op,
                    rank: self.rank,
                    peer: Some(from),
                    timeout: self.timeout(),
                });
            }
            if q.receiving {
                q = stash
                    .arrived
                    .wait_timeout(q, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                continue;
            }
            q.receiving = true;
            drop(q);
            let got = self.from[from].recv_deadline(deadline);
            q = stash.lock();
            q.receiving = false;
            stash.arrived.notify_all();
            match got {
                Ok(m) if m.kind == kind && m.tag == tag => return Ok(m.payload),
                Ok(m) => q.msgs.push_back(m),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(CommError::Disconnected {
                        op,
                        rank: self.rank,
                        peer: from,
                    })
                }
            }
        }
    }

    /// A message into `buf`, of exactly its length or (`up_to`) at most; its length.
    #[allow(clippy::too_many_arguments)]
    fn take_into(
        &self,
        op: &'static str,
        from: usize,
        kind: Kind,
        tag: u32,
        buf: &mut [u8],
        deadline: Instant,
        up_to: bool,
    ) -> Result<usize> {
        match self.take(op, from, kind, tag, deadline)? {
            Payload::Bytes(b) if b.len() == buf.len() || (up_to && b.len() < buf.len()) => {
                buf[..b.len()].copy_from_slice(&b);
                Ok(b.len())
            }
            Payload::Bytes(b) => Err(CommError::SizeMismatch {
                op,
                rank: self.rank,
                peer: from,
                expected: buf.len(),
                got: b.len(),
            }),
            Payload::Group(_) => Err(CommError::InvalidArgument(format!(
                "{op} on rank {}: unexpected group message from peer {from}",
                self.rank
            ))),
        }
    }
}

impl Transport for ThreadTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.to.len()
    }

    fn send(&self, to: usize, tag: u32, data: &[u8]) -> Result<()> {
        self.post("send", to, Kind::User, tag, Payload::Bytes(data.to_vec()))
    }

    fn recv(&self, from: usize, tag: u32, buf: &mut [u8]) -> Result<()> {
        let deadline = self.timeout.deadline();
        self.take_into("recv", from, Kind::User, tag, buf, deadline, false)
            .map(drop)
    }

    fn exchange(&self, ops: &mut [Op<'_>]) -> Result<()> {
        messaging::exchange(
            ops,
            &self.timeout,
            |to, tag, data| {
                let data = Payload::Bytes(data.to_vec());
                self.post("exchange send", to, Kind::User, tag, data)
            },
            |from, tag, buf, deadline, up_to| {
                self.take_into("exchange recv", from, Kind::User, tag, buf, deadline, up_to)
            },
        )
    }

    fn split(&self, color: usize, key: usize) -> Result<Box<dyn Transport>> {
        let (members, deadline) = messaging::split_round(
            self.size(),
            (color, key),
            &self.timeout,
            |to, info| {
                let info = Payload::Bytes(info.to_vec());
                self.post("split", to, Kind::SplitInfo, 0, info)
            },
            |from, buf, deadline| {
                self.take_into("split", from, Kind::SplitInfo, 0, buf, deadline, false)
                    .map(drop)
            },
        )?;
        let leader = members[0];
        if leader == self.rank {
            let mut group = thread_group_with_timeout(members.len(), self.timeout()).into_iter();
            let mine = group.next().expect("group has at least this rank");
            for (&member, endpoint) in members[1..].iter().zip(group) {
                self.post(
                    "split",
                    member,
                    Kind::SplitGroup,
                    0,
                    Payload::Group(Box::new(endpoint)),
                )?;
            }
            Ok(Box::new(mine))
        } else {
            match self.take("split", leader, Kind::SplitGroup, 0, deadline)? {
                Payload::Group(g) => Ok(g),
                Payload::Bytes(_) => Err(CommError::InvalidArgument(format!(
                    "split on rank {}: peer {leader} sent bytes instead of a group",
                    self.rank
                ))),
            }
        }
    }

    fn barrier(&self) -> Result<()> {
        let deadline = self.timeout.deadline();
        dissemination_barrier(
            self.rank,
            self.size(),
            |to, round| {
                self.post(
                    "barrier",
                    to,
                    Kind::Barrier,
                    round,
                    Payload::Bytes(Vec::new()),
                )
            },
            |from, round| {
                self.take_into(
                    "barrier",
                    from,
                    Kind::Barrier,
                    round,
                    &mut [],
                    deadline,
                    false,
                )
                .map(drop)
            },
        )
    }

    fn timeout(&self) -> Duration {
        self.timeout.get()
    }

    fn set_timeout(&self, timeout: Duration) {
        self.timeout.set(timeout);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two threads of one rank receive from the same peer at once, each its own tag, the
    /// messages arriving in the order that makes each thread first read the other's.
    #[test]
    fn threads_receiving_from_one_peer_each_get_their_messages() {
        let mut group = thread_group_with_timeout(2, Duration::from_secs(20));
        let receiver = std::sync::Arc::new(group.pop().expect("rank 1"));
        let sender = group.pop().expect("rank 0");
        let waiting: Vec<_> = [1u32, 2]
            .into_iter()
            .map(|tag| {
                let r = receiver.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 1];
                    r.recv(0, tag, &mut buf).map(|()| buf[0])
                })
            })
            .collect();
        for tag in [2u32, 1] {
            sender.send(1, tag, &[tag as u8 * 10]).expect("send");
        }
        let got: Vec<u8> = waiting
            .into_iter()
            .map(|t| t.join().expect("thread").expect("recv"))
            .collect();
        assert_eq!(got, [10, 20]);
    }
}
