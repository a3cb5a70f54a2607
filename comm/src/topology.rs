//! Two-tier layout of the ranks: `nodes` nodes of `ranks_per_node` node-contiguous ranks.

use serde::{Deserialize, Serialize};

use crate::error::{CommError, Result};

/// How ranks map onto nodes: rank r sits on node `r / ranks_per_node`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    /// Number of nodes.
    pub nodes: usize,
    /// Ranks on each node (consecutive world ranks).
    pub ranks_per_node: usize,
}

impl Topology {
    /// `nodes` nodes of `ranks_per_node` ranks each (both at least 1).
    pub fn new(nodes: usize, ranks_per_node: usize) -> Topology {
        Topology {
            nodes: nodes.max(1),
            ranks_per_node: ranks_per_node.max(1),
        }
    }

    /// One node holding all `ranks` ranks.
    pub fn flat(ranks: usize) -> Topology {
        Topology::new(1, ranks)
    }

    /// Total ranks.
    pub fn ranks(&self) -> usize {
        self.nodes * self.ranks_per_node
    }

    /// Checks that the layout has the `ranks` of the transport a collective runs over.
    pub fn check_ranks(&self, ranks: usize) -> Result<()> {
        if self.ranks() != ranks {
            return Err(CommError::InvalidArgument(format!(
                "topology {}x{} has {} ranks but the transport has {ranks}",
                self.nodes,
                self.ranks_per_node,
                self.ranks()
            )));
        }
        Ok(())
    }

    /// The node of `rank`.
    pub fn node_of(&self, rank: usize) -> usize {
        rank / self.ranks_per_node
    }

    /// Ring dimensions, fastest tier first, with dimensions of 1 left out
    /// (`[ranks_per_node, nodes]`; `[1]` for a single rank).
    pub fn dims(&self) -> Vec<usize> {
        let dims: Vec<usize> = [self.ranks_per_node, self.nodes]
            .into_iter()
            .filter(|&d| d > 1)
            .collect();
        if dims.is_empty() {
            vec![1]
        } else {
            dims
        }
    }
}
