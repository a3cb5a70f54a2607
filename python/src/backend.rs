//! The job `ddl.dist` runs in: MPI's world (mpirun, srun, or one rank alone) or ddl's TCP
//! world (torchrun and other launchers without MPI), behind one set of questions.

use std::sync::Arc;

use ddl_comm::{Binding, TcpWorld, Topology, Transport, World};

/// The process's job, by the transport that connects its ranks.
pub(crate) enum Backend {
    /// Started by an MPI launcher, or a one-rank job.
    Mpi(World),
    /// Started by torchrun or a launcher like it: ddl's TCP transport.
    Tcp(TcpWorld),
}

impl Backend {
    /// The world transport.
    pub(crate) fn transport(&self) -> Arc<dyn Transport> {
        match self {
            Backend::Mpi(w) => w.transport(),
            Backend::Tcp(w) => w.transport(),
        }
    }

    /// The node layout the algorithms use.
    pub(crate) fn topology(&self) -> Topology {
        match self {
            Backend::Mpi(w) => w.topology(),
            Backend::Tcp(w) => w.topology(),
        }
    }

    /// `(rank, size, local_rank, local_size, node, nodes)`.
    pub(crate) fn place(&self) -> (usize, usize, usize, usize, usize, usize) {
        macro_rules! place {
            ($w:expr) => {
                (
                    $w.rank(),
                    $w.size(),
                    $w.local_rank(),
                    $w.local_size(),
                    $w.node_index(),
                    $w.node_count(),
                )
            };
        }
        match self {
            Backend::Mpi(w) => place!(w),
            Backend::Tcp(w) => place!(w),
        }
    }

    /// Whether ddl joined an MPI the host program had started.
    pub(crate) fn joined(&self) -> bool {
        matches!(self, Backend::Mpi(w) if w.joined())
    }

    /// The backend's name as `ddl.dist.backend()` returns it.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Backend::Mpi(_) => "mpi",
            Backend::Tcp(_) => "tcp",
        }
    }

    /// How the launcher bound this rank and its node's ranks.
    pub(crate) fn binding(&self) -> Binding {
        match self {
            Backend::Mpi(w) => w.binding(),
            Backend::Tcp(w) => w.binding(),
        }
    }

    /// Ends the job with exit code `code`: MPI_Abort, or this process's exit (its peers see
    /// their connections to it end and fail naming it).
    pub(crate) fn abort(&self, code: i32) -> ! {
        match self {
            Backend::Mpi(w) => w.abort(code),
            Backend::Tcp(_) => std::process::exit(code),
        }
    }
}
