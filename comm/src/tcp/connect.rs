//! Making the full mesh of a TCP job: every rank listens, publishes its listener's address
//! through whatever rendezvous the launcher offers (`ddl.dist` uses torch's TCPStore), then
//! connects to every lower rank and accepts every higher one, each connection authenticated
//! by the job's secret ([`super::handshake`]). A connection that does not authenticate (a
//! port scanner, a health check, a forged greeting) is dropped with a warning while the
//! listener goes on accepting; the listener is closed once every peer is connected.

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{RecvTimeoutError, Sender};

use super::handshake::{self, Greeting, Refused, Secret};
use crate::error::{CommError, Result};

/// Pause between two polls of a listener or two connection attempts while the peers start.
const POLL: Duration = Duration::from_millis(2);

/// Longest pause between two handshake attempts of a caller whose connection was dropped.
const MAX_PAUSE: Duration = Duration::from_millis(500);

/// Handshakes a listener runs at once; a connection beyond them is dropped at once (a rank
/// dials again), so a flood of strangers costs a bounded number of threads.
const MAX_HANDSHAKES: usize = 64;

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
    accept_peers(&listener, rank, &mut streams, secret, deadline, timeout)?;
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
                "no handshake with {addr} within {timeout:?} (last: {why}); rank {peer} drops a \
                 rank without the job's secret: start every rank from the same rendezvous"
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

/// A finished handshake of an accepted connection, sent back to the accepting loop.
type Outcome = (TcpStream, SocketAddr, Greeting);

/// Accepts ranks `rank + 1..` of `streams.len()` into `streams`. Each connection is greeted
/// on a thread of its own, so a stranger (silent, or sending garbage) never holds up a rank;
/// strangers are dropped with a warning.
fn accept_peers(
    listener: &Listener,
    rank: usize,
    streams: &mut [Option<TcpStream>],
    secret: &Secret,
    deadline: Instant,
    timeout: Duration,
) -> Result<()> {
    let size = streams.len();
    let (tx, rx) = crossbeam_channel::unbounded::<Outcome>();
    let running = Arc::new(AtomicUsize::new(0));
    listener
        .inner
        .set_nonblocking(true)
        .map_err(|e| fail(rank, rank, &e))?;
    while let Some(missing) = (rank + 1..size).find(|&q| streams[q].is_none()) {
        // Outcomes are read after every accept: a flood of connections never starves them.
        let wait = match listener.inner.accept() {
            Ok((s, from)) => {
                let job = (rank, secret.clone(), deadline);
                greet_apart(s, from, job, &tx, &running);
                Duration::ZERO
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => POLL,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionAborted | ErrorKind::Interrupted
                ) =>
            {
                Duration::ZERO
            }
            Err(e) => return Err(fail(rank, missing, &e)),
        };
        match rx.recv_timeout(wait) {
            Ok((
                s,
                _,
                Greeting::Peer {
                    rank: peer,
                    size: theirs,
                },
            )) => admit(rank, streams, (peer, theirs), s)?,
            Ok((_, from, Greeting::Stranger(why))) => warn_stranger(rank, from, &why),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {}
        }
        if Instant::now() >= deadline {
            return Err(timed_out(rank, missing, timeout));
        }
    }
    Ok(())
}

/// Greets the accepted connection `s` from `from` on a thread of its own (unless
/// [`MAX_HANDSHAKES`] run already), sending the outcome to `tx`.
fn greet_apart(
    s: TcpStream,
    from: SocketAddr,
    (rank, secret, deadline): (usize, Secret, Instant),
    tx: &Sender<Outcome>,
    running: &Arc<AtomicUsize>,
) {
    if running.fetch_add(1, Ordering::AcqRel) >= MAX_HANDSHAKES {
        running.fetch_sub(1, Ordering::AcqRel);
        return warn_stranger(rank, from, "too many handshakes under way");
    }
    let (tx, count) = (tx.clone(), Arc::clone(running));
    let spawned = std::thread::Builder::new()
        .name(format!("ddl-tcp-greet-{rank}"))
        .spawn(move || {
            let greeting = handshake::greet(&s, &secret, rank, deadline);
            count.fetch_sub(1, Ordering::AcqRel);
            // The loop is gone once every rank connected: the stranger is dropped then.
            let _ = tx.send((s, from, greeting));
        });
    if let Err(e) = spawned {
        running.fetch_sub(1, Ordering::AcqRel);
        warn_stranger(rank, from, &format!("no thread to greet it ({e})"));
    }
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

/// Reports a dropped connection that was not a rank of this job (it changes nothing else).
fn warn_stranger(rank: usize, from: SocketAddr, why: &str) {
    eprintln!("ddl warning: rank {rank} dropped a connection to its listener from {from}: {why}");
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
