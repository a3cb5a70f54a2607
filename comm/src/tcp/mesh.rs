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

/// Longest message a frame carries (64 GiB, beyond any tensor ddl moves in one message): a
/// header claiming more is refused naming its sender instead of being allocated (a claim of
/// 2^40 bytes aborted the process); a send of more is refused before it goes out.
pub(crate) const MAX_FRAME: u64 = 1 << 36;

/// Messages up to this length go out with their header in one write.
const COALESCE: usize = 64 << 10;

/// Receive buffers of at least this many bytes are handed back to their reader for the next
/// message ([`Inbox::recycle`]); smaller ones come cheaply from the allocator's free lists.
const RECYCLE_MIN: usize = 64 << 10;

/// Spare receive buffers an inbox keeps (those of a ring's few messages in flight).
const SPARES: usize = 4;

/// `len` zeroed bytes, or None when the allocator has none: a fallible `vec![0u8; len]`
/// (calloc, whose fresh pages cost nothing until a message is read into them).
fn zeroed(len: usize) -> Option<Vec<u8>> {
    if len == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u8>(len).ok()?;
    // SAFETY: the layout's size is not zero.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `ptr` comes from the global allocator with the layout of `len` u8s, all of them
    // initialised (zeroed); the Vec takes over the allocation.
    Some(unsafe { Vec::from_raw_parts(ptr, len, len) })
}

/// Messages received from one peer and not yet taken, and whether its connection ended.
#[derive(Default)]
struct Queued {
    msgs: HashMap<Key, VecDeque<Vec<u8>>>,
    closed: bool,
    /// Why the reader stopped, when the peer sent what is not a ddl frame.
    broken: Option<String>,
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

    /// Marks the connection ended: by the peer (`broken` None) or for a frame that is not
    /// ddl's (why).
    fn close(&self, broken: Option<String>) {
        let mut q = self.lock();
        q.closed = true;
        q.broken = broken;
        drop(q);
        self.arrived.notify_all();
    }

    /// A buffer of `len` bytes to receive a message into: the smallest spare that holds it
    /// (its old contents are overwritten), else a new one; an allocation that fails is an
    /// error, not an abort.
    fn buffer(&self, len: usize) -> std::result::Result<Vec<u8>, String> {
        let mut spare = self.spare.lock().unwrap_or_else(|p| p.into_inner());
        let fits = (0..spare.len())
            .filter(|&i| spare[i].capacity() >= len)
            .min_by_key(|&i| spare[i].capacity());
        let Some(i) = fits.filter(|_| len >= RECYCLE_MIN) else {
            drop(spare);
            return zeroed(len).ok_or_else(|| format!("no memory for its message of {len} bytes"));
        };
        let mut buf = spare.swap_remove(i);
        drop(spare);
        if buf.len() < len {
            buf.resize(len, 0);
        } else {
            buf.truncate(len);
        }
        Ok(buf)
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
    /// The peer sent what is not a ddl frame (why); its connection was dropped.
    Broken(String),
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
                .spawn(move || inbox.close(read_frames(reader, &inbox).err()))
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
        if data.len() as u64 > MAX_FRAME {
            return Err(CommError::InvalidArgument(format!(
                "{op} on rank {}: a message of {} bytes to rank {to} is over the TCP \
                 transport's limit of {MAX_FRAME} bytes: send it in parts",
                self.rank,
                data.len()
            )));
        }
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
                return Err(q.broken.clone().map_or(Missing::Closed, Missing::Broken));
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

/// Reads frames from `stream` into `inbox` until the connection ends: Ok when it closed or
/// failed (the peer went away), Err (why) at a frame that is not ddl's, whose length is never
/// allocated.
fn read_frames(mut stream: impl Read, inbox: &Inbox) -> std::result::Result<(), String> {
    let mut header = [0u8; HEADER];
    while stream.read_exact(&mut header).is_ok() {
        let ctx = u64::from_le_bytes(header[..8].try_into().expect("8 bytes"));
        let tag = u32::from_le_bytes(header[12..16].try_into().expect("4 bytes"));
        let len = u64::from_le_bytes(header[16..].try_into().expect("8 bytes"));
        let Some(kind) = Kind::from_byte(header[8]) else {
            return Err(format!("it sent a frame of unknown kind {}", header[8]));
        };
        let Some(len) = usize::try_from(len).ok().filter(|_| len <= MAX_FRAME) else {
            return Err(format!(
                "it sent a frame header claiming {len} bytes, over the limit of {MAX_FRAME} \
                 (a corrupted stream, or a peer of another ddl version)"
            ));
        };
        let mut data = inbox.buffer(len)?;
        if stream.read_exact(&mut data).is_err() {
            break;
        }
        inbox.push((ctx, kind, tag), data);
    }
    Ok(())
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
    fn a_buffer_the_allocator_cannot_give_is_an_error_not_an_abort() {
        let inbox = Inbox::default();
        let err = inbox.buffer(usize::MAX / 2).expect_err("no such memory");
        assert!(err.contains(&format!("no memory for its message of {}", usize::MAX / 2)));
        assert_eq!(inbox.buffer(100).expect("100 bytes"), vec![0u8; 100]);
        assert!(inbox.buffer(0).expect("none").is_empty());
    }

    #[test]
    fn a_large_message_is_received_into_the_buffer_of_one_taken_before() {
        let inbox = Inbox::default();
        let first = inbox.buffer(1 << 20).expect("1 MiB");
        let at = first.as_ptr();
        inbox.recycle(first);
        let smaller = inbox.buffer(300 << 10).expect("300 KiB");
        assert_eq!(smaller.as_ptr(), at, "a spare that holds it is reused");
        assert_eq!(smaller.len(), 300 << 10);
        inbox.recycle(smaller);
        let again = inbox.buffer(1 << 20).expect("1 MiB");
        assert_eq!((again.as_ptr(), again.len()), (at, 1 << 20));
        // Small messages come from the allocator and are not kept.
        inbox.recycle(vec![0u8; 100]);
        assert_eq!(inbox.spare.lock().unwrap().len(), 0);
    }
}
