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

use std::sync::{Arc, Mutex};

use super::element::{with_elements, Buffer};
use super::shm::{check_chunk, ShmAllreduce};
use super::signature::{check_calls, Signature};
use super::util::Probed;
use super::{Allreduce, Allreducer, Context, Element};
use crate::algorithm::Across;
use crate::collective;
use crate::cost::CostModel;
use crate::error::{CommError, Result};
use crate::topology::Topology;
use crate::transport::Transport;

/// The hierarchical allreduce as an algorithm ([`crate::Algorithm::Hierarchical`]): `across`
/// between the nodes, chunks of `chunk_bytes` within them, through the node groups its first
/// call probes (collectively).
pub(crate) struct Hierarchical {
    across: Across,
    chunk_bytes: usize,
    groups: Mutex<Probed<NodeGroups>>,
}

impl Hierarchical {
    /// `across` between the nodes, chunks of `chunk_bytes` (checked by
    /// [`Allreduce::prepare`]).
    pub(crate) fn new(across: Across, chunk_bytes: usize) -> Hierarchical {
        Hierarchical {
            across,
            chunk_bytes,
            groups: Mutex::new(Probed::NotYet),
        }
    }

    /// `f` of this rank's groups in `cx`, probed on first use: `None` when the ranks of some
    /// node do not share its memory.
    pub(crate) fn with_groups<R>(
        &self,
        cx: &Context,
        f: impl FnOnce(Option<&mut NodeGroups>) -> Result<R>,
    ) -> Result<R> {
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        let nodes = Topology::flat(cx.topology.nodes);
        let peers = |t| Allreducer::new(t, self.across.algorithm(), nodes);
        f(groups.get_or_probe(|| {
            NodeGroups::create(&*cx.transport, cx.topology, self.chunk_bytes, peers)
        })?)
    }
}

impl Allreduce for Hierarchical {
    fn prepare(&mut self, cx: &Context) -> Result<()> {
        check_chunk(self.chunk_bytes)?;
        if self.across == Across::Mpi && !cx.transport.has_native_allreduce() {
            return Err(CommError::Unsupported(
                "hierarchical:mpi needs the MPI transport (hierarchical:ring or hierarchical:rhd run on any)".into(),
            ));
        }
        Ok(())
    }

    fn allreduce(
        &self,
        cx: &Context,
        buf: Buffer<'_>,
        average: bool,
        check: Option<Signature>,
    ) -> Result<()> {
        let t = &*cx.transport;
        self.with_groups(cx, |groups| match groups {
            Some(h) => with_elements!(buf, b => h.allreduce(t, b, average, check)),
            None => Err(CommError::Unsupported(
                "the hierarchical algorithm needs the ranks of every node to share its memory, with a writable /dev/shm"
                    .into(),
            )),
        })
    }

    /// `shm` over one node's ranks, then `across` between the nodes on the whole buffer (the
    /// node's ranks share its link, so their parts cost what the whole buffer from one rank
    /// costs). On one node `shm` alone, with one rank per node `across` alone, as it runs.
    fn predict(&self, model: &CostModel, bytes: usize, topo: Topology) -> f64 {
        let node = Topology::flat(topo.ranks_per_node);
        let nodes = Topology::new(topo.nodes, 1);
        let within = if topo.ranks_per_node > 1 {
            model.shm_time(self.chunk_bytes, bytes as f64, node)
        } else {
            0.0
        };
        within + model.predict(&self.across.algorithm(), bytes, nodes)
    }
}

/// Buffers of at most this many bytes (and at most a chunk) cross between the nodes once,
/// from each node's first rank; larger ones in one part per rank: below it one message per
/// node beat one per rank (BENCHMARKS.md, "Figures behind the defaults").
pub const LEADER_BYTES: usize = 1 << 20;

/// One rank's share of the hierarchical allreduce: its node's group and region, and its
/// group of peers on the other nodes.
pub(crate) struct NodeGroups {
    /// The ranks of this node.
    node: Box<dyn Transport>,
    /// The node's shared region.
    shm: ShmAllreduce,
    /// The allreduce between this rank and its peers (same local index) on the other nodes.
    peers: Allreducer,
    /// Ranks in all (what a mean divides by).
    ranks: usize,
}

impl std::fmt::Debug for NodeGroups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeGroups")
            .field("node_ranks", &self.node.size())
            .field("peers", &self.peers)
            .finish()
    }
}

impl NodeGroups {
    /// Collective over `t` laid out as `topology`: the node groups, their shared regions for
    /// chunks of `chunk_bytes` and the peer groups reducing with the allreducer `peers` makes
    /// of their transport, or `None` (on every rank) when some node's ranks do not share
    /// memory.
    pub(crate) fn create(
        t: &dyn Transport,
        topology: Topology,
        chunk_bytes: usize,
        peers: impl FnOnce(Arc<dyn Transport>) -> Result<Allreducer>,
    ) -> Result<Option<NodeGroups>> {
        let me = t.rank();
        let (node_index, local) = (topology.node_of(me), me % topology.ranks_per_node);
        let node = t.split(node_index, local)?;
        let peer_group: Arc<dyn Transport> = Arc::from(t.split(local, node_index)?);
        let shm = ShmAllreduce::create(&*node, chunk_bytes, LEADER_BYTES)?;
        if !collective::all(t, shm.is_some())? {
            return Ok(None);
        }
        let peers = peers(peer_group)?;
        Ok(shm.map(|shm| NodeGroups {
            node,
            shm,
            peers,
            ranks: t.size(),
        }))
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
        let NodeGroups {
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
            peers.reduce(sums, false, false)
        })
    }
}
