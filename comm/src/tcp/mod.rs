//! TCP transport: ranks of a job connected pairwise by TCP, with no MPI launcher. Started by
//! [`crate::tcp_world::TcpWorld`] from every rank's listener address (which the launcher's
//! rendezvous distributes: torchrun's TCPStore in `ddl.dist`); in-process groups over loopback
//! ([`tcp_group`]) serve the tests.
//!
//! Every connection starts with a handshake in which both ends prove that they hold the job's
//! [`Secret`] ([`handshake`]); a connection that does not is dropped and never stops the job.
//!
//! Messages are framed (group, kind, tag, length) and read by one thread per connection into
//! per-peer inboxes ([`mesh`]); a group made by [`Transport::split`] shares the connections
//! and tells its messages apart by a context number all its ranks derive alike. A receive
//! waits at most the operation timeout and fails naming its peer; a peer whose process ended
//! is reported as [`CommError::Disconnected`] at once.

mod connect;
mod gate;
mod handshake;
mod mesh;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use connect::Listener;
pub use handshake::Secret;
use mesh::{Key, Kind, Mesh, Missing};

use crate::error::{CommError, Result};
use crate::messaging::{self, OpTimeout};
use crate::transport::{check_peer, dissemination_barrier, Op, Transport, DEFAULT_TIMEOUT};

/// One rank's endpoint of a group of a TCP job.
pub struct TcpTransport {
    mesh: Arc<Mesh>,
    /// The group's context: its messages carry it, so groups sharing connections never meet.
    ctx: u64,
    /// Job ranks of the group's members, in group rank order.
    members: Vec<usize>,
    /// This rank in the group.
    rank: usize,
    timeout: OpTimeout,
    /// Splits of this group so far (each split is collective, so all members count alike).
    splits: AtomicU64,
}

impl std::fmt::Debug for TcpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpTransport")
            .field("rank", &self.rank)
            .field("size", &self.members.len())
            .field("job_rank", &self.mesh.rank)
            .field("timeout", &self.timeout())
            .finish()
    }
}

impl TcpTransport {
    /// Connects rank `rank` of the job whose ranks listen at `addrs` (`listener` is this rank's,
    /// at `addrs[rank]`) and hold `secret`; connecting and every later operation fail after
    /// `timeout`.
    pub fn connect(
        listener: Listener,
        rank: usize,
        addrs: &[SocketAddr],
        secret: &Secret,
        timeout: Duration,
    ) -> Result<TcpTransport> {
        let streams = connect::mesh_streams(listener, rank, addrs, secret, timeout)?;
        let mesh = Arc::new(Mesh::start(rank, streams)?);
        Ok(TcpTransport::group(
            mesh,
            0,
            (0..addrs.len()).collect(),
            rank,
            timeout,
        ))
    }

    fn group(
        mesh: Arc<Mesh>,
        ctx: u64,
        members: Vec<usize>,
        rank: usize,
        timeout: Duration,
    ) -> Self {
        TcpTransport {
            mesh,
            ctx,
            members,
            rank,
            timeout: OpTimeout::new(timeout),
            splits: AtomicU64::new(0),
        }
    }

    fn post(&self, op: &'static str, to: usize, kind: Kind, tag: u32, data: &[u8]) -> Result<()> {
        check_peer(op, self.rank, to, self.members.len())?;
        self.mesh
            .send(
                op,
                self.members[to],
                (self.ctx, kind, tag),
                data,
                self.timeout(),
            )
            .map_err(|e| self.in_group(e, to))
    }

    /// A message from group rank `from` into `buf`: exactly its length, or at most (`up_to`).
    fn take_into(
        &self,
        op: &'static str,
        from: usize,
        key: Key,
        buf: &mut [u8],
        deadline: Instant,
        up_to: bool,
    ) -> Result<usize> {
        check_peer(op, self.rank, from, self.members.len())?;
        let msg = self
            .mesh
            .take(self.members[from], key, deadline)
            .map_err(|m| match m {
                Missing::Timeout => CommError::Timeout {
                    op,
                    rank: self.rank,
                    peer: Some(from),
                    timeout: self.timeout(),
                },
                Missing::Closed => CommError::Disconnected {
                    op,
                    rank: self.rank,
                    peer: from,
                },
                Missing::Broken(message) => CommError::Connection {
                    op,
                    rank: self.rank,
                    peer: from,
                    message,
                },
            })?;
        if msg.len() != buf.len() && !(up_to && msg.len() < buf.len()) {
            return Err(CommError::SizeMismatch {
                op,
                rank: self.rank,
                peer: from,
                expected: buf.len(),
                got: msg.len(),
            });
        }
        let len = msg.len();
        buf[..len].copy_from_slice(&msg);
        self.mesh.recycle(self.members[from], msg);
        Ok(len)
    }

    /// Errors of the mesh name job ranks; the group's callers know group ranks.
    fn in_group(&self, e: CommError, peer: usize) -> CommError {
        match e {
            CommError::Timeout { op, timeout, .. } => CommError::Timeout {
                op,
                rank: self.rank,
                peer: Some(peer),
                timeout,
            },
            CommError::Connection { op, message, .. } => CommError::Connection {
                op,
                rank: self.rank,
                peer,
                message,
            },
            other => other,
        }
    }
}

/// `n` connected endpoints of one in-process job over loopback (rank i at index i, sharing a
/// random secret), with the default timeout: the TCP transport's tests and benchmarks without
/// a launcher.
///
/// # Examples
///
/// Two ranks connected over loopback: one sends, the other echoes.
///
/// ```
/// use ddl_comm::tcp::tcp_group;
/// use ddl_comm::{tags, Transport};
///
/// let (ping, pong) = (tags::PINGPONG.tag(0), tags::PINGPONG.tag(1));
/// let mut ranks = tcp_group(2)?.into_iter();
/// let (zero, one) = (ranks.next().unwrap(), ranks.next().unwrap());
/// let echo = std::thread::spawn(move || {
///     let mut got = [0u8; 5];
///     one.recv(0, ping, &mut got)?;
///     one.send(0, pong, &got)
/// });
/// zero.send(1, ping, b"hello")?;
/// let mut back = [0u8; 5];
/// zero.recv(1, pong, &mut back)?;
/// assert_eq!(&back, b"hello");
/// echo.join().unwrap()?;
/// # Ok::<(), ddl_comm::CommError>(())
/// ```
pub fn tcp_group(n: usize) -> Result<Vec<TcpTransport>> {
    tcp_group_with_timeout(n, DEFAULT_TIMEOUT)
}

/// As [`tcp_group`], with blocking operations failing after `timeout`.
pub fn tcp_group_with_timeout(n: usize, timeout: Duration) -> Result<Vec<TcpTransport>> {
    let listeners = (0..n)
        .map(|_| Listener::bind("127.0.0.1"))
        .collect::<Result<Vec<_>>>()?;
    let addrs = listeners
        .iter()
        .map(Listener::local_addr)
        .collect::<Result<Vec<_>>>()?;
    let secret = Secret::random()?;
    let handles: Vec<_> = listeners
        .into_iter()
        .enumerate()
        .map(|(r, l)| {
            let (addrs, secret) = (addrs.clone(), secret.clone());
            std::thread::spawn(move || TcpTransport::connect(l, r, &addrs, &secret, timeout))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("connecting thread panicked"))
        .collect()
}

/// The context of the group of `color` made by split number `seq` of group `ctx`
/// (SplitMix64 of the three: the same on every member, distinct with overwhelming odds).
fn child_context(ctx: u64, seq: u64, color: usize) -> u64 {
    [seq, color as u64].iter().fold(ctx, |h, &v| {
        let mut z = (h ^ v).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    })
}

impl Transport for TcpTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.members.len()
    }

    fn send(&self, to: usize, tag: u32, data: &[u8]) -> Result<()> {
        self.post("send", to, Kind::User, tag, data)
    }

    fn recv(&self, from: usize, tag: u32, buf: &mut [u8]) -> Result<()> {
        let key = (self.ctx, Kind::User, tag);
        self.take_into("recv", from, key, buf, self.timeout.deadline(), false)
            .map(drop)
    }

    fn exchange(&self, ops: &mut [Op<'_>]) -> Result<()> {
        messaging::exchange(
            ops,
            &self.timeout,
            |to, tag, data| self.post("exchange send", to, Kind::User, tag, data),
            |from, tag, buf, deadline, up_to| {
                let key = (self.ctx, Kind::User, tag);
                self.take_into("exchange recv", from, key, buf, deadline, up_to)
            },
        )
    }

    fn split(&self, color: usize, key: usize) -> Result<Box<dyn Transport>> {
        let seq = self.splits.fetch_add(1, Ordering::Relaxed);
        let tag = seq as u32;
        let (members, _) = messaging::split_round(
            self.size(),
            (color, key),
            &self.timeout,
            |to, info| self.post("split", to, Kind::Split, tag, info),
            |from, buf, deadline| {
                let key = (self.ctx, Kind::Split, tag);
                self.take_into("split", from, key, buf, deadline, false)
                    .map(drop)
            },
        )?;
        let rank = members
            .iter()
            .position(|&s| s == self.rank)
            .expect("this rank is a member of its color");
        let job_ranks = members.iter().map(|&s| self.members[s]).collect();
        let ctx = child_context(self.ctx, seq, color);
        let mesh = Arc::clone(&self.mesh);
        Ok(Box::new(TcpTransport::group(
            mesh,
            ctx,
            job_ranks,
            rank,
            self.timeout(),
        )))
    }

    fn barrier(&self) -> Result<()> {
        let deadline = self.timeout.deadline();
        dissemination_barrier(
            self.rank,
            self.size(),
            |to, round| self.post("barrier", to, Kind::Barrier, round, &[]),
            |from, round| {
                let key = (self.ctx, Kind::Barrier, round);
                self.take_into("barrier", from, key, &mut [], deadline, false)
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
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

    use super::*;

    #[test]
    fn a_frame_claiming_two_to_the_forty_bytes_is_an_error_naming_its_sender() {
        // Rank 0's connection to an authenticated rank 1 (the handshake is not the point).
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let mut rank1 = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (to_rank1, _) = l.accept().expect("accept");
        let mesh = Arc::new(Mesh::start(0, vec![None, Some(to_rank1)]).expect("mesh"));
        let rank0 = TcpTransport::group(mesh, 0, vec![0, 1], 0, Duration::from_secs(10));
        let mut header = [0u8; 24];
        header[16..].copy_from_slice(&(1u64 << 40).to_le_bytes());
        rank1.write_all(&header).expect("send the header");
        // Before: "memory allocation of 1099511627776 bytes failed" and SIGABRT.
        let err = rank0.recv(1, 0, &mut [0u8; 4]).expect_err("refused");
        assert!(
            matches!(&err, CommError::Connection { op: "recv", rank: 0, peer: 1, message }
                if message.contains("claiming 1099511627776 bytes, over the limit")),
            "{err}"
        );
    }

    #[test]
    fn recycled_buffers_carry_each_message_exactly() {
        let group = tcp_group(2).expect("loopback group");
        let sizes = [1 << 20, 100 << 10, 3 << 20, 64 << 10, 1 << 20];
        std::thread::scope(|s| {
            let (a, b) = (&group[0], &group[1]);
            s.spawn(move || {
                for (i, n) in sizes.iter().enumerate() {
                    let msg: Vec<u8> = (0..*n).map(|j| (i * 7 + j % 251) as u8).collect();
                    a.send(1, i as u32, &msg).expect("send");
                }
            });
            for (i, n) in sizes.iter().enumerate() {
                let mut got = vec![0u8; *n];
                b.recv(0, i as u32, &mut got).expect("recv");
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
