//! Making the full mesh of a TCP job: every rank listens, publishes its listener's address
//! through whatever rendezvous the launcher offers (`ddl.dist` uses torch's TCPStore), then
//! connects to every lower rank and accepts every higher one. The first bytes on each
//! connection name the connecting rank and the job size, so a connection from another job or
//! a rank that counts differently is refused by name.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::error::{CommError, Result};

/// First word of every connection: "ddl-tcp1".
const MAGIC: u64 = u64::from_le_bytes(*b"ddl-tcp1");

/// Pause between two polls of a listener or two connection attempts while the peers start.
const POLL: Duration = Duration::from_millis(2);

/// A rank's listening socket, bound before the ranks exchange addresses.
#[derive(Debug)]
pub struct Listener {
    inner: TcpListener,
}

impl Listener {
    /// Binds `host` (an interface address the other ranks can reach; `0.0.0.0` for all) on a
    /// port the system picks.
    pub fn bind(host: &str) -> Result<Listener> {
        let bad =
            |message: String| CommError::InvalidArgument(format!("listen on {host}: {message}"));
        let addr = (host, 0)
            .to_socket_addrs()
            .map_err(|e| bad(e.to_string()))?
            .next()
            .ok_or_else(|| bad("no address".into()))?;
        let inner = TcpListener::bind(addr).map_err(|e| bad(e.to_string()))?;
        Ok(Listener { inner })
    }

    /// The address this listener accepts on.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.inner
            .local_addr()
            .map_err(|e| CommError::InvalidArgument(format!("listener address: {e}")))
    }
}

/// Connects rank `rank` of `addrs.len()` (whose listener is `listener`, at `addrs[rank]`) to
/// every other rank; `streams[q]` is the connection to rank q. Fails naming the rank that
/// did not connect within `timeout`.
pub(crate) fn mesh_streams(
    listener: Listener,
    rank: usize,
    addrs: &[SocketAddr],
    timeout: Duration,
) -> Result<Vec<Option<TcpStream>>> {
    let size = addrs.len();
    if rank >= size {
        return Err(CommError::InvalidArgument(format!(
            "rank {rank} is not a rank of a job of {size}"
        )));
    }
    let deadline = Instant::now() + timeout;
    let mut streams: Vec<Option<TcpStream>> = (0..size).map(|_| None).collect();
    for (peer, addr) in addrs.iter().enumerate().take(rank) {
        let mut s = dial(rank, peer, addr, deadline, timeout)?;
        let mut hello = [0u8; 24];
        hello[..8].copy_from_slice(&MAGIC.to_le_bytes());
        hello[8..16].copy_from_slice(&(rank as u64).to_le_bytes());
        hello[16..].copy_from_slice(&(size as u64).to_le_bytes());
        s.write_all(&hello).map_err(|e| fail(rank, peer, &e))?;
        streams[peer] = Some(s);
    }
    listener
        .inner
        .set_nonblocking(true)
        .map_err(|e| fail(rank, rank, &e))?;
    while let Some(missing) = (rank + 1..size).find(|&q| streams[q].is_none()) {
        let (s, peer) = match listener.inner.accept() {
            Ok((s, _)) => {
                let peer = hello_from(&s, rank, size, deadline)?;
                (s, peer)
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(timed_out(rank, missing, timeout));
                }
                std::thread::sleep(POLL);
                continue;
            }
            Err(e) => return Err(fail(rank, missing, &e)),
        };
        if peer <= rank || streams[peer].is_some() {
            return Err(CommError::InvalidArgument(format!(
                "rank {rank}: a second connection claims to come from rank {peer}"
            )));
        }
        streams[peer] = Some(s);
    }
    for (peer, s) in streams.iter().enumerate() {
        if let Some(s) = s {
            s.set_nonblocking(false).map_err(|e| fail(rank, peer, &e))?;
            s.set_nodelay(true).map_err(|e| fail(rank, peer, &e))?;
        }
    }
    Ok(streams)
}

/// Connects to rank `peer` at `addr`, retrying while it is not yet listening.
fn dial(
    rank: usize,
    peer: usize,
    addr: &SocketAddr,
    deadline: Instant,
    timeout: Duration,
) -> Result<TcpStream> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out(rank, peer, timeout));
        }
        match TcpStream::connect_timeout(addr, left) {
            Ok(s) => return Ok(s),
            Err(e) if matches!(e.kind(), ErrorKind::ConnectionRefused | ErrorKind::TimedOut) => {
                std::thread::sleep(POLL)
            }
            Err(e) => return Err(fail(rank, peer, &e)),
        }
    }
}

/// The rank named by the first bytes of an accepted connection, checked against this job.
fn hello_from(mut s: &TcpStream, rank: usize, size: usize, deadline: Instant) -> Result<usize> {
    let left = deadline.saturating_duration_since(Instant::now());
    let mut hello = [0u8; 24];
    s.set_nonblocking(false)
        .and_then(|_| s.set_read_timeout(Some(left.max(Duration::from_millis(1)))))
        .and_then(|_| s.read_exact(&mut hello))
        .and_then(|_| s.set_read_timeout(None))
        .map_err(|e| fail(rank, rank, &e))?;
    let word = |i: usize| u64::from_le_bytes(hello[i..i + 8].try_into().expect("8 bytes"));
    let (peer, their_size) = (word(8) as usize, word(16) as usize);
    if word(0) != MAGIC {
        return Err(CommError::InvalidArgument(format!(
            "rank {rank}: a connection to its listener is not from a ddl rank"
        )));
    }
    if their_size != size || peer >= size {
        return Err(CommError::InvalidArgument(format!(
            "rank {rank} of {size}: rank {peer} connected saying the job has {their_size} ranks"
        )));
    }
    Ok(peer)
}

fn fail(rank: usize, peer: usize, e: &std::io::Error) -> CommError {
    super::mesh::io_error("connect", rank, peer, e)
}

fn timed_out(rank: usize, peer: usize, timeout: Duration) -> CommError {
    CommError::Timeout {
        op: "connect",
        rank,
        peer: Some(peer),
        timeout,
    }
}
