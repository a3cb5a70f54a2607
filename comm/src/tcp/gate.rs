//! Whom a rank's listener greets while the mesh is made. Every connection is challenged
//! ([`super::handshake`]) and kept until its greeting proves it a rank of the job or shows
//! it a stranger. A stranger who knows the port (a port scanner, a health check, garbage, a
//! silent connection, a flood of them) costs the job's ranks bounded work and never their
//! place:
//!
//! - a connection has [`GREETING`] from its challenge to its whole greeting (a rank sends it
//!   within milliseconds; a rank dropped as late dials again);
//! - at most [`MAX_GREETINGS`] connections are greeted at once, at most [`PER_STRANGER`] of
//!   them from one address that is not a host of the job's ranks (the addresses the ranks
//!   listen on); one more takes the place of the oldest greeting of the address holding the
//!   most, strangers' addresses first, so a flood displaces its own connections, never those
//!   of the ranks' hosts while it holds any;
//! - an address that is not a host of the job's ranks may open [`STRANGER_BURST`]
//!   connections, then [`STRANGER_RATE`] a second: those beyond are closed unread;
//! - dropped connections are named one line each for the first [`NAMED`], then counted in
//!   one line at most every [`SUMMARY_EVERY`], and once when the mesh stands.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::handshake::{self, Secret, HELLO, NONCE};

/// Longest from a connection's challenge to its whole greeting.
pub(crate) const GREETING: Duration = Duration::from_secs(2);

/// Connections greeted at once.
pub(crate) const MAX_GREETINGS: usize = 256;

/// Connections greeted at once from one address that is not a host of the job's ranks.
pub(crate) const PER_STRANGER: usize = 32;

/// Connections an address that is not a host of the job's ranks may open at once...
pub(crate) const STRANGER_BURST: f64 = 64.0;

/// ... and then each second.
pub(crate) const STRANGER_RATE: f64 = 32.0;

/// Dropped connections named one line each.
pub(crate) const NAMED: u64 = 8;

/// Shortest time between two lines counting dropped connections.
pub(crate) const SUMMARY_EVERY: Duration = Duration::from_secs(10);

/// A connection being greeted: challenged, its greeting arriving.
struct Greeting {
    s: TcpStream,
    from: SocketAddr,
    since: Instant,
    nonce: [u8; NONCE],
    hello: [u8; HELLO],
    got: usize,
}

/// What the gate knows of one address.
struct Source {
    /// Its connections being greeted.
    greeting: usize,
    /// Connections it may still open (strangers' addresses only).
    tokens: f64,
    /// When `tokens` was last refilled.
    refilled: Instant,
}

impl Source {
    /// Gives back the connections the rate allows since the last refill.
    fn refill(&mut self, now: Instant) {
        let earned = now.duration_since(self.refilled).as_secs_f64() * STRANGER_RATE;
        self.tokens = (self.tokens + earned).min(STRANGER_BURST);
        self.refilled = now;
    }
}

/// Why a connection was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Why {
    /// Its address opened connections faster than a stranger may.
    Rate,
    /// Newer connections took its place.
    Displaced,
    /// No greeting within [`GREETING`].
    Silent,
    /// Part of a greeting within [`GREETING`].
    Slow,
    /// It closed the connection, or the connection broke, before its greeting.
    Closed,
    /// Its greeting was not a rank's of this job.
    Refused(&'static str),
}

impl Why {
    /// The line's reason, and the summary's.
    fn describe(self) -> (String, &'static str) {
        match self {
            Why::Rate => (
                format!(
                    "its address opened more than {STRANGER_BURST} connections, or more than \
                     {STRANGER_RATE} a second, and is not a host of the job's ranks"
                ),
                "over their address's rate",
            ),
            Why::Displaced => (
                format!(
                    "newer connections took its place (the listener greets {MAX_GREETINGS} at \
                     once, {PER_STRANGER} from an address that is not a host of the job's ranks)"
                ),
                "displaced",
            ),
            Why::Silent => (format!("no greeting within {GREETING:?}"), "silent"),
            Why::Slow => (format!("part of a greeting within {GREETING:?}"), "slow"),
            Why::Closed => (
                "it closed the connection before its greeting".into(),
                "closed",
            ),
            Why::Refused(why) => (why.into(), "not a rank of this job"),
        }
    }
}

/// The dropped connections' lines (see the module documentation).
struct Drops {
    rank: usize,
    /// Dropped so far.
    total: u64,
    /// Not yet in a line: by reason, and by address.
    why: BTreeMap<&'static str, u64>,
    from: HashMap<IpAddr, u64>,
    /// When the last summary line was written (or the gate opened).
    summarised: Instant,
}

impl Drops {
    fn note(&mut self, from: SocketAddr, why: Why, now: Instant) {
        self.total += 1;
        let (line, short) = why.describe();
        if self.total <= NAMED {
            let rank = self.rank;
            eprintln!(
                "ddl warning: rank {rank} dropped a connection to its listener from {from}: {line}"
            );
            self.summarised = now;
            return;
        }
        *self.why.entry(short).or_default() += 1;
        *self.from.entry(from.ip()).or_default() += 1;
        if now.duration_since(self.summarised) >= SUMMARY_EVERY {
            self.summarise(now);
        }
    }

    /// One line counting the drops not yet in a line, if any.
    fn summarise(&mut self, now: Instant) {
        let count: u64 = self.why.values().sum();
        if count == 0 {
            return;
        }
        let (top, most) = self
            .from
            .iter()
            .max_by_key(|(_, n)| **n)
            .map(|(ip, n)| (*ip, *n))
            .expect("a drop has an address");
        let why: Vec<String> = self.why.iter().map(|(w, n)| format!("{n} {w}")).collect();
        eprintln!(
            "ddl warning: rank {} dropped {count} more connections to its listener in {:.0?} \
             from {} address(es), {most} from {top}: {} (strangers: the job goes on)",
            self.rank,
            now.duration_since(self.summarised),
            self.from.len(),
            why.join(", ")
        );
        self.why.clear();
        self.from.clear();
        self.summarised = now;
    }
}

/// The greetings of one rank's listener (see the module documentation).
pub(crate) struct Gate {
    rank: usize,
    secret: Secret,
    job_hosts: HashSet<IpAddr>,
    /// Oldest first.
    greetings: Vec<Greeting>,
    sources: HashMap<IpAddr, Source>,
    drops: Drops,
}

impl Gate {
    /// The gate of rank `rank` of the job whose ranks listen at `addrs` and hold `secret`.
    pub(crate) fn new(rank: usize, secret: &Secret, addrs: &[SocketAddr]) -> Gate {
        Gate {
            rank,
            secret: secret.clone(),
            job_hosts: addrs.iter().map(SocketAddr::ip).collect(),
            greetings: Vec::new(),
            sources: HashMap::new(),
            drops: Drops {
                rank,
                total: 0,
                why: BTreeMap::new(),
                from: HashMap::new(),
                summarised: Instant::now(),
            },
        }
    }

    /// Takes in connection `s` from `from`: challenged and greeted, or dropped.
    pub(crate) fn accept(&mut self, s: TcpStream, from: SocketAddr) {
        let now = Instant::now();
        let ip = from.ip();
        let stranger = !self.job_hosts.contains(&ip);
        let source = self.sources.entry(ip).or_insert(Source {
            greeting: 0,
            tokens: STRANGER_BURST,
            refilled: now,
        });
        if stranger {
            source.refill(now);
            if source.tokens < 1.0 {
                return self.drops.note(from, Why::Rate, now);
            }
            source.tokens -= 1.0;
        }
        if stranger && source.greeting >= PER_STRANGER {
            self.displace(Some(ip), now);
        } else if self.greetings.len() >= MAX_GREETINGS {
            self.make_room();
        }
        let challenged = handshake::challenge().ok().filter(|(challenge, _)| {
            s.set_nonblocking(true).is_ok() && (&s).write(challenge).ok() == Some(challenge.len())
        });
        let Some((_, nonce)) = challenged else {
            return self.drops.note(from, Why::Closed, now);
        };
        self.count(ip, 1);
        self.greetings.push(Greeting {
            s,
            from,
            since: now,
            nonce,
            hello: [0; HELLO],
            got: 0,
        });
    }

    /// Drops the oldest greeting of the address holding the most, strangers' first: room for
    /// one more connection.
    pub(crate) fn make_room(&mut self) {
        let job_hosts = &self.job_hosts;
        let fullest = self
            .sources
            .iter()
            .filter(|(_, s)| s.greeting > 0)
            .max_by_key(|(ip, s)| (!job_hosts.contains(ip), s.greeting))
            .map(|(ip, _)| *ip);
        self.displace(fullest, Instant::now());
    }

    /// Drops the oldest greeting from `ip`.
    fn displace(&mut self, ip: Option<IpAddr>, now: Instant) {
        if let Some(i) = self.greetings.iter().position(|g| Some(g.from.ip()) == ip) {
            self.drop_at(i, Why::Displaced, now);
        }
    }

    fn drop_at(&mut self, i: usize, why: Why, now: Instant) {
        let g = self.greetings.remove(i);
        self.count(g.from.ip(), -1);
        self.drops.note(g.from, why, now);
    }

    fn count(&mut self, ip: IpAddr, by: isize) {
        if let Some(s) = self.sources.get_mut(&ip) {
            s.greeting = s.greeting.saturating_add_signed(by);
        }
    }

    /// Waits until `listener` has a connection, a greeting has bytes or the oldest greeting's
    /// time is up, at most until `until`; reads what the greetings sent, drops the strangers
    /// and those whose time is up. The ranks that proved themselves: (connection, rank, the
    /// job size it states).
    pub(crate) fn wait(
        &mut self,
        listener: &TcpListener,
        until: Instant,
    ) -> std::io::Result<Vec<(TcpStream, usize, usize)>> {
        let now = Instant::now();
        let first_due = self.greetings.first().map(|g| g.since + GREETING);
        let until = first_due.map_or(until, |d| d.min(until));
        let ms = until.saturating_duration_since(now).as_millis().min(1000) as libc::c_int;
        let mut fds: Vec<libc::pollfd> = std::iter::once(listener.as_raw_fd())
            .chain(self.greetings.iter().map(|g| g.s.as_raw_fd()))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` holds fds.len() pollfd entries of open sockets.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != ErrorKind::Interrupted {
                return Err(e);
            }
        }
        let ready: Vec<bool> = fds[1..].iter().map(|f| f.revents != 0).collect();
        let mut peers = Vec::new();
        let now = Instant::now();
        for i in (0..ready.len()).rev() {
            if ready[i] {
                if let Some(peer) = self.read(i, now) {
                    peers.push(peer);
                }
            }
        }
        while let Some(g) = self.greetings.first() {
            if now < g.since + GREETING {
                break;
            }
            let why = if g.got == 0 { Why::Silent } else { Why::Slow };
            self.drop_at(0, why, now);
        }
        // An address is forgotten once nothing of it is greeted and its burst is back.
        self.sources.retain(|_, s| {
            s.refill(now);
            s.greeting > 0 || s.tokens < STRANGER_BURST
        });
        Ok(peers)
    }

    /// Reads what greeting `i` sent; the rank it proved to be, once its greeting is whole.
    fn read(&mut self, i: usize, now: Instant) -> Option<(TcpStream, usize, usize)> {
        let g = &mut self.greetings[i];
        match (&g.s).read(&mut g.hello[g.got..]) {
            Ok(0) => {}
            Ok(n) => {
                g.got += n;
                if g.got < HELLO {
                    return None;
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return None,
            Err(_) => {}
        }
        if g.got < HELLO {
            self.drop_at(i, Why::Closed, now);
            return None;
        }
        let verdict = handshake::check_hello(&self.secret, self.rank, &g.nonce, &g.hello);
        let (from, size, answer) = match verdict {
            Ok(v) => v,
            Err(why) => {
                self.drop_at(i, Why::Refused(why), now);
                return None;
            }
        };
        let answered =
            (&g.s).write(&answer).ok() == Some(answer.len()) && g.s.set_nonblocking(false).is_ok();
        if !answered {
            self.drop_at(i, Why::Closed, now);
            return None;
        }
        let g = self.greetings.remove(i);
        self.count(g.from.ip(), -1);
        Some((g.s, from, size))
    }

    /// Counts the connections not yet in a line, once the mesh stands or fails.
    pub(crate) fn close(mut self) {
        self.drops.summarise(Instant::now());
    }
}
