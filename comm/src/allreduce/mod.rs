//! Allreduce algorithms over any [`Transport`] and the [`Allreducer`] entry point.
//!
//! Each algorithm is one [`Allreduce`] in its own file, which owns its parameters' checks, its
//! plan and scratch state and its cost formula: the message-based ones `ring.rs` (and the
//! executor of every ring), `multiring.rs`, `rhd.rs` and `multicolor.rs` (what they share is in
//! `messages.rs`), `mpi.rs`, `shm.rs`, `hierarchical.rs`, and `auto.rs`, which runs the others
//! (its online tuning in [`tune`]). [`implement`] makes the one an [`Algorithm`] names: the only
//! place that looks at which algorithm the user chose; [`Allreducer::with_model`] does it once,
//! and [`CostModel::predict`] to ask the algorithm's own formula.

mod auto;
mod element;
mod first_exchange;
pub mod hierarchical;
mod messages;
mod mpi;
pub(crate) mod multicolor;
mod multiring;
mod rhd;
pub(crate) mod ring;
pub mod shm;
pub mod signature;
pub mod tune;
pub(crate) mod util;

use std::sync::{Arc, Mutex};

use half::{bf16, f16};

use crate::algorithm::Algorithm;
use crate::cost::CostModel;
use crate::error::Result;
use crate::topology::Topology;
use crate::transport::Transport;
use auto::Auto;
pub(crate) use element::add_into;
use element::Buffer;
pub use element::Element;
use hierarchical::Hierarchical;
use messages::Work;
use mpi::Mpi;
use multicolor::Multicolor;
use multiring::Multiring;
use rhd::Rhd;
use ring::Ring;
use shm::Shm;
pub use signature::{describe_calls, Dtype, Signature};
pub use tune::Choice;

/// One allreduce algorithm, as [`Allreducer`] runs it.
pub(crate) trait Allreduce: Send + Sync {
    /// Checks that it can run in `cx` and makes what it needs there (once, before any call).
    fn prepare(&mut self, cx: &Context) -> Result<()> {
        let _ = cx;
        Ok(())
    }

    /// Sums `buf` over the ranks of `cx` in place (divided by their count with `average`).
    /// With `check` (this rank's call), the ranks compare their calls first ([`signature`]).
    fn allreduce(
        &self,
        cx: &Context,
        buf: Buffer<'_>,
        average: bool,
        check: Option<Signature>,
    ) -> Result<()>;

    /// Predicted seconds of one call of `bytes` (f32) over `topo` by its formula (where
    /// `calibrate` did not time it: [`CostModel::predict`]).
    fn predict(&self, model: &CostModel, bytes: usize, topo: Topology) -> f64;

    /// `auto` itself, whose choices and online tuning [`Allreducer`] reports.
    fn auto(&self) -> Option<&Auto> {
        None
    }
}

/// The algorithm `algorithm` names, not yet prepared ([`Allreduce::prepare`]).
pub(crate) fn implement(algorithm: &Algorithm) -> Box<dyn Allreduce> {
    match algorithm {
        Algorithm::Ring => Box::new(Ring),
        Algorithm::Rhd => Box::new(Rhd),
        Algorithm::Multicolor {
            colors,
            chunk_bytes,
        } => Box::new(Multicolor::new(*colors, *chunk_bytes)),
        Algorithm::Multiring { dims, segments } => {
            Box::new(Multiring::new(dims.clone(), *segments))
        }
        Algorithm::Shm { chunk_bytes } => Box::new(Shm::new(*chunk_bytes)),
        Algorithm::Hierarchical {
            across,
            chunk_bytes,
        } => Box::new(Hierarchical::new(*across, *chunk_bytes)),
        Algorithm::Mpi => Box::new(Mpi),
        Algorithm::Auto => Box::new(Auto::new()),
    }
}

/// Where an [`Allreducer`]'s algorithm runs, handed to each call.
pub(crate) struct Context {
    /// The ranks.
    pub(crate) transport: Arc<dyn Transport>,
    /// How they sit on nodes.
    pub(crate) topology: Topology,
    /// The topology's ring dimensions (multiring's when given none).
    pub(crate) dims: Vec<usize>,
    /// The cost model (`auto`'s).
    pub(crate) model: CostModel,
    /// Buffers the algorithms reuse across calls, locked by those that use them.
    pub(crate) work: Mutex<Work>,
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
    implementation: Box<dyn Allreduce>,
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
        topology.check_ranks(transport.size())?;
        let cx = Context {
            transport,
            topology,
            dims: topology.dims(),
            model,
            work: Mutex::new(Work::default()),
        };
        let mut implementation = implement(&algorithm);
        implementation.prepare(&cx)?;
        Ok(Allreducer {
            algorithm,
            cx,
            implementation,
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
        match self.implementation.auto() {
            Some(auto) => auto.resolve(&self.cx, bytes),
            None => self.algorithm.clone(),
        }
    }

    /// Whether `auto` tunes itself online: it is `auto` and its cost model measured nothing
    /// in this layout (a calibrated or saved model wins when given).
    pub fn tunes(&self) -> bool {
        self.implementation.auto().is_some_and(Auto::tunes)
    }

    /// Whether the next call of `bytes` is a trial of the online tuning (every rank gives
    /// the same answer after the same calls).
    pub fn tuning(&self, bytes: usize) -> bool {
        // A call of no bytes or on one rank reduces nothing and tries nothing.
        bytes > 0
            && self.cx.transport.size() > 1
            && self
                .implementation
                .auto()
                .is_some_and(|auto| auto.tuning(bytes))
    }

    /// The tuning's choices made since the last call: each is handed out once, for a log line.
    pub fn take_tuned(&self) -> Vec<Choice> {
        self.implementation
            .auto()
            .map_or_else(Vec::new, Auto::take_tuned)
    }

    /// The cost model with every size the tuning settled as curves measured in this layout:
    /// saved ([`CostModel::save`]) and given to a later job, `auto` chooses as this one did
    /// without trying again.
    pub fn tuned_model(&self) -> CostModel {
        let mut model = self.cx.model.clone();
        let curves = self
            .implementation
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
        self.reduce(buf, average, true)
    }

    /// Sums `buf`, after the call check if `check` (a caller that has already checked the
    /// ranks' calls passes false: the stage between the nodes of `hierarchical`).
    fn reduce<T: Element>(&self, buf: &mut [T], average: bool, check: bool) -> Result<()> {
        if self.cx.transport.size() == 1 {
            return Ok(());
        }
        let mine = check.then(|| Signature::new(T::DTYPE, buf.len()));
        self.implementation
            .allreduce(&self.cx, T::buffer(buf), average, mine)
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
