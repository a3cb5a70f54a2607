//! The hierarchical allreduce: `shm` within each node, rhd / ring / MPI_Allreduce between
//! the nodes, `shm` back.
//!
//! Each node's ranks meet in their node's shared region ([`ShmAllreduce`]). Chunk by chunk,
//! each rank sums its part over its node, then sums those node sums with the ranks of the
//! same local index on the other nodes (its "peers": one group per local index, so every
//! rank of a node drives its share of the node's link at once), and publishes the result for
//! its node to copy. Buffers of at most [`LEADER_BYTES`] are one part, the node's first
//! rank's: they cross the network once per node, in one message exchange between the nodes'
//! first ranks, where a flat algorithm makes every rank cross it.
//!
//! On one node it is `shm`; with one rank per node, `across` alone.
//!
//! Every element's sum is computed by one group of peers with a bitwise-deterministic
//! algorithm, in f32 (f16 / bf16 are rounded once, at the end), and copied to the node: all
//! ranks end bitwise identical.

use std::sync::Arc;

use super::shm::ShmAllreduce;
use super::signature::{check_calls, Signature};
use super::{Allreducer, Element};
use crate::collective;
use crate::error::Result;
use crate::topology::Topology;
use crate::transport::Transport;

impl Hierarchical {
    /// Default chunk per rank of the node stage, in bytes
    /// ([`Algorithm::hierarchical`](crate::Algorithm::hierarchical)): each chunk's parts cross
    /// between the nodes in one blocking allreduce per rank, so chunks pay that latency; past
    /// 4 MiB larger chunks gained nothing (BENCHMARKS.md, "Figures behind the defaults").
    pub(crate) const DEFAULT_CHUNK_BYTES: usize = 4 << 20;
}

/// Buffers of at most this many bytes (and at most a chunk) cross between the nodes once,
/// from each node's first rank; larger ones in one part per rank: below it one message per
/// node beat one per rank (BENCHMARKS.md, "Figures behind the defaults").
pub const LEADER_BYTES: usize = 1 << 20;

/// One rank's share of the hierarchical allreduce: its node's group and region, and its
/// group of peers on the other nodes.
pub(crate) struct Hierarchical {
    /// The ranks of this node.
    node: Box<dyn Transport>,
    /// The node's shared region.
    shm: ShmAllreduce,
    /// Its chunk per rank, in bytes (as asked for: the region rounds it).
    chunk_bytes: usize,
    /// The allreduce between this rank and its peers (same local index) on the other nodes.
    peers: Allreducer,
    /// Ranks in all (what a mean divides by).
    ranks: usize,
}

impl std::fmt::Debug for Hierarchical {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hierarchical")
            .field("node_ranks", &self.node.size())
            .field("chunk_bytes", &self.chunk_bytes)
            .field("peers", &self.peers)
            .finish()
    }
}

impl Hierarchical {
    /// Collective over `t` laid out as `topology`: the node groups, their shared regions for
    /// chunks of `chunk_bytes` and the peer groups reducing with the allreducer `peers` makes
    /// of their transport, or `None` (on every rank) when some node's ranks do not share
    /// memory.
    pub(crate) fn create(
        t: &dyn Transport,
        topology: Topology,
        chunk_bytes: usize,
        peers: impl FnOnce(Arc<dyn Transport>) -> Result<Allreducer>,
    ) -> Result<Option<Hierarchical>> {
        let me = t.rank();
        let (node_index, local) = (topology.node_of(me), me % topology.ranks_per_node);
        let node = t.split(node_index, local)?;
        let peer_group: Arc<dyn Transport> = Arc::from(t.split(local, node_index)?);
        let shm = ShmAllreduce::create(&*node, chunk_bytes, LEADER_BYTES)?;
        if !collective::all(t, shm.is_some())? {
            return Ok(None);
        }
        let peers = peers(peer_group)?;
        Ok(shm.map(|shm| Hierarchical {
            node,
            shm,
            chunk_bytes,
            peers,
            ranks: t.size(),
        }))
    }

    /// Its chunk per rank, in bytes.
    pub(crate) fn chunk_bytes(&self) -> usize {
        self.chunk_bytes
    }

    /// The allreduce between the nodes.
    pub(crate) fn peers(&self) -> &Allreducer {
        &self.peers
    }

    /// Sums `buf` over all ranks of `world` in place (divided by the rank count with
    /// `average`). With `check`, the ranks' calls are compared first: on one node in the
    /// node's region (riding on its first synchronisation), with one rank per node by the
    /// algorithm between the nodes, otherwise over `world` (the node stages could agree while
    /// the nodes differ).
    pub(crate) fn allreduce<T: Element>(
        &mut self,
        world: &dyn Transport,
        buf: &mut [T],
        average: bool,
        check: Option<Signature>,
    ) -> Result<()> {
        let Hierarchical {
            node,
            shm,
            peers,
            ranks,
            ..
        } = self;
        if peers.transport().size() == 1 {
            return shm.allreduce(&**node, buf, average);
        }
        if node.size() == 1 {
            return peers.reduce(buf, average, check.is_some());
        }
        if let Some(mine) = check {
            check_calls(world, mine, false)?;
        }
        let scale = average.then_some(*ranks as f32);
        shm.allreduce_across(&**node, buf, scale, &mut |sums| {
            peers.allreduce_agreed(sums, false)
        })
    }
}
