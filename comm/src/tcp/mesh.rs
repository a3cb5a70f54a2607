//! The connections of one process to every other rank of a TCP job, and the threads that
//! read them.
//!
//! Each connection has a reader thread that takes whole messages off the socket as they
//! arrive and files them in the inbox of their sender, keyed by (group, kind, tag): a rank's
//! sends never wait for the receiving rank to post its receive (as timely-dataflow's
//! `zero_copy/tcp.rs` keeps a reader per connection), so batches of sends and receives among
//! any ranks never deadlock. Writes go straight to the socket under a per-peer lock.

use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::{CommError, Result};

/// Message class: user data and the transport's own control traffic never match each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub(crate) enum Kind {
    /// Point-to-point messages of the algorithms and collectives.
    User = 0,
    /// The (color, key) exchange of a split.
    Split = 1,
    /// Barrier rounds.
    Barrier = 2,
}

impl Kind {
    fn from_byte(b: u8) -> Option<Kind> {
        [Kind::User, Kind::Split, Kind::Barrier]
            .into_iter()
            .find(|k| *k as u8 == b)
    }
}

/// Where a message belongs: its group (context), class and tag.
pub(crate) type Key = (u64, Kind, u32);

/// Bytes of a frame header: context u64, kind u8 (+3 padding), tag u32, length u64.
const HEADER: usize = 24;

/// Messages up to this length go out with their header in one write.
const COALESCE: usize = 64 << 10;

/// Receive buffers of at least this many bytes are handed back to their reader for the next
/// message ([`Inbox::recycle`]); smaller ones come cheaply from the allocator's free lists.
const RECYCLE_MIN: usize = 64 << 10;

/// Spare receive buffers an inbox keeps (those of a ring's few messages in flight).
const SPARES: usize = 4;

/// Messages received from one peer and not yet taken, and whether its connection ended.
#[derive(Default)]
struct Queued {
    msgs: HashMap<Key, VecDeque<Vec<u8>>>,
    closed: bool,
}

/// One peer's inbox, filled by its reader thread.
#[derive(Default)]
pub(crate) struct Inbox {
    queued: Mutex<Queued>,
    arrived: Condvar,
    /// Buffers of messages taken, for the reader to receive the next ones into: a fresh
    /// allocation of a large message is zeroed and page-faulted in on every message, and
    /// freeing it unmaps it again.
    spare: Mutex<Vec<Vec<u8>>>,
}

impl Inbox {
    fn lock(&self) -> MutexGuard<'_, Queued> {
        self.queued.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, key: Key, data: Vec<u8>) {
        self.lock().msgs.entry(key).or_default().push_back(data);
        self.arrived.notify_all();
    }

    fn close(&self) {
        self.lock().closed = true;
        self.arrived.notify_all();
    }

    /// A buffer of `len` bytes to receive a message into: the smallest spare that holds it
    /// (its old contents are overwritten), else a new one.
    fn buffer(&self, len: usize) -> Vec<u8> {
        let mut spare = self.spare.lock().unwrap_or_else(|p| p.into_inner());
        let fits = (0..spare.len())
            .filter(|&i| spare[i].capacity() >= len)
            .min_by_key(|&i| spare[i].capacity());
        let Some(i) = fits.filter(|_| len >= RECYCLE_MIN) else {
            return vec![0u8; len];
        };
        let mut buf = spare.swap_remove(i);
        drop(spare);
        if buf.len() < len {
            buf.resize(len, 0);
        } else {
            buf.truncate(len);
        }
        buf
    }

    /// Hands a taken message's buffer back for [`Inbox::buffer`] (at most [`SPARES`] are
    /// kept, the largest).
    pub(crate) fn recycle(&self, buf: Vec<u8>) {
        if buf.capacity() < RECYCLE_MIN {
            return;
        }
        let mut spare = self.spare.lock().unwrap_or_else(|p| p.into_inner());
        spare.push(buf);
        if spare.len() > SPARES {
            let smallest = (0..spare.len()).min_by_key(|&i| spare[i].capacity());
            if let Some(i) = smallest {
                spare.swap_remove(i);
            }
        }
    }
}

/// Why waiting for a message failed.
pub(crate) enum Missing {
    /// Nothing came before the deadline.
    Timeout,
    /// The peer's connection ended.
    Closed,
}

/// A rank's connections to all ranks of the job (itself included, through its own inbox).
pub(crate) struct Mesh {
    /// This process's rank in the job.
    pub(crate) rank: usize,
    /// `writers[q]`: the socket to rank q (None for this rank).
    writers: Vec<Option<Mutex<TcpStream>>>,
    /// `inboxes[q]`: what rank q sent to this rank.
    inboxes: Vec<Arc<Inbox>>,
}

impl Mesh {
    /// Takes over `streams` (`streams[q]`: the connection to rank q, None for `rank`) and
    /// starts one reader thread per connection.
    pub(crate) fn start(rank: usize, streams: Vec<Option<TcpStream>>) -> Result<Mesh> {
        let inboxes: Vec<Arc<Inbox>> = (0..streams.len()).map(|_| Arc::default()).collect();
        let mut writers = Vec::with_capacity(streams.len());
        for (peer, stream) in streams.into_iter().enumerate() {
            let Some(stream) = stream else {
                writers.push(None);
                continue;
            };
            let reader = stream
                .try_clone()
                .map_err(|e| io_error("connect", rank, peer, &e))?;
            let inbox = Arc::clone(&inboxes[peer]);
            std::thread::Builder::new()
                .name(format!("ddl-tcp-read-{peer}"))
                .spawn(move || read_loop(reader, &inbox))
                .map_err(|e| io_error("connect", rank, peer, &e))?;
            writers.push(Some(Mutex::new(stream)));
        }
        Ok(Mesh {
            rank,
            writers,
            inboxes,
        })
    }

    /// Sends `data` to job rank `to` under `key`; a write blocked for `timeout` fails.
    pub(crate) fn send(
        &self,
        op: &'static str,
        to: usize,
        key: Key,
        data: &[u8],
        timeout: Duration,
    ) -> Result<()> {
        let Some(writer) = &self.writers[to] else {
            self.inboxes[to].push(key, data.to_vec());
            return Ok(());
        };
        let mut header = [0u8; HEADER];
        header[..8].copy_from_slice(&key.0.to_le_bytes());
        header[8] = key.1 as u8;
        header[12..16].copy_from_slice(&key.2.to_le_bytes());
        header[16..].copy_from_slice(&(data.len() as u64).to_le_bytes());
        let mut stream = writer.lock().unwrap_or_else(|p| p.into_inner());
        let fail = |e: std::io::Error| match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => CommError::Timeout {
                op,
                rank: self.rank,
                peer: Some(to),
                timeout,
            },
            _ => io_error(op, self.rank, to, &e),
        };
        stream
            .set_write_timeout(Some(timeout.max(Duration::from_millis(1))))
            .map_err(fail)?;
        if data.len() <= COALESCE {
            let mut frame = Vec::with_capacity(HEADER + data.len());
            frame.extend_from_slice(&header);
            frame.extend_from_slice(data);
            stream.write_all(&frame).map_err(fail)
        } else {
            stream.write_all(&header).map_err(fail)?;
            stream.write_all(data).map_err(fail)
        }
    }

    /// Hands the buffer of a message taken from job rank `from` back to its reader (this
    /// rank's own messages have none).
    pub(crate) fn recycle(&self, from: usize, buf: Vec<u8>) {
        if self.writers[from].is_some() {
            self.inboxes[from].recycle(buf);
        }
    }

    /// The next message under `key` from job rank `from`, waiting until `deadline` (its
    /// buffer may go back through [`Mesh::recycle`]).
    pub(crate) fn take(
        &self,
        from: usize,
        key: Key,
        deadline: Instant,
    ) -> std::result::Result<Vec<u8>, Missing> {
        let inbox = &self.inboxes[from];
        let mut q = inbox.lock();
        loop {
            if let Some(msg) = q.msgs.get_mut(&key).and_then(VecDeque::pop_front) {
                return Ok(msg);
            }
            if q.closed {
                return Err(Missing::Closed);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Missing::Timeout);
            }
            q = inbox
                .arrived
                .wait_timeout(q, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

impl Drop for Mesh {
    /// Ends this rank's side of every connection: its peers see the end of the stream once
    /// they have read all it sent, and their reader threads (and this rank's, when the peers
    /// close theirs) exit.
    fn drop(&mut self) {
        for w in self.writers.iter().flatten() {
            let s = w.lock().unwrap_or_else(|p| p.into_inner());
            let _ = s.shutdown(Shutdown::Write);
        }
    }
}

/// Reads frames from `stream` into `inbox` until the connection ends (closed by the peer,
/// failed, or a frame that is not ddl's).
fn read_loop(mut stream: TcpStream, inbox: &Inbox) {
    let mut header = [0u8; HEADER];
    while stream.read_exact(&mut header).is_ok() {
        let ctx = u64::from_le_bytes(header[..8].try_into().expect("8 bytes"));
        let tag = u32::from_le_bytes(header[12..16].try_into().expect("4 bytes"));
        let len = u64::from_le_bytes(header[16..].try_into().expect("8 bytes"));
        let (Some(kind), Ok(len)) = (Kind::from_byte(header[8]), usize::try_from(len)) else {
            break;
        };
        let mut data = inbox.buffer(len);
        if stream.read_exact(&mut data).is_err() {
            break;
        }
        inbox.push((ctx, kind, tag), data);
    }
    inbox.close();
}

/// A socket error of `op` between `rank` and `peer`.
pub(crate) fn io_error(
    op: &'static str,
    rank: usize,
    peer: usize,
    e: &std::io::Error,
) -> CommError {
    CommError::Connection {
        op,
        rank,
        peer,
        message: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_message_is_received_into_the_buffer_of_one_taken_before() {
        let inbox = Inbox::default();
        let first = inbox.buffer(1 << 20);
        let at = first.as_ptr();
        inbox.recycle(first);
        let smaller = inbox.buffer(300 << 10);
        assert_eq!(smaller.as_ptr(), at, "a spare that holds it is reused");
        assert_eq!(smaller.len(), 300 << 10);
        inbox.recycle(smaller);
        let again = inbox.buffer(1 << 20);
        assert_eq!((again.as_ptr(), again.len()), (at, 1 << 20));
        // Small messages come from the allocator and are not kept.
        inbox.recycle(vec![0u8; 100]);
        assert_eq!(inbox.spare.lock().unwrap().len(), 0);
    }

    #[test]
    fn recycled_buffers_carry_each_message_exactly() {
        let group = crate::tcp::tcp_group(2).expect("loopback group");
        let sizes = [1 << 20, 100 << 10, 3 << 20, 64 << 10, 1 << 20];
        std::thread::scope(|s| {
            let (a, b) = (&group[0], &group[1]);
            s.spawn(move || {
                for (i, n) in sizes.iter().enumerate() {
                    let msg: Vec<u8> = (0..*n).map(|j| (i * 7 + j % 251) as u8).collect();
                    crate::Transport::send(a, 1, i as u32, &msg).expect("send");
                }
            });
            for (i, n) in sizes.iter().enumerate() {
                let mut got = vec![0u8; *n];
                crate::Transport::recv(b, 0, i as u32, &mut got).expect("recv");
                assert!(
                    got.iter()
                        .enumerate()
                        .all(|(j, v)| *v == (i * 7 + j % 251) as u8),
                    "message {i} of {n} bytes"
                );
            }
        });
    }
}
