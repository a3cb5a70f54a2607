//! Who may join a TCP job: a new connection between two ranks is kept only once each end has
//! proved that it holds the job's [`Secret`] (which `ddl.dist` passes through the rendezvous
//! store), and a stranger is told nothing but a random challenge.
//!
//! ```text
//! acceptor -> caller:   MAGIC, nonce_a                                   (CHALLENGE bytes)
//! caller -> acceptor:   MAGIC, caller, size, nonce_c, proof_c            (HELLO bytes)
//! acceptor -> caller:   proof_a                                          (PROOF bytes)
//! proof_c = HMAC-SHA256(secret, "connect" | nonce_a | caller | acceptor | size)
//! proof_a = HMAC-SHA256(secret, "accept"  | nonce_c | acceptor | caller | size)
//! ```
//!
//! The acceptor challenges first and answers only a caller that proved itself, so a stranger
//! never obtains a proof over a value of its choosing; fresh nonces make a recorded handshake
//! useless for another connection. Every frame has a fixed size and each read is bounded by a
//! deadline. The traffic after the handshake is neither encrypted nor authenticated: someone
//! on the path between two ranks can still read or alter it (docs/SECURITY.md).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::{CommError, Result};

/// First word of every handshake frame: "ddl-tcp2" (version 1 had no authentication).
const MAGIC: [u8; 8] = *b"ddl-tcp2";
/// Bytes of a nonce.
pub(crate) const NONCE: usize = 32;
/// Bytes of a proof (an HMAC-SHA256).
pub(crate) const PROOF: usize = 32;
/// Bytes of the acceptor's challenge.
pub(crate) const CHALLENGE: usize = 8 + NONCE;
/// Bytes of the caller's hello.
pub(crate) const HELLO: usize = 8 + 8 + 8 + NONCE + PROOF;

/// Longest a caller waits for each of the acceptor's frames (an acceptor answers within
/// milliseconds, or drops the connection: the caller dials again).
const HANDSHAKE: Duration = Duration::from_secs(10);

/// A TCP job's shared secret: every connection between two ranks proves that both ends hold
/// it. `ddl.dist` has rank 0 draw it and publish it in the rendezvous store, so whoever can
/// read that store can join the job (the trust torch.distributed places in its store).
#[derive(Clone)]
pub struct Secret(Arc<[u8]>);

impl Secret {
    /// Fewest bytes of a secret (32 random bytes are drawn by [`Secret::random`]).
    pub const MIN_LEN: usize = 16;

    /// The secret `bytes`, which the launcher's rendezvous gave every rank alike.
    pub fn new(bytes: &[u8]) -> Result<Secret> {
        if bytes.len() < Self::MIN_LEN {
            return Err(CommError::InvalidArgument(format!(
                "the TCP job's secret has {} bytes, fewer than {}: pass the random bytes rank 0 \
                 published in the rendezvous store",
                bytes.len(),
                Self::MIN_LEN
            )));
        }
        Ok(Secret(bytes.into()))
    }

    /// 32 bytes from the operating system's random generator (in-process groups, or the rank
    /// that publishes the job's secret).
    pub fn random() -> Result<Secret> {
        Ok(Secret(random::<32>()?.as_slice().into()))
    }

    /// The proof of holding the secret over `nonce` for a connection `from` -> `to` in a job
    /// of `size` ranks; `direction` keeps the two ends' proofs apart.
    fn proof(
        &self,
        direction: &[u8],
        nonce: &[u8],
        from: usize,
        to: usize,
        size: usize,
    ) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(direction);
        mac.update(nonce);
        for word in [from, to, size] {
            mac.update(&(word as u64).to_le_bytes());
        }
        mac
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// `N` bytes from the operating system's random generator.
fn random<const N: usize>() -> Result<[u8; N]> {
    let mut bytes = [0u8; N];
    getrandom::getrandom(&mut bytes).map_err(|e| {
        CommError::InvalidArgument(format!("the system's random generator failed: {e}"))
    })?;
    Ok(bytes)
}

/// Bounds the socket's reads and writes by `deadline` and the handshake's own limit.
fn limit(s: &TcpStream, deadline: Instant) -> std::io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    let left = Some(left.min(HANDSHAKE).max(Duration::from_millis(1)));
    s.set_nonblocking(false)?;
    s.set_read_timeout(left)?;
    s.set_write_timeout(left)
}

/// Lifts the handshake's limits (the transport bounds its own writes; a reader waits).
fn unlimit(s: &TcpStream) -> std::io::Result<()> {
    s.set_read_timeout(None)?;
    s.set_write_timeout(None)
}

/// How a caller's handshake failed.
#[derive(Debug)]
pub(crate) enum Refused {
    /// The connection broke or was dropped (the acceptor may have been busy): dial again.
    Broken(String),
    /// The listener is not the peer's (not ddl's, or without the job's secret): give up.
    Impostor(String),
}

/// The caller's side: proves to the acceptor `to` that rank `from` of `size` holds `secret`,
/// and checks its proof in turn.
pub(crate) fn call(
    mut s: &TcpStream,
    secret: &Secret,
    (from, to, size): (usize, usize, usize),
    deadline: Instant,
) -> std::result::Result<(), Refused> {
    let broken = |e: std::io::Error| Refused::Broken(e.to_string());
    limit(s, deadline).map_err(broken)?;
    let mut challenge = [0u8; CHALLENGE];
    s.read_exact(&mut challenge).map_err(|e| {
        Refused::Broken(format!(
            "the listener dropped the connection before its challenge ({e}): it greets too \
             many connections at once (strangers flooding it?)"
        ))
    })?;
    if challenge[..8] != MAGIC {
        return Err(Refused::Impostor(
            "it is not a ddl rank's listener (or one of another ddl version)".into(),
        ));
    }
    let nonce = random::<NONCE>().map_err(|e| Refused::Broken(e.to_string()))?;
    let mut hello = Vec::with_capacity(HELLO);
    hello.extend_from_slice(&MAGIC);
    hello.extend_from_slice(&(from as u64).to_le_bytes());
    hello.extend_from_slice(&(size as u64).to_le_bytes());
    hello.extend_from_slice(&nonce);
    let proof = secret.proof(b"connect", &challenge[8..], from, to, size);
    hello.extend_from_slice(&proof.finalize().into_bytes());
    s.write_all(&hello).map_err(broken)?;
    let mut answer = [0u8; PROOF];
    s.read_exact(&mut answer).map_err(|e| {
        Refused::Broken(format!(
            "the listener dropped this rank's greeting ({e}): it holds another secret (start \
             every rank from the same rendezvous), or it dropped the greeting as late"
        ))
    })?;
    secret
        .proof(b"accept", &nonce, to, from, size)
        .verify_slice(&answer)
        .map_err(|_| {
            Refused::Impostor("its answer does not prove that it holds the job's secret".into())
        })?;
    unlimit(s).map_err(broken)
}

/// The acceptor's challenge to a new connection, and the nonce in it.
pub(crate) fn challenge() -> Result<([u8; CHALLENGE], [u8; NONCE])> {
    let nonce = random::<NONCE>()?;
    let mut challenge = [0u8; CHALLENGE];
    challenge[..8].copy_from_slice(&MAGIC);
    challenge[8..].copy_from_slice(&nonce);
    Ok((challenge, nonce))
}

/// The acceptor's verdict on the `hello` of a connection it challenged with `nonce`, as rank
/// `to`: the caller's rank, the job size it states (the caller's to check) and this rank's
/// answer, or why the caller is a stranger.
pub(crate) fn check_hello(
    secret: &Secret,
    to: usize,
    nonce: &[u8; NONCE],
    hello: &[u8; HELLO],
) -> std::result::Result<(usize, usize, [u8; PROOF]), &'static str> {
    if hello[..8] != MAGIC {
        return Err("its greeting is not a ddl rank's");
    }
    let word = |i: usize| u64::from_le_bytes(hello[i..i + 8].try_into().expect("8 bytes"));
    let (Ok(from), Ok(their_size)) = (usize::try_from(word(8)), usize::try_from(word(16))) else {
        return Err("its greeting names no rank");
    };
    let proof = secret.proof(b"connect", nonce, from, to, their_size);
    if proof.verify_slice(&hello[24 + NONCE..]).is_err() {
        return Err("its greeting does not prove that it holds the job's secret");
    }
    let answer = secret.proof(b"accept", &hello[24..24 + NONCE], to, from, their_size);
    Ok((from, their_size, answer.finalize().into_bytes().into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// Both ends of one loopback connection.
    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let c = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        (c, l.accept().expect("accept").0)
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    /// The acceptor's side as rank `to` on a blocking connection: challenge, greeting,
    /// verdict; `answer` makes what it sends back from the proof it owes.
    fn greet(
        mut s: &TcpStream,
        secret: &Secret,
        to: usize,
        answer: impl Fn([u8; PROOF]) -> [u8; PROOF],
    ) -> std::result::Result<(usize, usize), &'static str> {
        let (challenge, nonce) = challenge().expect("a challenge");
        s.write_all(&challenge).expect("challenge sent");
        let mut hello = [0u8; HELLO];
        s.read_exact(&mut hello).map_err(|_| "no greeting")?;
        let (from, size, proof) = check_hello(secret, to, &nonce, &hello)?;
        s.write_all(&answer(proof)).expect("answer sent");
        Ok((from, size))
    }

    #[test]
    fn ranks_holding_the_secret_meet() {
        let secret = Secret::random().expect("secret");
        let (c, a) = pair();
        let s2 = secret.clone();
        let caller = std::thread::spawn(move || call(&c, &s2, (3, 1, 4), soon()));
        assert_eq!(greet(&a, &secret, 1, |p| p), Ok((3, 4)));
        caller
            .join()
            .expect("caller")
            .expect("the acceptor proved itself");
    }

    #[test]
    fn another_secret_is_a_stranger_on_both_ends() {
        let (c, a) = pair();
        let theirs = Secret::random().expect("secret");
        let caller = std::thread::spawn(move || call(&c, &theirs, (1, 0, 2), soon()));
        let mine = Secret::random().expect("secret");
        let got = greet(&a, &mine, 0, |p| p);
        assert_eq!(
            got,
            Err("its greeting does not prove that it holds the job's secret")
        );
        drop(a);
        let refused = caller.join().expect("caller").expect_err("no answer");
        assert!(
            matches!(&refused, Refused::Broken(why) if why.contains("another secret")),
            "{refused:?}"
        );
    }

    /// What the caller holding the job's secret makes of an acceptor holding `acceptor` that
    /// answers `answer` (of the proof it owes).
    fn caller_meets(
        acceptor: &Secret,
        answer: impl Fn([u8; PROOF]) -> [u8; PROOF],
    ) -> std::result::Result<(), Refused> {
        let job = Secret::new(&[7; 32]).expect("secret");
        let (c, a) = pair();
        let caller = std::thread::spawn(move || call(&c, &job, (1, 0, 2), soon()));
        let _ = greet(&a, acceptor, 0, answer);
        caller.join().expect("caller")
    }

    #[test]
    fn an_acceptor_that_does_not_prove_the_secret_is_an_impostor() {
        let job = Secret::new(&[7; 32]).expect("secret");
        let not_a_proof = "its answer does not prove that it holds the job's secret";
        // Answering random bytes, the right proof with one bit changed, and a proof recorded
        // from an earlier handshake of the real rank 0 (another caller's nonce).
        let recorded = std::sync::Mutex::new(None);
        caller_meets(&job, |p| {
            *recorded.lock().unwrap() = Some(p);
            p
        })
        .expect("the real rank 0 proves itself");
        let recorded = recorded.into_inner().unwrap().expect("a recorded proof");
        let answers: [&dyn Fn([u8; PROOF]) -> [u8; PROOF]; 3] = [
            &|_| random::<PROOF>().expect("random"),
            &|mut p| {
                p[5] ^= 1;
                p
            },
            &|_| recorded,
        ];
        for (k, answer) in answers.into_iter().enumerate() {
            let refused = caller_meets(&job, answer).expect_err("not proved");
            assert!(
                matches!(&refused, Refused::Impostor(why) if why == not_a_proof),
                "answer {k}: {refused:?}"
            );
        }
    }

    #[test]
    fn a_listener_that_is_not_a_ddl_ranks_is_an_impostor() {
        let (c, mut a) = pair();
        let job = Secret::random().expect("secret");
        let caller = std::thread::spawn(move || call(&c, &job, (1, 0, 2), soon()));
        a.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            .expect("reply");
        let refused = caller.join().expect("caller").expect_err("not ddl's");
        assert!(
            matches!(&refused, Refused::Impostor(why) if why.contains("not a ddl rank's listener")),
            "{refused:?}"
        );
    }

    #[test]
    fn a_short_secret_is_refused_naming_the_length() {
        let err = Secret::new(b"short").expect_err("5 bytes");
        assert!(err.to_string().contains("5 bytes, fewer than 16"), "{err}");
        assert_eq!(
            format!("{:?}", Secret::new(&[7; 32]).expect("32 bytes")),
            "Secret(..)"
        );
    }
}
