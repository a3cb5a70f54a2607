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

use super::call_check::check_calls;
use super::context::{Allreduce, Context};
use super::declare::{positive, Declare, Declared};
use super::element::{with_elements, Buffer, Element};
use super::mpi::Mpi;
use super::rhd::Rhd;
use super::ring::Ring;
use super::shm::{check_chunk, ShmAllreduce};
use super::signature::Signature;
use super::util::Probed;
use crate::collective;
use crate::cost::CostModel;
use crate::error::{CommError, Result};
use crate::topology::Topology;
use crate::transport::Transport;

/// The allreduce between the nodes of [`crate::Algorithm::Hierarchical`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Across {
    /// [`crate::Algorithm::Ring`].
    Ring,
    /// [`crate::Algorithm::Rhd`].
    Rhd,
    /// [`crate::Algorithm::Mpi`] (MPI transport only).
    Mpi,
}

impl Across {
    /// Every one, in the order the syntax names them.
    const ALL: [Across; 3] = [Across::Ring, Across::Rhd, Across::Mpi];

    /// Its name, the algorithm's.
    fn name(self) -> &'static str {
        match self {
            Across::Ring => Ring::DECLARED.name,
            Across::Rhd => Rhd::DECLARED.name,
            Across::Mpi => Mpi::DECLARED.name,
        }
    }

    /// What runs it, not yet prepared.
    fn build(self) -> Box<dyn Allreduce> {
        match self {
            Across::Ring => Ring.build(),
            Across::Rhd => Rhd.build(),
            Across::Mpi => Mpi.build(),
        }
    }
}

/// Default chunk per rank of the node stage, in bytes: each chunk's parts cross between the
/// nodes in one blocking allreduce per rank, so chunks pay that latency; past 4 MiB larger
/// chunks gained nothing (BENCHMARKS.md, "Figures behind the defaults").
const DEFAULT_CHUNK_BYTES: usize = 4 << 20;

/// The hierarchical allreduce's parameters ([`crate::Algorithm::Hierarchical`]): `shm` within
/// every node sums each rank's part of a chunk over the node, `across` sums that part between
/// the nodes (over the ranks of the same local index, all node links busy at once), and `shm`
/// hands the sums back. Buffers of at most [`LEADER_BYTES`] cross the network once, from each
/// node's first rank. Needs the ranks of every node to share its memory. On one node it is
/// `shm`, with one rank per node `across` alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hierarchical {
    /// The allreduce between the nodes.
    pub across: Across,
    /// Chunk per rank of the node stage, in bytes.
    pub chunk_bytes: usize,
}

impl Hierarchical {
    /// rhd between the nodes, chunks of 4 MiB.
    pub const DEFAULT: Hierarchical = Hierarchical {
        across: Across::Rhd,
        chunk_bytes: DEFAULT_CHUNK_BYTES,
    };
}

impl Default for Hierarchical {
    fn default() -> Hierarchical {
        Hierarchical::DEFAULT
    }
}

impl Declare for Hierarchical {
    const DECLARED: Declared = Declared {
        name: "hierarchical",
        syntax: "hierarchical[:ring|rhd|mpi[:CHUNK_BYTES]]",
        help: "shm within each node, ring, rhd (the default) or MPI_Allreduce between the \
               nodes, every rank of a node carrying its share of the link",
        auto: true,
    };

    fn parse(args: Option<&str>) -> Result<Hierarchical> {
        let mut it = args.unwrap_or("").splitn(2, ':');
        let name = it.next().unwrap_or("").to_ascii_lowercase();
        let across = match Across::ALL.into_iter().find(|a| a.name() == name) {
            Some(across) => across,
            None if name.is_empty() => Across::Rhd,
            None => {
                return Err(CommError::InvalidArgument(format!(
                "hierarchical: {name:?} cannot run between the nodes (expected ring, rhd or mpi)"
            )))
            }
        };
        let chunk_bytes = match it.next() {
            None => DEFAULT_CHUNK_BYTES,
            Some(c) => positive(c, "chunk bytes")?,
        };
        Ok(Hierarchical {
            across,
            chunk_bytes,
        })
    }

    /// `across` always (`hierarchical:rhd`), the chunk where it is not the default.
    fn args(&self) -> Option<String> {
        let mut args = self.across.name().to_string();
        if self.chunk_bytes != DEFAULT_CHUNK_BYTES {
            args += &format!(":{}", self.chunk_bytes);
        }
        Some(args)
    }

    fn build(&self) -> Box<dyn Allreduce> {
        Box::new(HierarchicalRun::new(*self))
    }

    /// With rhd between the nodes only (`hierarchical:mpi` never beat it in the benchmark,
    /// yet calibration's short passes timed it faster at sizes where it loses, so `auto` would
    /// take it there: BENCHMARKS.md, "Figures behind the defaults"), where several nodes hold
    /// several ranks each and these share their node's memory.
    fn auto_here(topo: Topology, shared_memory: bool, _: bool) -> bool {
        shared_memory && topo.nodes > 1 && topo.ranks_per_node > 1
    }
}

/// The hierarchical allreduce as it runs: its parameters and the node groups its first call
/// probes (collectively).
pub(crate) struct HierarchicalRun {
    params: Hierarchical,
    groups: Mutex<Probed<NodeGroups>>,
}

impl HierarchicalRun {
    /// As `params` says (checked by [`Allreduce::prepare`]).
    pub(crate) fn new(params: Hierarchical) -> HierarchicalRun {
        HierarchicalRun {
            params,
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
        let Hierarchical {
            across,
            chunk_bytes,
        } = self.params;
        let peers = |t| Peers::new(t, across, nodes);
        f(groups
            .get_or_probe(|| NodeGroups::create(&*cx.transport, cx.topology, chunk_bytes, peers))?)
    }
}

impl Allreduce for HierarchicalRun {
    fn prepare(&mut self, cx: &Context) -> Result<()> {
        check_chunk(self.params.chunk_bytes)?;
        if self.params.across == Across::Mpi && !cx.transport.has_native_allreduce() {
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
            model.shm_time(self.params.chunk_bytes, bytes as f64, node)
        } else {
            0.0
        };
        let across = self.params.across;
        within
            + model.predicted(across.name(), bytes, nodes, || {
                across.build().predict(model, bytes, nodes)
            })
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
    peers: Peers,
    /// Ranks in all (what a mean divides by).
    ranks: usize,
}

impl std::fmt::Debug for NodeGroups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeGroups")
            .field("node_ranks", &self.node.size())
            .field("peers", &self.peers.cx.transport.size())
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
        peers: impl FnOnce(Arc<dyn Transport>) -> Result<Peers>,
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
        if peers.cx.transport.size() == 1 {
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

/// The allreduce between the nodes: `across` over a rank's peers on the other nodes.
pub(crate) struct Peers {
    cx: Context,
    across: Box<dyn Allreduce>,
}

impl Peers {
    /// `across` over `transport`, the peers laid out as `nodes`.
    fn new(transport: Arc<dyn Transport>, across: Across, nodes: Topology) -> Result<Peers> {
        let cx = Context::new(transport, nodes, CostModel::default())?;
        let mut across = across.build();
        across.prepare(&cx)?;
        Ok(Peers { cx, across })
    }

    /// Sums `buf` over the peers, after the call check if `check`.
    fn reduce<T: Element>(&self, buf: &mut [T], average: bool, check: bool) -> Result<()> {
        self.cx.reduce(&*self.across, buf, average, check)
    }
}
