//! ddl-comm: the communication layer of ddl.
//!
//! - [`Transport`]: point-to-point byte messaging (blocking send/recv, a non-blocking batch
//!   [`Transport::exchange`], split, barrier) with an operation timeout, implemented over
//!   MPI ([`mpi::MpiTransport`], started by [`World`]), TCP with no MPI launcher
//!   ([`TcpTransport`], started by [`TcpWorld`] under torchrun and the like) and in-process
//!   threads ([`thread_group`]). Every message tag belongs to one range of [`tags`].
//! - [`Allreducer`]: allreduce of f32 / f16 / bf16 with the [`Algorithm`]s ring, rhd,
//!   multicolor, multiring, shm, hierarchical, mpi and auto; results are bitwise identical on
//!   all ranks.
//! - [`Sharded`]: allgather and reduce-scatter of f32 buffers cut into [`Parts`] of any
//!   lengths, ring or node shared memory, and the allreduce with `max` made of the two.
//! - [`collective`]: broadcast, gather and allgather of bytes for the control plane.
//! - [`Counted`]: a transport counting the bytes its rank sends.
//! - [`priority`]: the order of a training step's buckets ([`CommOrder`]), and the negotiation
//!   that keeps a `priority` schedule the same on every rank.
//! - [`CostModel`]: alpha-beta-gamma per tier, predicting each algorithm's time, and its
//!   measurement under MPI ([`calibrate`]). The step simulator over its predictions (a
//!   step's collectives, their overlap with the compute, compute and communication on the
//!   same cores) is the crate above this one, ddl-sim.
//! - [`cores`] and [`Binding`]: the CPUs a node's ranks hold together, and the warning for
//!   ranks the launcher bound to fewer CPUs than their busy threads.

#![warn(missing_docs)]

pub mod algorithm;
pub mod allreduce;
pub mod binding;
pub mod calibrate;
pub mod collective;
pub mod cores;
pub mod cost;
mod counted;
pub mod error;
mod failure;
mod messaging;
pub mod mpi;
mod mpi_call;
mod parts;
pub mod priority;
pub mod sharded;
mod shared_region;
pub mod tags;
pub mod tcp;
pub mod tcp_world;
pub mod thread;
pub mod topology;
pub mod transport;
pub mod world;

pub use algorithm::{auto_candidates, Algorithm};
pub use allreduce::{
    Across, Allreducer, Choice, Declared, Element, Hierarchical, Multicolor, Multiring, Shm,
};
pub use binding::Binding;
pub use cost::{CostModel, MeasuredCurve, Tier};
pub use counted::Counted;
pub use error::{CommError, Result};
/// Half-precision types accepted by [`Allreducer::allreduce`] (re-exported from `half`).
pub use half::{bf16, f16};
pub use parts::Parts;
pub use priority::CommOrder;
pub use sharded::{Reduce, ShardAlgorithm, Sharded, ShardedOp};
pub use tcp::{tcp_group, tcp_group_with_timeout, Listener, Secret, TcpTransport};
pub use tcp_world::TcpWorld;
pub use thread::{thread_group, thread_group_with_timeout, ThreadTransport};
pub use topology::Topology;
pub use transport::{Op, Transport, DEFAULT_TIMEOUT};
pub use world::World;
