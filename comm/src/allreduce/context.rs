//! What every algorithm runs in: [`Allreduce`], the one trait the algorithms implement, and
//! [`Context`], where one runs (the ranks, how they sit on nodes, the cost model and the
//! buffers reused across calls).

use std::sync::{Arc, Mutex};

use super::element::{Buffer, Element};
use super::first_exchange::Staging;
use super::ring_steps::Step;
use super::signature::Signature;
use crate::cost::CostModel;
use crate::error::Result;
use crate::topology::Topology;
use crate::transport::Transport;

/// One allreduce algorithm, as an [`Allreducer`](super::Allreducer) runs it.
pub(crate) trait Allreduce: Send + Sync {
    /// Checks that it can run in `cx` and makes what it needs there (once, before any call).
    fn prepare(&mut self, cx: &Context) -> Result<()> {
        let _ = cx;
        Ok(())
    }

    /// Sums `buf` over the ranks of `cx` in place (divided by their count with `average`).
    /// With `check` (this rank's call), the ranks compare their calls first
    /// ([`super::call_check`]).
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
}

/// Where an algorithm runs, handed to each call.
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

impl Context {
    /// The ranks of `transport`, laid out as `topology` (checked against its size).
    pub(crate) fn new(
        transport: Arc<dyn Transport>,
        topology: Topology,
        model: CostModel,
    ) -> Result<Context> {
        topology.check_ranks(transport.size())?;
        Ok(Context {
            transport,
            topology,
            dims: topology.dims(),
            model,
            work: Mutex::new(Work::default()),
        })
    }

    /// Sums `buf` with `algorithm` (prepared here), after the call check if `check` (a caller
    /// that has already checked the ranks' calls passes false: the stage between the nodes of
    /// `hierarchical`).
    pub(crate) fn reduce<T: Element>(
        &self,
        algorithm: &dyn Allreduce,
        buf: &mut [T],
        average: bool,
        check: bool,
    ) -> Result<()> {
        if self.transport.size() == 1 {
            return Ok(());
        }
        let mine = check.then(|| Signature::new(T::DTYPE, buf.len()));
        algorithm.allreduce(self, T::buffer(buf), average, mine)
    }
}

/// Buffers the algorithms of one [`Context`] reuse: grown on first use, never shrunk, so
/// steady-state calls allocate nothing.
#[derive(Default)]
pub(crate) struct Work {
    /// The f32 copy of one block of an f16 / bf16 buffer.
    pub(crate) widened: Vec<f32>,
    /// The first messages of a two-rank call, with the call check in front.
    pub(crate) staging: Staging,
    /// What the message-based algorithms use while they run.
    pub(crate) scratch: Scratch,
}

/// The buffers of a message-based algorithm's run.
#[derive(Default)]
pub(crate) struct Scratch {
    /// Received parts, before they are added.
    pub(crate) recv: Vec<f32>,
    /// The ring's steps.
    pub(crate) steps: Vec<Step>,
}
