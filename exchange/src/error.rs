//! What can go wrong while nodes exchange records.

use std::path::PathBuf;

use ddl_comm::CommError;
use ddl_loader::LoaderError;

/// Errors of the record exchange; each names the node, peer, record or file concerned.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// A message to or from another node failed (a dead peer, a timeout).
    #[error("record exchange of node {node}: {source}")]
    Comm {
        /// This node.
        node: usize,
        /// What the transport said.
        #[source]
        source: CommError,
    },
    /// Reading this node's records or writing the ones it received failed.
    #[error("record exchange of node {node}: {source}")]
    Loader {
        /// This node.
        node: usize,
        /// What the loader said.
        #[source]
        source: LoaderError,
    },
    /// A file or directory of the exchange could not be created, locked or removed.
    #[error("record exchange: {op} {}: {source}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// Another job on this machine exchanges records of the same data for the same node.
    #[error(
        "record exchange: {} is locked by another ddl job exchanging the same data on this \
         node; give each job its own --stage directory",
        path.display()
    )]
    Busy {
        /// The lock file.
        path: PathBuf,
    },
    /// A peer sent what is not the records it should have.
    #[error("record exchange of node {node}: node {from} sent {what}")]
    Corrupt {
        /// This node.
        node: usize,
        /// The sending node.
        from: usize,
        /// What was wrong, naming the record.
        what: String,
    },
    /// The exchange failed on another node; every node stops before serving the epoch.
    #[error(
        "record exchange for epoch {epoch} failed on node(s) {failed:?} (see their ranks' \
         errors); no node serves a half-exchanged epoch: resume from the last checkpoint"
    )]
    Elsewhere {
        /// The epoch whose records were being exchanged.
        epoch: u64,
        /// The nodes whose exchange failed.
        failed: Vec<usize>,
    },
    /// The ranks started different epochs: each would wait for the others' records of its
    /// own epoch.
    #[error(
        "record exchange: the ranks start different epochs ({}); every rank must start the \
         same epoch at each epoch boundary",
        asked.iter().map(|(e, ranks)| format!("epoch {e} on rank(s) {ranks:?}"))
            .collect::<Vec<_>>().join(", ")
    )]
    EpochsDiffer {
        /// Each epoch asked for, with the ranks that asked for it.
        asked: Vec<(u64, Vec<usize>)>,
    },
    /// The records a node may hold during the exchange would not fit in its memory.
    #[error(
        "exchanging {fraction} of every node's records, node {node} may hold up to {records} \
         records of other nodes in each of two arenas (this epoch's and the next one's, being received), about {need} \
         bytes ({:.1} GiB at {avg:.0} bytes per record) on top of its own shards, but only \
         {available} bytes ({:.1} GiB) are available ({why}); exchange a smaller fraction, \
         or use more nodes or nodes with more memory",
        *need as f64 / (1u64 << 30) as f64,
        *available as f64 / (1u64 << 30) as f64
    )]
    Memory {
        /// The exchanged fraction.
        fraction: f64,
        /// This node.
        node: usize,
        /// Most records of other nodes it holds in an epoch of the run.
        records: u64,
        /// Average bytes of a record of the split.
        avg: f64,
        /// Bytes both arenas may take.
        need: u64,
        /// Bytes available.
        available: u64,
        /// Where the figure comes from.
        why: String,
    },
}

/// Result of the exchange.
pub type Result<T> = std::result::Result<T, ExchangeError>;
