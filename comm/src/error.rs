//! Errors of ddl-comm: every variant names the operation and, where there is one, the peer.

use std::path::PathBuf;
use std::time::Duration;

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, CommError>;

/// Formats an optional peer rank for error messages.
fn peer_name(peer: &Option<usize>) -> String {
    match peer {
        Some(p) => format!("peer {p}"),
        None => "the other ranks".to_string(),
    }
}

/// An error of a communication operation.
#[derive(Debug, thiserror::Error)]
pub enum CommError {
    /// The operation did not complete before the transport's operation timeout: the peer is
    /// presumed dead. On MPI the job must then be aborted ([`crate::world::World::abort`]).
    #[error("{op} on rank {rank}: timed out after {timeout:?} waiting for {}", peer_name(.peer))]
    Timeout {
        /// The operation (e.g. `recv`, `exchange`, `barrier`).
        op: &'static str,
        /// The rank that observed the timeout.
        rank: usize,
        /// The peer that did not answer (None for collectives with no single peer).
        peer: Option<usize>,
        /// The timeout in force.
        timeout: Duration,
    },
    /// The peer's end of the connection is gone (its thread or process exited).
    #[error("{op} on rank {rank}: peer {peer} disconnected")]
    Disconnected {
        /// The operation.
        op: &'static str,
        /// The rank that observed the disconnection.
        rank: usize,
        /// The peer that went away.
        peer: usize,
    },
    /// A received message has a different length than the receive buffer.
    #[error("{op} on rank {rank}: message from peer {peer} has {got} bytes, expected {expected}")]
    SizeMismatch {
        /// The operation.
        op: &'static str,
        /// The receiving rank.
        rank: usize,
        /// The sending peer.
        peer: usize,
        /// Bytes expected (receive buffer length).
        expected: usize,
        /// Bytes received.
        got: usize,
    },
    /// A peer rank outside `0..size`.
    #[error("{op} on rank {rank}: peer {peer} is out of range for a group of {size} ranks")]
    InvalidPeer {
        /// The operation.
        op: &'static str,
        /// The calling rank.
        rank: usize,
        /// The offending peer rank.
        peer: usize,
        /// The group size.
        size: usize,
    },
    /// A peer's process exited while this rank waited for it in shared memory (the `shm`
    /// algorithms watch their node's peers; the job cannot go on).
    #[error("{op} on rank {rank}: peer {peer}'s process exited while this rank waited for it")]
    PeerExited {
        /// The operation.
        op: &'static str,
        /// The rank that observed it.
        rank: usize,
        /// The rank whose process is gone.
        peer: usize,
    },
    /// Another rank of the job failed and said why ([`crate::Transport::announce_failure`]):
    /// this rank stops too, instead of waiting out the timeout.
    #[error("{op} on rank {rank}: rank {peer} failed, and the job stops: {reason}")]
    PeerFailed {
        /// The operation that was waiting.
        op: &'static str,
        /// This rank, in the job.
        rank: usize,
        /// The rank that failed, in the job.
        peer: usize,
        /// What it said.
        reason: String,
    },
    /// A connection of the TCP transport could not be made or failed (other than a peer
    /// closing it: [`CommError::Disconnected`]).
    #[error("{op} on rank {rank}: connection to rank {peer}: {message}")]
    Connection {
        /// The operation.
        op: &'static str,
        /// The rank that observed it.
        rank: usize,
        /// The other end.
        peer: usize,
        /// What the socket said.
        message: String,
    },
    /// An MPI call returned an error code.
    #[error("{op}: MPI error {code}: {message}")]
    Mpi {
        /// The MPI function or operation.
        op: &'static str,
        /// The MPI error code.
        code: i32,
        /// MPI's error string for the code.
        message: String,
    },
    /// The operation is not available on this transport (e.g. the `mpi` algorithm on threads).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// An invalid argument (bad algorithm name, dimensions that do not multiply to the size...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The ranks of one allreduce call passed buffers of different element counts or types;
    /// found before any rank added anything into its buffer, and reported by every rank.
    #[error("allreduce on rank {rank}: the ranks passed different buffers: {} (every rank must pass the same element count and type)", crate::allreduce::signature::describe_calls(.calls))]
    Mismatch {
        /// The rank reporting it.
        rank: usize,
        /// What each rank passed, by rank.
        calls: Vec<crate::allreduce::signature::Signature>,
    },
    /// A cost-model file could not be read, parsed or written.
    #[error("cost model file {path}: {message}")]
    CostModelFile {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
}
