//! A job of TCP-connected ranks started by a launcher other than mpirun (torchrun, a
//! Kubernetes operator, a cloud scheduler): the counterpart of the MPI [`crate::World`], with
//! the node layout from a node name every rank states (torchrun's node rank, a host name).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::binding::Binding;
use crate::collective::allgather_bytes;
use crate::cores;
use crate::error::Result;
use crate::tcp::{Listener, Secret, TcpTransport};
use crate::topology::Topology;
use crate::transport::Transport;

/// The TCP job: the world transport and the layout of its ranks over nodes. Ranks stating the
/// same node name form a node; their group (split from the world) carries the shared-memory
/// algorithms, TCP the rest.
pub struct TcpWorld {
    world: Arc<TcpTransport>,
    node: Box<dyn Transport>,
    layout: Layout,
    node_cpus: usize,
}

impl std::fmt::Debug for TcpWorld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpWorld")
            .field("rank", &self.world.rank())
            .field("size", &self.world.size())
            .field("layout", &self.layout)
            .finish()
    }
}

/// Where a rank's node sits among the job's nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    node_index: usize,
    node_count: usize,
    /// Every node has the same number of ranks and they are node-contiguous.
    uniform: bool,
}

/// The layout of rank `rank` when rank r states node name `names[r]`: nodes numbered in the
/// order of their first rank, and this rank's node's color (the first rank of its node).
fn layout_of(names: &[Vec<u8>], rank: usize) -> (Layout, usize) {
    let first = |r: usize| names.iter().position(|n| *n == names[r]).expect("present");
    let leaders: Vec<usize> = (0..names.len()).filter(|&r| first(r) == r).collect();
    let color = first(rank);
    let node_index = leaders.iter().position(|&l| l == color).expect("a leader");
    let local = names.iter().filter(|n| **n == names[rank]).count();
    let uniform = leaders.len() * local == names.len()
        && (0..names.len()).all(|r| leaders.get(r / local) == Some(&first(r)));
    let layout = Layout {
        node_index,
        node_count: leaders.len(),
        uniform,
    };
    (layout, color)
}

impl TcpWorld {
    /// Connects rank `rank` of the job whose ranks listen at `addrs` and hold `secret` (see
    /// [`TcpTransport::connect`]) and finds the nodes from each rank's `node` name.
    pub fn connect(
        listener: Listener,
        rank: usize,
        addrs: &[SocketAddr],
        secret: &Secret,
        node: &str,
        timeout: Duration,
    ) -> Result<TcpWorld> {
        let world = TcpTransport::connect(listener, rank, addrs, secret, timeout)?;
        TcpWorld::over(world, node)
    }

    /// The layout of an already connected world transport, each rank stating its `node`.
    ///
    /// # Examples
    ///
    /// Two ranks on one node (as `ddl.dist` names it under torchrun): one node of two ranks.
    ///
    /// ```
    /// use ddl_comm::{tcp_group, TcpWorld};
    ///
    /// let worlds = std::thread::scope(|s| {
    ///     let ranks: Vec<_> = tcp_group(2)?
    ///         .into_iter()
    ///         .map(|t| s.spawn(move || TcpWorld::over(t, "node-a")))
    ///         .collect();
    ///     ranks.into_iter().map(|r| r.join().unwrap()).collect::<Result<Vec<_>, _>>()
    /// })?;
    /// for (rank, w) in worlds.iter().enumerate() {
    ///     assert_eq!((w.rank(), w.node_count(), w.local_size()), (rank, 1, 2));
    /// }
    /// # Ok::<(), ddl_comm::CommError>(())
    /// ```
    pub fn over(world: TcpTransport, node: &str) -> Result<TcpWorld> {
        let names = allgather_bytes(&world, node.as_bytes().to_vec())?;
        let (layout, color) = layout_of(&names, world.rank());
        let node = world.split(color, world.rank())?;
        let node_cpus = cores::node_cores(&*node)?;
        Ok(TcpWorld {
            world: Arc::new(world),
            node,
            layout,
            node_cpus,
        })
    }

    /// The world as a transport (share it with `Arc::clone`).
    pub fn transport(&self) -> Arc<TcpTransport> {
        Arc::clone(&self.world)
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.world.rank()
    }

    /// Number of processes in the job.
    pub fn size(&self) -> usize {
        self.world.size()
    }

    /// Index of this node (nodes numbered in the order of their first rank).
    pub fn node_index(&self) -> usize {
        self.layout.node_index
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.layout.node_count
    }

    /// Rank of this process among the processes of its node.
    pub fn local_rank(&self) -> usize {
        self.node.rank()
    }

    /// Number of processes on this node.
    pub fn local_size(&self) -> usize {
        self.node.size()
    }

    /// This rank's CPUs and its node's, as [`crate::World::binding`] has them.
    pub fn binding(&self) -> Binding {
        Binding::of_this_rank(self.node_cpus, self.node.size())
    }

    /// `nodes x ranks_per_node` when the layout is uniform, otherwise flat.
    pub fn topology(&self) -> Topology {
        if self.layout.uniform {
            Topology::new(self.layout.node_count, self.node.size())
        } else {
            Topology::flat(self.world.size())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(s: &[&str]) -> Vec<Vec<u8>> {
        s.iter().map(|n| n.as_bytes().to_vec()).collect()
    }

    #[test]
    fn nodes_are_numbered_by_their_first_rank() {
        let n = names(&["b", "b", "a", "a"]);
        let (l, color) = layout_of(&n, 3);
        assert_eq!(
            (l.node_index, l.node_count, l.uniform, color),
            (1, 2, true, 2)
        );
        let (l, color) = layout_of(&n, 1);
        assert_eq!((l.node_index, color), (0, 0));
    }

    #[test]
    fn interleaved_or_unequal_nodes_are_not_uniform() {
        assert!(!layout_of(&names(&["a", "b", "a", "b"]), 0).0.uniform);
        assert!(!layout_of(&names(&["a", "a", "a", "b"]), 0).0.uniform);
        assert!(layout_of(&names(&["a"]), 0).0.uniform);
    }
}
