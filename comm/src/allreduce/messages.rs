//! What the message-based algorithms (ring, multiring, rhd, multicolor) share: each sums an f32
//! buffer in place with messages over a transport ([`Messages`]), and this file makes every
//! one of them an [`Allreduce`]: the call check (riding on the first exchange at two ranks,
//! [`super::first_exchange`]), f16 / bf16 widened to f32 block by block, the mean, and the
//! buffers reused across calls ([`Work`]).

use super::call_check::check_calls;
use super::context::{Allreduce, Context, Scratch, Work};
use super::element::{with_elements, Buffer, Element};
use super::first_exchange::FirstExchange;
use super::signature::Signature;
use super::util::divide;
use crate::cost::CostModel;
use crate::error::Result;
use crate::topology::Topology;
use crate::transport::Transport;

/// Elements of f16 / bf16 widened to f32 and reduced at a time by the message-based
/// algorithms and `mpi` (1 MiB of f32: of 64 Ki, 256 Ki, 1 Mi and the whole buffer, the
/// fastest at 4-64 MiB).
const WIDEN_BLOCK: usize = 256 << 10;

/// A message-based allreduce of f32 buffers.
pub(crate) trait Messages: Send + Sync {
    /// Checks that it can run in `cx` and makes its plan there (once, before any call).
    fn setup(&mut self, cx: &Context) -> Result<()> {
        let _ = cx;
        Ok(())
    }

    /// Sums `buf` over the ranks of `t` (`cx`'s transport, or that transport carrying the
    /// call check) in place.
    fn run(
        &self,
        cx: &Context,
        t: &dyn Transport,
        buf: &mut [f32],
        scratch: &mut Scratch,
    ) -> Result<()>;

    /// Whether at two ranks its first exchange is one message each way, whatever the length
    /// (then that exchange carries the call check).
    fn rides(&self) -> bool {
        true
    }

    /// Its cost formula ([`Allreduce::predict`]).
    fn cost(&self, model: &CostModel, bytes: usize, topo: Topology) -> f64;
}

impl<M: Messages> Allreduce for M {
    fn prepare(&mut self, cx: &Context) -> Result<()> {
        self.setup(cx)
    }

    fn allreduce(
        &self,
        cx: &Context,
        buf: Buffer<'_>,
        average: bool,
        check: Option<Signature>,
    ) -> Result<()> {
        let t = &*cx.transport;
        let mut work = cx.work.lock().unwrap_or_else(|e| e.into_inner());
        let Work {
            widened,
            staging,
            scratch,
        } = &mut *work;
        let mut run = |t: &dyn Transport, f: &mut [f32]| self.run(cx, t, f, scratch);
        match check {
            Some(mine) if t.size() == 2 && self.rides() => {
                let first = FirstExchange::new(t, mine, staging);
                with_elements!(buf, b => in_f32(b, widened, average, t.size(), |f| run(&first, f)))
                    .and_then(|()| first.finish())
            }
            check => {
                if let Some(mine) = check {
                    check_calls(t, mine, false)?;
                }
                with_elements!(buf, b => in_f32(b, widened, average, t.size(), |f| run(t, f)))
            }
        }
    }

    fn predict(&self, model: &CostModel, bytes: usize, topo: Topology) -> f64 {
        self.cost(model, bytes, topo)
    }
}

/// Runs `run` (an allreduce of f32 over `ranks` ranks) on `buf`: in place for f32, otherwise
/// widened block by block into `widened` and rounded back; with `average`, divided by the rank
/// count (before rounding). An empty buffer runs it too, on no elements: its first exchange
/// may carry the call check to a rank with elements.
pub(crate) fn in_f32<T: Element>(
    buf: &mut [T],
    widened: &mut Vec<f32>,
    average: bool,
    ranks: usize,
    mut run: impl FnMut(&mut [f32]) -> Result<()>,
) -> Result<()> {
    let p = ranks as f32;
    if let Some(f) = T::as_f32_mut(buf) {
        run(f)?;
        if average {
            divide(f, p);
        }
        return Ok(());
    }
    // Block by block, so that the f32 copy stays in the caches: widening the whole buffer
    // first made a large f16 `mpi` call several times slower (BENCHMARKS.md, "Figures behind
    // the defaults").
    widened.resize(WIDEN_BLOCK.min(buf.len()), 0.0);
    if buf.is_empty() {
        return run(&mut []);
    }
    for part in buf.chunks_mut(WIDEN_BLOCK) {
        let wide = &mut widened[..part.len()];
        T::widen(part, wide);
        run(wide)?;
        if average {
            divide(wide, p);
        }
        T::narrow(wide, part);
    }
    Ok(())
}
