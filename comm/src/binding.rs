//! Whether the launcher left a rank's threads the node's cores. Open MPI binds a job of 2
//! ranks or fewer to one core per rank and a larger one to a socket per rank, so by default
//! the decode workers and training threads of a rank (`ddl-train`'s, or a PyTorch script's
//! with `ddl.Loader`) can share one core of a 64-core node, and the loader starves training
//! without an error anywhere.

use crate::cores;

/// How a node's CPUs were handed to its ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binding {
    /// CPUs this rank may run on (its affinity mask).
    pub own: usize,
    /// CPUs the node's ranks may run on together (the union of their masks).
    pub node: usize,
    /// CPUs the machine has online.
    pub online: usize,
    /// Ranks on the node.
    pub ranks: usize,
}

impl Binding {
    /// This rank's binding, given what its node's ranks hold together (`node` CPUs, from
    /// [`cores::node_cores`]) and how many ranks the node runs.
    pub fn of_this_rank(node: usize, ranks: usize) -> Self {
        Binding {
            own: cores::own_cpus(),
            node,
            online: cores::online_cpus(),
            ranks,
        }
    }

    /// The warning for a rank that keeps `threads` threads busy (decode workers and training):
    /// `Some` when it may run on fewer CPUs than that while its node's ranks leave some of the
    /// machine's CPUs unused, i.e. the launcher bound them narrower than the machine; `None`
    /// when the rank has a CPU per thread or the node's ranks already hold every CPU.
    pub fn warning(&self, threads: usize) -> Option<String> {
        (self.own < threads && self.node < self.online).then(|| {
            format!(
                "the launcher bound this node's {} rank(s) to {} of its {} CPUs, {} for this \
                 rank's {threads} busy threads (decode workers and training): the loader can \
                 starve training; give each rank its share of the node's cores (`mpirun \
                 --map-by node --bind-to none`, or `--map-by slot:PE=N` for N cores per rank; \
                 Slurm: `srun --cpus-per-task`)",
                self.ranks, self.node, self.online, self.own
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(own: usize, node: usize, online: usize, ranks: usize) -> Binding {
        Binding {
            own,
            node,
            online,
            ranks,
        }
    }

    #[test]
    fn one_rank_bound_to_one_core_of_sixteen_is_warned() {
        let line = binding(1, 1, 16, 1).warning(3).expect("a warning");
        assert!(line.contains("1 rank(s) to 1 of its 16 CPUs"), "{line}");
        assert!(line.contains("3 busy threads") && line.contains("--bind-to none"));
    }

    #[test]
    fn a_rank_with_a_cpu_per_thread_is_not_warned() {
        assert_eq!(binding(4, 4, 16, 1).warning(3), None);
        assert_eq!(binding(16, 16, 16, 1).warning(16), None);
    }

    #[test]
    fn ranks_holding_every_cpu_of_the_machine_are_not_warned() {
        // Two ranks bound to a core each on a 2-core machine: nothing left to give them.
        assert_eq!(binding(1, 2, 2, 2).warning(2), None);
    }
}
