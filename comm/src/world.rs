//! The MPI job: initialises MPI and finds the layout of its ranks (the node communicator from
//! `MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`, node index and count, whether the layout is a
//! uniform `nodes x ranks_per_node` [`Topology`]).

use std::ffi::{c_int, c_void};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use mpi::environment::Threading;
use mpi::ffi;

use crate::binding::Binding;
use crate::collective;
use crate::cores;
use crate::error::{CommError, Result};
use crate::failure::{Notices, GRACE};
use crate::mpi::{Env, MpiTransport, Polling};
use crate::mpi_call::{check, Serial};
use crate::topology::Topology;
use crate::transport::DEFAULT_TIMEOUT;

/// The MPI job: initialises MPI, exposes the world transport and the node layout
/// (`MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`). MPI is finalised when the `World` and
/// every transport derived from it are dropped.
///
/// # Examples
///
/// Every rank sums its gradients with the others'; started alone the job is one rank, under
/// `mpirun -np 4` the same program runs on four:
///
/// ```
/// use ddl_comm::{Algorithm, Allreducer, World};
///
/// let world = World::init()?;
/// let ar = Allreducer::new(world.transport(), Algorithm::Auto, world.topology())?;
/// let mut grads = vec![world.rank() as f32 + 1.0; 1000];
/// ar.allreduce(&mut grads, false)?;
/// let p = world.size() as f32;
/// assert!(grads.iter().all(|&g| g == p * (p + 1.0) / 2.0));
/// # Ok::<(), ddl_comm::CommError>(())
/// ```
pub struct World {
    world: Arc<MpiTransport>,
    node: MpiTransport,
    node_index: usize,
    node_count: usize,
    uniform: bool,
    node_cpus: usize,
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("World")
            .field("rank", &self.world.rank)
            .field("size", &self.world.size)
            .field("node_index", &self.node_index)
            .field("node_count", &self.node_count)
            .field("local_rank", &self.node.rank)
            .field("local_size", &self.node.size)
            .finish()
    }
}

/// Variables that MPI launchers set in the processes they start: Open MPI's mpirun, PMI
/// (MPICH's hydra, Intel MPI; srun --mpi=pmi2), PMIx (srun --mpi=pmix).
const LAUNCHER_VARS: [&str; 5] = [
    "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE",
    "PMI_RANK",
    "PMIX_RANK",
    "MPI_LOCALNRANKS",
];

/// The tasks of the Slurm job step that srun started this process in without an MPI plugin
/// (`srun` without `--mpi=pmix` where the cluster's `MpiDefault` is `none`): MPI cannot
/// start there. A batch shell (no `SLURM_STEP_ID`) is no step: its `SLURM_NTASKS` is the
/// allocation's, not a world this process belongs to.
fn srun_step_without_mpi() -> Option<usize> {
    std::env::var_os("SLURM_STEP_ID")?;
    if LAUNCHER_VARS.iter().any(|v| std::env::var_os(v).is_some()) {
        return None;
    }
    std::env::var("SLURM_STEP_NUM_TASKS").ok()?.parse().ok()
}

impl World {
    /// Whether an MPI launcher (mpirun, mpiexec, srun) started this process. A program started
    /// alone may run as a job of one rank without initialising MPI at all, which then needs no
    /// MPI installation beyond the library it links; so does a task that srun started alone
    /// without an MPI plugin. Several such tasks are launched (and refused by [`World::init`]).
    pub fn launched() -> bool {
        LAUNCHER_VARS.iter().any(|v| std::env::var_os(v).is_some())
            || srun_step_without_mpi().is_some_and(|tasks| tasks > 1)
    }

    /// Initialises MPI (requesting MPI_THREAD_SERIALIZED, see [`World::init_with_timeout`])
    /// with the default 60 s timeout.
    pub fn init() -> Result<World> {
        World::init_with_timeout(DEFAULT_TIMEOUT)
    }

    /// Initialises MPI; blocking point-to-point operations fail after `timeout`.
    ///
    /// ddl asks for MPI_THREAD_SERIALIZED and holds one lock of its own around every MPI
    /// call, so any of its threads may communicate. It does not ask for MPI_THREAD_MULTIPLE,
    /// which it does not need. Two threads must not run the blocking `mpi` algorithm on two
    /// different communicators at once (the first holds the lock until its peers join it);
    /// ddl's trainer and Python package reduce on one thread, in order.
    ///
    /// When MPI is already initialised (by mpi4py or the host program), ddl joins it instead:
    /// it works on a duplicate of `MPI_COMM_WORLD` (its messages never meet the host's) at the
    /// thread level the host chose, and leaves finalising MPI to the host.
    pub fn init_with_timeout(timeout: Duration) -> Result<World> {
        World::init_at(timeout, Threading::Serialized)
    }

    /// Initialises MPI at MPI_THREAD_SINGLE, for a program that runs one thread only (a
    /// benchmark): Open MPI 4.1 takes locks inside every call at any higher level, which made
    /// a 4 KiB MPI_Allreduce at 2 ranks about 15% slower (BENCHMARKS.md). Refused when the
    /// process already runs more than one thread; the program must start none later that
    /// calls ddl or MPI. Otherwise as [`World::init_with_timeout`].
    pub fn init_single_threaded(timeout: Duration) -> Result<World> {
        if let Some(threads) = process_threads() {
            if threads > 1 {
                return Err(CommError::Unsupported(format!(
                    "MPI_THREAD_SINGLE needs a process with one thread; this one runs {threads}"
                )));
            }
        }
        World::init_at(timeout, Threading::Single)
    }

    /// Initialises MPI requesting thread level `requested` (or joins it, see
    /// [`World::init_with_timeout`]).
    fn init_at(timeout: Duration, requested: Threading) -> Result<World> {
        if let Some(tasks) = srun_step_without_mpi() {
            return Err(CommError::Unsupported(format!(
                "srun started this task (one of {tasks}) without an MPI plugin, so MPI cannot \
                 start: run `srun --mpi=pmix ...` (or set MpiDefault=pmix in slurm.conf; \
                 `srun --mpi=list` lists the plugins); on a cluster without PMIx, run `mpirun` \
                 inside the allocation (sbatch or salloc)"
            )));
        }
        let (env, joined) = start_env(requested)?;
        let world_comm = world_communicator(&env, joined)?;
        let world = MpiTransport::wrap(env.clone(), world_comm, joined, timeout)?;
        let notices = Notices::start(&env.serial, world_comm, world.rank, world.size)?;
        let _ = env.notices.set(notices);
        let node_comm = node_communicator(&env, world_comm, world.rank)?;
        let node = MpiTransport::wrap(env.clone(), node_comm, true, timeout)?;
        let node_cpus = cores::node_cores(&node)?;
        let polling = Polling::for_node(node.size, node_cpus);
        world.set_polling(polling);
        node.set_polling(polling);
        let (node_index, node_count) = node_place(&world, &node)?;
        let uniform = uniform_layout(&env, world_comm, world.size, node_index, node.size)?;
        Ok(World {
            world: Arc::new(world),
            node,
            node_index: node_index as usize,
            node_count: node_count as usize,
            uniform,
            node_cpus,
        })
    }

    /// The world communicator as a transport (share it with `Arc::clone`).
    pub fn transport(&self) -> Arc<MpiTransport> {
        self.world.clone()
    }

    /// This process's world rank.
    pub fn rank(&self) -> usize {
        self.world.rank
    }

    /// Number of processes in the job.
    pub fn size(&self) -> usize {
        self.world.size
    }

    /// Index of this node: rank of its leader (local rank 0) among all node leaders.
    pub fn node_index(&self) -> usize {
        self.node_index
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.node_count
    }

    /// Rank of this process among the processes of its node.
    pub fn local_rank(&self) -> usize {
        self.node.rank
    }

    /// Number of processes on this node.
    pub fn local_size(&self) -> usize {
        self.node.size
    }

    /// How the launcher bound this rank and its node's ranks: this rank's CPUs, and how many
    /// the node's ranks may run on together (the union of their affinity masks:
    /// [`cores::node_cores`]).
    pub fn binding(&self) -> Binding {
        Binding::of_this_rank(self.node_cpus, self.node.size)
    }

    /// How the ranks wait for their requests ([`Polling::for_node`] of this node).
    pub fn polling(&self) -> Polling {
        self.world.polling()
    }

    /// Declares that every rank of this node runs `threads` busy compute threads (CPU
    /// replicas) on the cores it communicates on: the ranks wait by backoff where these
    /// threads outnumber the node's cores, as where the ranks alone do. Call it before
    /// splitting groups from the world transport: they keep the polling they were split with.
    pub fn share_cores(&self, threads: usize) {
        let polling = Polling::for_node(self.node.size * threads.max(1), self.node_cpus);
        self.world.set_polling(polling);
        self.node.set_polling(polling);
    }

    /// The thread level MPI granted (`Serialized` when ddl initialised MPI, the host's level
    /// when it joined).
    pub fn threading(&self) -> Threading {
        self.world.env.threading
    }

    /// The two-tier layout: `nodes x ranks_per_node` when every node has the same number of
    /// node-contiguous ranks, otherwise flat (one tier of `size` ranks).
    pub fn topology(&self) -> Topology {
        if self.uniform {
            Topology::new(self.node_count, self.node.size)
        } else {
            Topology::flat(self.world.size)
        }
    }

    /// The name of this processor (host).
    pub fn processor_name(&self) -> String {
        mpi::environment::processor_name().unwrap_or_default()
    }

    /// Whether ddl joined an MPI that the host program had initialised (see
    /// [`World::init_with_timeout`]).
    pub fn joined(&self) -> bool {
        self.world.env._universe.is_none()
    }

    /// Ends this process, which failed with `reason`, and the job with exit code `code`,
    /// without leaving a rank to wait out its timeout and without killing a rank before it
    /// has said why it stops. When this rank knows of another rank's failure, which caused
    /// its own, it tells that rank that it stops and waits for it to end the job. Otherwise
    /// it tells every other rank that it failed ([`Transport::announce_failure`]; their
    /// waits then fail naming it and `reason`) and ends the job once each has said that it
    /// stops, at most 10 s later.
    ///
    /// [`Transport::announce_failure`]: crate::Transport::announce_failure
    pub fn end_failed(&self, reason: &str, code: i32) -> ! {
        let env = &self.world.env;
        if let Some(notices) = env.notices.get() {
            match notices.poll(&env.serial) {
                Some(f) if f.rank != self.rank() => notices.answer(&env.serial, f.rank),
                _ => notices.announce(&env.serial, reason),
            }
            notices.settle(&env.serial, GRACE);
        }
        self.abort(code)
    }

    /// Aborts every process of the job with exit code `code` (MPI_Abort on MPI_COMM_WORLD).
    pub fn abort(&self, code: i32) -> ! {
        // SAFETY: MPI is initialised.
        unsafe { ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, code) };
        std::process::exit(code)
    }
}

/// The number of threads of this process (Linux: `/proc/self/task`); `None` where unknown.
fn process_threads() -> Option<usize> {
    std::fs::read_dir("/proc/self/task").ok().map(|d| d.count())
}

/// The [`Threading`] level of an `MPI_THREAD_*` constant.
fn threading_of(level: c_int) -> Threading {
    // SAFETY: extern statics of the MPI binding.
    let raw = unsafe {
        [
            (ffi::RSMPI_THREAD_MULTIPLE, Threading::Multiple),
            (ffi::RSMPI_THREAD_SERIALIZED, Threading::Serialized),
            (ffi::RSMPI_THREAD_FUNNELED, Threading::Funneled),
        ]
    };
    raw.into_iter()
        .find(|&(r, _)| r == level)
        .map_or(Threading::Single, |(_, t)| t)
}

/// MPI initialised at thread level `requested`, or joined where the host initialised it
/// (then `true`: not ours to finalise).
fn start_env(requested: Threading) -> Result<(Arc<Env>, bool)> {
    let (universe, threading) = if mpi::environment::is_initialized() {
        let mut level: c_int = 0;
        // SAFETY: MPI is initialised.
        check("MPI_Query_thread", unsafe {
            ffi::MPI_Query_thread(&mut level)
        })?;
        (None, threading_of(level))
    } else {
        let (universe, threading) = mpi::initialize_with_threading(requested)
            .ok_or_else(|| CommError::Unsupported("MPI is already initialised".into()))?;
        (Some(universe), threading)
    };
    let serial = Serial::new(threading);
    let joined = universe.is_none();
    let env = Arc::new(Env {
        notices: OnceLock::new(),
        _universe: universe,
        serial,
        threading,
    });
    Ok((env, joined))
}

/// MPI_COMM_WORLD, or a duplicate of it when MPI was `joined` (the host's communicator stays
/// the host's).
fn world_communicator(env: &Env, joined: bool) -> Result<ffi::MPI_Comm> {
    // SAFETY: extern static of the MPI binding.
    let mut world_comm = unsafe { ffi::RSMPI_COMM_WORLD };
    if joined {
        let _g = env.lock();
        // SAFETY: collective over MPI_COMM_WORLD; the duplicate is freed by the transport.
        check("MPI_Comm_dup", unsafe {
            ffi::MPI_Comm_dup(ffi::RSMPI_COMM_WORLD, &mut world_comm)
        })?;
    }
    Ok(world_comm)
}

/// The communicator of the ranks that share this rank's node (MPI's shared-memory split).
fn node_communicator(env: &Env, world_comm: ffi::MPI_Comm, rank: usize) -> Result<ffi::MPI_Comm> {
    // SAFETY: extern static of the MPI binding.
    let mut node_comm = unsafe { ffi::RSMPI_COMM_NULL };
    let _g = env.lock();
    // SAFETY: collective over MPI_COMM_WORLD.
    check("MPI_Comm_split_type", unsafe {
        ffi::MPI_Comm_split_type(
            world_comm,
            ffi::RSMPI_COMM_TYPE_SHARED,
            rank as c_int,
            ffi::RSMPI_INFO_NULL,
            &mut node_comm,
        )
    })?;
    Ok(node_comm)
}

/// (node index, node count): the leaders (local rank 0) number the nodes in world-rank
/// order and each tells the other ranks of its node.
fn node_place(world: &MpiTransport, node: &MpiTransport) -> Result<(u64, u64)> {
    let leaders = world.split_raw(if node.rank == 0 { 0 } else { 1 }, world.rank as c_int)?;
    let leader_info = [leaders.rank as u64, leaders.size as u64];
    let bytes = collective::broadcast_bytes(
        node,
        leader_info.iter().flat_map(|v| v.to_le_bytes()).collect(),
    )?;
    let info: Vec<u64> = bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    if info.len() != 2 {
        return Err(CommError::InvalidArgument(format!(
            "node leader sent {} values for (node index, node count)",
            info.len()
        )));
    }
    Ok((info[0], info[1]))
}

/// Whether every node has the same number of ranks and the ranks are node-contiguous
/// (collective over `world_comm`, of `size` ranks).
fn uniform_layout(
    env: &Env,
    world_comm: ffi::MPI_Comm,
    size: usize,
    node_index: u64,
    node_size: usize,
) -> Result<bool> {
    let mine = [node_index, node_size as u64];
    let mut all = vec![0u64; 2 * size];
    {
        let _g = env.lock();
        // SAFETY: `mine` holds 2 and `all` 2 * size u64 values.
        check("MPI_Allgather", unsafe {
            ffi::MPI_Allgather(
                mine.as_ptr().cast::<c_void>(),
                2,
                ffi::RSMPI_UINT64_T,
                all.as_mut_ptr().cast::<c_void>(),
                2,
                ffi::RSMPI_UINT64_T,
                world_comm,
            )
        })?;
    }
    let local = node_size as u64;
    Ok(all
        .chunks_exact(2)
        .enumerate()
        .all(|(r, v)| v[1] == local && v[0] == r as u64 / local))
}
