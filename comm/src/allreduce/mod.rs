//! Allreduce algorithms over any [`Transport`] and the [`Allreducer`] entry point.
//!
//! Each algorithm is one file, which declares it for the registry ([`crate::algorithm`]: its
//! name, what it parses from, its help line, whether `auto` may choose it, [`declare`]) and
//! owns its parameters' checks, its plan and scratch state and its cost formula, behind one
//! small trait ([`context`]): the message-based ones `ring.rs` (and the executor of every
//! ring), `multiring.rs`, `rhd.rs` and `multicolor.rs` (what they share is in `messages.rs`),
//! `mpi.rs`, `shm.rs`, `hierarchical.rs`; and `auto.rs`, which runs the others (its online
//! tuning in [`tune`]). [`Allreducer::with_model`] makes the one an [`Algorithm`] names, once;
//! [`CostModel::predict`] asks the algorithm's own formula.

mod auto;
pub(crate) mod call_check;
mod choose;
pub(crate) mod context;
pub(crate) mod declare;
pub(crate) mod element;
mod first_exchange;
pub mod hierarchical;
mod messages;
pub(crate) mod mpi;
pub(crate) mod multicolor;
pub(crate) mod multiring;
pub(crate) mod rhd;
pub(crate) mod ring;
mod ring_steps;
pub mod shm;
pub mod signature;
pub mod tune;
pub(crate) mod util;

use std::sync::Arc;

use half::{bf16, f16};

use crate::algorithm::Algorithm;
use crate::cost::CostModel;
use crate::error::Result;
use crate::topology::Topology;
use crate::transport::Transport;
use auto::Auto;
use context::{Allreduce, Context};
pub use declare::Declared;
pub use element::Element;
pub use hierarchical::{Across, Hierarchical};
pub use multicolor::Multicolor;
pub use multiring::Multiring;
pub use shm::Shm;
pub use signature::{describe_calls, Dtype, Signature};
pub use tune::Choice;

/// What runs an [`Allreducer`]'s algorithm: one of the registry's, or `auto` over them, whose
/// choices and online tuning the allreducer reports.
enum Running {
    /// An algorithm of the registry.
    One(Box<dyn Allreduce>),
    /// `auto`.
    Auto(Box<Auto>),
}

impl Running {
    fn algorithm(&self) -> &dyn Allreduce {
        match self {
            Running::One(one) => &**one,
            Running::Auto(auto) => &**auto,
        }
    }

    fn auto(&self) -> Option<&Auto> {
        match self {
            Running::One(_) => None,
            Running::Auto(auto) => Some(&**auto),
        }
    }
}

/// Allreduce entry point: one per transport, shared by reference; calls are serialised.
///
/// Construction is local (no communication), but every rank must build its `Allreducer`
/// with the same algorithm, topology and cost model, and call `allreduce*` in the same
/// order with the same lengths. Results are bitwise identical on all ranks for every
/// algorithm: each element's sum is computed by one rank in a fixed order and copied.
pub struct Allreducer {
    algorithm: Algorithm,
    cx: Context,
    /// What runs `algorithm` here.
    running: Running,
}

impl std::fmt::Debug for Allreducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allreducer")
            .field("rank", &self.cx.transport.rank())
            .field("size", &self.cx.transport.size())
            .field("algorithm", &self.algorithm)
            .field("topology", &self.cx.topology)
            .finish()
    }
}

impl Allreducer {
    /// An allreducer over `transport` with the default cost model (used by `auto`).
    ///
    /// `topology` describes how the transport's ranks sit on nodes (use
    /// [`Topology::flat`] when unknown, [`crate::world::World::topology`] under MPI). Fails if
    /// the algorithm cannot run here: `mpi` on a non-MPI transport, multiring dimensions
    /// whose product is not the rank count, or a topology of another size.
    ///
    /// # Examples
    ///
    /// Four ranks, each a thread of this process, sum their buffers with the ring:
    ///
    /// ```
    /// use std::sync::Arc;
    /// use ddl_comm::{thread_group, Algorithm, Allreducer, Topology, Transport};
    ///
    /// let sums: Vec<Vec<f32>> = std::thread::scope(|s| {
    ///     let ranks: Vec<_> = thread_group(4)
    ///         .into_iter()
    ///         .map(|t| {
    ///             s.spawn(move || {
    ///                 let rank = t.rank() as f32;
    ///                 let t: Arc<dyn Transport> = Arc::new(t);
    ///                 let ar = Allreducer::new(t, Algorithm::Ring, Topology::flat(4))?;
    ///                 let mut grads = vec![rank, 1.0, 2.0 * rank];
    ///                 ar.allreduce(&mut grads, false)?;
    ///                 Ok::<_, ddl_comm::CommError>(grads)
    ///             })
    ///         })
    ///         .collect();
    ///     ranks.into_iter().map(|r| r.join().unwrap().unwrap()).collect()
    /// });
    /// assert!(sums.iter().all(|g| g == &[6.0, 4.0, 12.0]));
    /// ```
    pub fn new(
        transport: Arc<dyn Transport>,
        algorithm: Algorithm,
        topology: Topology,
    ) -> Result<Allreducer> {
        Allreducer::with_model(transport, algorithm, topology, CostModel::default())
    }

    /// As [`Allreducer::new`] with an explicit cost model (for `auto`).
    pub fn with_model(
        transport: Arc<dyn Transport>,
        algorithm: Algorithm,
        topology: Topology,
        model: CostModel,
    ) -> Result<Allreducer> {
        let cx = Context::new(transport, topology, model)?;
        let mut running = match algorithm.implement() {
            Some(one) => Running::One(one),
            None => Running::Auto(Box::new(Auto::new())),
        };
        match &mut running {
            Running::One(one) => one.prepare(&cx)?,
            Running::Auto(auto) => auto.prepare(&cx)?,
        }
        Ok(Allreducer {
            algorithm,
            cx,
            running,
        })
    }

    /// The configured algorithm.
    pub fn algorithm(&self) -> &Algorithm {
        &self.algorithm
    }

    /// The transport.
    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.cx.transport
    }

    /// The topology.
    pub fn topology(&self) -> Topology {
        self.cx.topology
    }

    /// The algorithm a call with `bytes` of f32 data runs (resolves `auto`: the tuned choice
    /// once the ranks agreed on one at this size class, otherwise the cost model's among the
    /// candidates ([`auto_candidates`](crate::auto_candidates): `shm` only where the ranks
    /// share memory, which the first call finds out; `mpi` only over MPI).
    pub fn resolve(&self, bytes: usize) -> Algorithm {
        match self.running.auto() {
            Some(auto) => auto.resolve(&self.cx, bytes),
            None => self.algorithm.clone(),
        }
    }

    /// Whether `auto` tunes itself online: it is `auto` and its cost model measured nothing
    /// in this layout (a calibrated or saved model wins when given).
    pub fn tunes(&self) -> bool {
        self.running.auto().is_some_and(Auto::tunes)
    }

    /// Whether the next call of `bytes` is a trial of the online tuning (every rank gives
    /// the same answer after the same calls).
    pub fn tuning(&self, bytes: usize) -> bool {
        // A call of no bytes or on one rank reduces nothing and tries nothing.
        bytes > 0
            && self.cx.transport.size() > 1
            && self.running.auto().is_some_and(|auto| auto.tuning(bytes))
    }

    /// The tuning's choices made since the last call: each is handed out once, for a log line.
    pub fn take_tuned(&self) -> Vec<Choice> {
        self.running.auto().map_or_else(Vec::new, Auto::take_tuned)
    }

    /// The cost model with every size the tuning settled as curves measured in this layout:
    /// saved ([`CostModel::save`]) and given to a later job, `auto` chooses as this one did
    /// without trying again.
    pub fn tuned_model(&self) -> CostModel {
        let mut model = self.cx.model.clone();
        let curves = self
            .running
            .auto()
            .and_then(|auto| auto.curves(self.cx.topology));
        if let Some(curves) = curves {
            model.measured.extend(curves);
            model.source = format!("tuned online ({})", model.source);
        }
        model
    }

    /// Sums `buf` over all ranks in place; with `average`, divides by the rank count.
    pub fn allreduce_f32(&self, buf: &mut [f32], average: bool) -> Result<()> {
        self.allreduce(buf, average)
    }

    /// Sums a buffer of f32, f16 or bf16 over all ranks in place (f16/bf16 are reduced in
    /// f32 and rounded once); with `average`, divides by the rank count before rounding.
    ///
    /// `shm` moves f16 / bf16 as themselves; the other algorithms, `mpi` included (MPI has
    /// no half-precision types), widen the buffer to f32 block by block (256 Ki elements) in
    /// a reused scratch buffer, reduce each block in place and round it back.
    ///
    /// Every rank must pass the same element count and type: before anything is summed, the
    /// ranks compare their calls ([`signature`]) and all fail with
    /// [`CommError::Mismatch`](crate::CommError::Mismatch) naming each rank's count and type
    /// when they differ.
    pub fn allreduce<T: Element>(&self, buf: &mut [T], average: bool) -> Result<()> {
        self.cx.reduce(self.running.algorithm(), buf, average, true)
    }

    /// Sums an f16 buffer (reduced in f32); see [`Allreducer::allreduce`].
    pub fn allreduce_f16(&self, buf: &mut [f16], average: bool) -> Result<()> {
        self.allreduce(buf, average)
    }

    /// Sums a bf16 buffer (reduced in f32); see [`Allreducer::allreduce`].
    pub fn allreduce_bf16(&self, buf: &mut [bf16], average: bool) -> Result<()> {
        self.allreduce(buf, average)
    }
}
