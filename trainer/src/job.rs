//! The job a `ddl-train` process belongs to: an MPI job (started by mpirun, mpiexec or srun),
//! or, started alone, a job of one rank that never initialises MPI.

use std::sync::Arc;

use ddl_comm::mpi::Polling;
use ddl_comm::{thread_group, CommError, Topology, Transport, World};

use crate::slurm::SlurmJob;

/// This process's job.
pub enum Job {
    /// Ranks started by an MPI launcher.
    Mpi(World),
    /// One rank, no MPI.
    Alone(Arc<dyn Transport>),
}

impl Job {
    /// Joins the MPI job when an MPI launcher started this process, else a job of one rank;
    /// refuses a process that another launcher (torchrun) started as one of several, which
    /// would otherwise train alone on the whole data set beside its siblings.
    pub fn start() -> Result<Job, CommError> {
        if World::launched() {
            Ok(Job::Mpi(World::init()?))
        } else if let Some(size) = foreign_world_size() {
            Err(CommError::Unsupported(format!(
                "this process is one of {size} started by another launcher (WORLD_SIZE={size}, \
                 as torchrun sets), but ddl-train forms its job through MPI: launch it with \
                 `mpirun -np {size} ddl-train ...` or `srun -n {size} ddl-train ...` (torchrun \
                 runs Python scripts on ddl.Loader and ddl.dist, e.g. \
                 examples/pytorch/train.py)"
            )))
        } else {
            let one = thread_group(1).pop().expect("a group of one rank");
            Ok(Job::Alone(Arc::new(one)))
        }
    }

    /// The transport over every rank.
    pub fn transport(&self) -> Arc<dyn Transport> {
        match self {
            Job::Mpi(w) => w.transport(),
            Job::Alone(t) => t.clone(),
        }
    }

    /// Declares the busy compute threads (CPU replicas) each rank runs beside its
    /// communication ([`World::share_cores`]); read [`Job::info`] after it.
    pub fn share_cores(&self, threads: usize) {
        if let Job::Mpi(w) = self {
            w.share_cores(threads);
        }
    }

    /// Where this process sits.
    pub fn info(&self) -> RankInfo {
        match self {
            Job::Mpi(w) => RankInfo {
                node: w.node_index(),
                nodes: w.node_count(),
                rank_in_node: w.local_rank(),
                ranks_in_node: w.local_size(),
                oversubscribed: w.polling() == Polling::Backoff,
            },
            Job::Alone(_) => RankInfo::single(),
        }
    }

    /// The physical layout, for the allreduce cost model.
    pub fn topology(&self) -> Topology {
        match self {
            Job::Mpi(w) => w.topology(),
            Job::Alone(_) => Topology::new(1, 1),
        }
    }

    /// The launcher's warning when it bound this node's ranks to fewer CPUs than `threads`
    /// busy threads each (none for a process started alone).
    pub fn binding_warning(&self, threads: usize) -> Option<String> {
        match self {
            Job::Mpi(w) => w.binding().warning(threads),
            Job::Alone(_) => None,
        }
    }

    /// What Slurm says about this job ([`SlurmJob::query`], by rank 0, shared with every
    /// rank), `None` outside a Slurm job. Collective.
    pub fn slurm(&self) -> Result<Option<SlurmJob>, CommError> {
        let transport = self.transport();
        let mine = (transport.rank() == 0)
            .then(SlurmJob::id_from_env)
            .flatten()
            .map(|id| SlurmJob::query(&id));
        let bytes = serde_json::to_vec(&mine).unwrap_or_default();
        let shared = ddl_comm::collective::broadcast_bytes(&*transport, bytes)?;
        Ok(serde_json::from_slice(&shared).unwrap_or_default())
    }

    /// Ends this process, which failed with `reason`, and the whole job with exit code
    /// `code` (other ranks may be blocked in a collective): under MPI every rank learns which
    /// rank failed and why, and says so, before the job ends ([`World::end_failed`]).
    pub fn end_failed(&self, reason: &str, code: i32) -> ! {
        match self {
            Job::Mpi(w) if w.size() > 1 => w.end_failed(reason, code),
            Job::Mpi(_) | Job::Alone(_) => std::process::exit(code),
        }
    }
}

/// Where this process sits in the job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankInfo {
    /// Node index (MPI shared-memory split).
    pub node: usize,
    /// Number of nodes.
    pub nodes: usize,
    /// Rank within the node.
    pub rank_in_node: usize,
    /// Ranks on this node (assumed equal on every node).
    pub ranks_in_node: usize,
    /// This node's ranks, or their CPU replicas, outnumber its cores: ddl-comm waits by
    /// sleeping between polls ([`ddl_comm::mpi::Polling::Backoff`]), and CPU replicas leave
    /// the cores to a communication thread that has work
    /// ([`crate::table::TableConfig::yield_to_comm`]).
    pub oversubscribed: bool,
}

impl RankInfo {
    /// A single process: one node, one rank.
    pub fn single() -> RankInfo {
        RankInfo {
            node: 0,
            nodes: 1,
            rank_in_node: 0,
            ranks_in_node: 1,
            oversubscribed: false,
        }
    }
}

/// The world size a non-MPI launcher announced (`WORLD_SIZE`, torchrun's and
/// torch.distributed's variable), when it is more than one process.
fn foreign_world_size() -> Option<u64> {
    let size = std::env::var("WORLD_SIZE").ok()?.trim().parse().ok()?;
    (size > 1).then_some(size)
}
