//! Making the full mesh of a TCP job: every rank listens, publishes its listener's address
//! through whatever rendezvous the launcher offers (`ddl.dist` uses torch's TCPStore), then
//! connects to every lower rank and accepts every higher one, each connection authenticated
//! by the job's secret ([`super::handshake`]). A connection that does not authenticate (a
//! port scanner, a health check, a forged greeting, a flood of them) is dropped by the
//! listener's gate ([`super::gate`]) while it goes on accepting; the listener is closed once
//! every peer is connected.

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::gate::Gate;
use super::handshake::{self, Refused, Secret};
use crate::error::{CommError, Result};

/// Pause between two polls of a listener or two connection attempts while the peers start.
const POLL: Duration = Duration::from_millis(2);

/// Longest pause between two handshake attempts of a caller whose connection was dropped.
const MAX_PAUSE: Duration = Duration::from_millis(500);

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
/// every other rank, all proving that they hold `secret`; `streams[q]` is the connection to
/// rank q. Fails naming the rank that did not connect within `timeout`.
pub(crate) fn mesh_streams(
    listener: Listener,
    rank: usize,
    addrs: &[SocketAddr],
    secret: &Secret,
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
        let s = call_peer((rank, peer, size), addr, secret, deadline, timeout)?;
        streams[peer] = Some(s);
    }
    let job = (rank, addrs);
    accept_peers(&listener, job, &mut streams, secret, deadline, timeout)?;
    // Nobody may connect once the mesh stands: the listener goes now, not at the job's end.
    drop(listener);
    for (peer, s) in streams.iter().enumerate() {
        if let Some(s) = s {
            s.set_nodelay(true).map_err(|e| fail(rank, peer, &e))?;
        }
    }
    Ok(streams)
}

/// Connects rank `rank` of `size` to rank `peer` at `addr` and authenticates both ends,
/// dialling again (backing off) while the peer is not yet listening or drops the connection.
fn call_peer(
    (rank, peer, size): (usize, usize, usize),
    addr: &SocketAddr,
    secret: &Secret,
    deadline: Instant,
    timeout: Duration,
) -> Result<TcpStream> {
    let refused = |message: String| CommError::Connection {
        op: "connect",
        rank,
        peer,
        message,
    };
    let mut pause = POLL;
    loop {
        let s = dial(rank, peer, addr, deadline, timeout)?;
        let why = match handshake::call(&s, secret, (rank, peer, size), deadline) {
            Ok(()) => return Ok(s),
            Err(Refused::Impostor(why)) => {
                return Err(refused(format!(
                    "the listener at {addr}, published as rank {peer}'s, is refused: {why}"
                )))
            }
            Err(Refused::Broken(why)) => why,
        };
        if Instant::now() + pause >= deadline {
            return Err(refused(format!(
                "no handshake with {addr} within {timeout:?}; the last try: {why}"
            )));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(MAX_PAUSE);
    }
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

/// Connections taken off the listener's queue between two looks at the greetings.
const ACCEPTS_PER_LOOK: usize = 64;

/// Accepts ranks `rank + 1..` of `streams.len()` (whose ranks listen at `addrs` and hold
/// `secret`) into `streams`, each connection greeted by the listener's [`Gate`]: strangers
/// are dropped and counted, and never hold up a rank.
fn accept_peers(
    listener: &Listener,
    (rank, addrs): (usize, &[SocketAddr]),
    streams: &mut [Option<TcpStream>],
    secret: &Secret,
    deadline: Instant,
    timeout: Duration,
) -> Result<()> {
    let size = streams.len();
    listener
        .inner
        .set_nonblocking(true)
        .map_err(|e| fail(rank, rank, &e))?;
    let mut gate = Gate::new(rank, secret, addrs);
    let admitted = (|| {
        while let Some(missing) = (rank + 1..size).find(|&q| streams[q].is_none()) {
            if Instant::now() >= deadline {
                return Err(timed_out(rank, missing, timeout));
            }
            let peers = gate
                .wait(&listener.inner, deadline)
                .map_err(|e| fail(rank, missing, &e))?;
            for (s, peer, theirs) in peers {
                admit(rank, streams, (peer, theirs), s)?;
            }
            take_queued(listener, &mut gate).map_err(|e| fail(rank, missing, &e))?;
        }
        Ok(())
    })();
    gate.close();
    admitted
}

/// Hands the gate the connections waiting in the listener's queue (at most
/// [`ACCEPTS_PER_LOOK`]); out of file descriptors, it drops a greeting instead.
fn take_queued(listener: &Listener, gate: &mut Gate) -> std::io::Result<()> {
    for _ in 0..ACCEPTS_PER_LOOK {
        match listener.inner.accept() {
            Ok((s, from)) => gate.accept(s, from),
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionAborted | ErrorKind::Interrupted
                ) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                ) =>
            {
                gate.make_room();
                break;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Keeps the connection `s` of authenticated rank `peer` (of a job of `theirs` ranks, it
/// says), or fails naming a rank that counts differently or connected twice.
fn admit(
    rank: usize,
    streams: &mut [Option<TcpStream>],
    (peer, theirs): (usize, usize),
    s: TcpStream,
) -> Result<()> {
    let size = streams.len();
    if theirs != size {
        return Err(CommError::InvalidArgument(format!(
            "rank {rank} of {size}: rank {peer} connected saying the job has {theirs} ranks \
             (start every rank with the same WORLD_SIZE)"
        )));
    }
    if peer <= rank || peer >= size || streams[peer].is_some() {
        return Err(CommError::InvalidArgument(format!(
            "rank {rank}: a second connection claims to come from rank {peer} (were two \
             processes started as rank {peer}?)"
        )));
    }
    streams[peer] = Some(s);
    Ok(())
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
