//! Allreduce algorithms over any [`Transport`] and the [`Allreducer`] entry point.

mod element;
mod first_exchange;
pub mod hierarchical;
pub(crate) mod multicolor;
mod rhd;
pub(crate) mod ring;
pub mod shm;
pub mod signature;
pub mod tune;
pub(crate) mod util;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use half::{bf16, f16};

use crate::algorithm::{Across, Algorithm};
use crate::cost::{auto_candidates, CostModel};
use crate::error::{CommError, Result};
use crate::tags::{MAX_COLORS, MAX_DIMS};
use crate::topology::Topology;
use crate::transport::Transport;
pub(crate) use element::add_into;
pub use element::Element;
use first_exchange::{FirstExchange, Staging};
use hierarchical::Hierarchical;
use multicolor::MulticolorPlan;
use shm::ShmAllreduce;
use signature::check_calls;
pub use signature::{describe_calls, Dtype, Signature};
pub use tune::Choice;
use tune::{Plan, Tuner};

/// Largest chunk of the shared-memory algorithm (its region holds two per rank).
pub(crate) const MAX_SHM_CHUNK: usize = 64 << 20;

/// Elements of f16 / bf16 widened to f32 and reduced at a time by the message-based
/// algorithms and `mpi` (1 MiB of f32: of 64 Ki, 256 Ki, 1 Mi and the whole buffer, the
/// fastest at 4-64 MiB).
const WIDEN_BLOCK: usize = 256 << 10;

/// Reusable buffers: grown on first use, never shrunk, so steady-state calls allocate
/// nothing.
#[derive(Default)]
struct Scratch {
    recv: Vec<f32>,
    widened: Vec<f32>,
    steps: Vec<ring::Step>,
    /// The shared-memory region, once probed and found.
    shm: Option<ShmAllreduce>,
    /// The node regions and peer groups of the hierarchical algorithm, once probed and found
    /// (boxed: it holds an [`Allreducer`] of its own).
    hierarchical: Option<Box<Hierarchical>>,
    /// The first messages of a two-rank call, with the call check in front.
    staging: Staging,
}

/// Whether the ranks of each node share its memory: not yet probed, yes or no (same on all
/// ranks). On one node `shm` probes it, on several `hierarchical`.
const SHM_UNKNOWN: u8 = 0;
const SHM_YES: u8 = 1;
const SHM_NO: u8 = 2;

/// Allreduce entry point: one per transport, shared by reference; calls are serialised.
///
/// Construction is local (no communication), but every rank must build its `Allreducer`
/// with the same algorithm, topology and cost model, and call `allreduce*` in the same
/// order with the same lengths. Results are bitwise identical on all ranks for every
/// algorithm: each element's sum is computed by one rank in a fixed order and copied.
pub struct Allreducer {
    transport: Arc<dyn Transport>,
    algorithm: Algorithm,
    topology: Topology,
    model: CostModel,
    dims: Vec<usize>,
    multicolor: Option<MulticolorPlan>,
    scratch: Mutex<Scratch>,
    /// [`SHM_UNKNOWN`], [`SHM_YES`] or [`SHM_NO`]: known after the first `shm` or
    /// `hierarchical` call.
    shm_probe: AtomicU8,
    /// `auto`'s choices by (bytes, shared memory allowed): the model is asked once per size.
    choices: Mutex<HashMap<(usize, bool), Algorithm>>,
    /// `auto`'s online tuning, when the model measured nothing in this layout
    /// ([`Allreducer::tunes`]).
    tuner: Option<Mutex<Tuner>>,
}

/// Most sizes whose `auto` choice is remembered (the memo starts over beyond).
const MAX_CHOICES: usize = 1024;

impl std::fmt::Debug for Allreducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allreducer")
            .field("rank", &self.transport.rank())
            .field("size", &self.transport.size())
            .field("algorithm", &self.algorithm)
            .field("topology", &self.topology)
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
        let p = transport.size();
        topology.check_ranks(p)?;
        let dims = match &algorithm {
            Algorithm::Multiring { dims, .. } if !dims.is_empty() => dims.clone(),
            _ => topology.dims(),
        };
        if dims.iter().product::<usize>() != p || dims.len() > MAX_DIMS {
            return Err(CommError::InvalidArgument(format!(
                "multiring dimensions {dims:?} do not multiply to {p} ranks (at most {} dimensions)",
                MAX_DIMS
            )));
        }
        let multicolor = match &algorithm {
            Algorithm::Multicolor {
                colors,
                chunk_bytes,
            } => {
                if *colors == 0 || *colors > MAX_COLORS || *chunk_bytes < 4 {
                    return Err(CommError::InvalidArgument(format!(
                        "multicolor needs 1..={MAX_COLORS} colors and chunks of at least 4 bytes, got {colors} colors, {chunk_bytes} bytes"
                    )));
                }
                Some(MulticolorPlan::new(
                    topology,
                    transport.rank(),
                    *colors,
                    *chunk_bytes,
                ))
            }
            Algorithm::Auto => Some(MulticolorPlan::new(
                topology,
                transport.rank(),
                MulticolorPlan::DEFAULT_COLORS,
                MulticolorPlan::DEFAULT_CHUNK_BYTES,
            )),
            _ => None,
        };
        if let Algorithm::Shm { chunk_bytes } = algorithm {
            if topology.nodes > 1 {
                return Err(CommError::Unsupported(format!(
                    "shm needs every rank on one node; the topology has {} nodes",
                    topology.nodes
                )));
            }
            check_shm_chunk(chunk_bytes)?;
        }
        if let Algorithm::Hierarchical {
            across,
            chunk_bytes,
        } = algorithm
        {
            check_shm_chunk(chunk_bytes)?;
            if across == Across::Mpi && !transport.has_native_allreduce() {
                return Err(CommError::Unsupported(
                    "hierarchical:mpi needs the MPI transport (hierarchical:ring or hierarchical:rhd run on any)".into(),
                ));
            }
        }
        if algorithm == Algorithm::Mpi && !transport.has_native_allreduce() {
            return Err(CommError::Unsupported(
                "the mpi algorithm needs the MPI transport".into(),
            ));
        }
        let tuner = (algorithm == Algorithm::Auto && !model.measures(topology))
            .then(|| Mutex::new(Tuner::default()));
        Ok(Allreducer {
            transport,
            algorithm,
            topology,
            tuner,
            model,
            dims,
            multicolor,
            scratch: Mutex::new(Scratch::default()),
            shm_probe: AtomicU8::new(SHM_UNKNOWN),
            choices: Mutex::new(HashMap::new()),
        })
    }

    /// The configured algorithm.
    pub fn algorithm(&self) -> &Algorithm {
        &self.algorithm
    }

    /// The transport.
    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.transport
    }

    /// The topology.
    pub fn topology(&self) -> Topology {
        self.topology
    }

    /// The algorithm a call with `bytes` of f32 data runs (resolves `auto`: the tuned choice
    /// once the ranks agreed on one at this size class, otherwise the cost model's among the
    /// candidates ([`auto_candidates`]: `shm` only where the ranks share memory, which the
    /// first call finds out; `mpi` only over MPI).
    pub fn resolve(&self, bytes: usize) -> Algorithm {
        match &self.algorithm {
            Algorithm::Auto => {
                let shared = self.shared();
                if let Some(tuner) = &self.tuner {
                    let tuner = tuner.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(c) = tuner.chosen(bytes, shared) {
                        return c.algorithm.clone();
                    }
                }
                self.modelled(bytes, shared)
            }
            other => other.clone(),
        }
    }

    /// Whether `auto` tunes itself online: it is `auto` and its cost model measured nothing
    /// in this layout (a calibrated or saved model wins when given).
    pub fn tunes(&self) -> bool {
        self.tuner.is_some()
    }

    /// Whether the next call of `bytes` is a trial of the online tuning (every rank gives
    /// the same answer after the same calls).
    pub fn tuning(&self, bytes: usize) -> bool {
        // A call of no bytes or on one rank reduces nothing and tries nothing.
        bytes > 0
            && self.transport.size() > 1
            && self.tuner.as_ref().is_some_and(|tuner| {
                let tuner = tuner.lock().unwrap_or_else(|e| e.into_inner());
                tuner.chosen(bytes, self.shared()).is_none()
            })
    }

    /// The tuning's choices made since the last call: each is handed out once, for a log line.
    pub fn take_tuned(&self) -> Vec<Choice> {
        self.tuner.as_ref().map_or_else(Vec::new, |tuner| {
            tuner.lock().unwrap_or_else(|e| e.into_inner()).take_fresh()
        })
    }

    /// The cost model with every size the tuning settled as curves measured in this layout:
    /// saved ([`CostModel::save`]) and given to a later job, `auto` chooses as this one did
    /// without trying again.
    pub fn tuned_model(&self) -> CostModel {
        let mut model = self.model.clone();
        if let Some(tuner) = &self.tuner {
            let tuner = tuner.lock().unwrap_or_else(|e| e.into_inner());
            model.measured.extend(tuner.curves(self.topology));
            model.source = format!("tuned online ({})", model.source);
        }
        model
    }

    /// Whether the ranks may share memory (found, or not probed yet).
    fn shared(&self) -> bool {
        self.shm_probe.load(Ordering::Relaxed) != SHM_NO
    }

    /// The candidates of `auto` here, each distinct.
    fn candidates(&self, shared: bool) -> Vec<Algorithm> {
        let all = auto_candidates(self.topology, shared, self.transport.has_native_allreduce());
        tune::distinct(all, self.topology)
    }

    /// The cost model's choice for `bytes` (asked once per size).
    fn modelled(&self, bytes: usize, shared: bool) -> Algorithm {
        let mut choices = self.choices.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(a) = choices.get(&(bytes, shared)) {
            return a.clone();
        }
        if choices.len() >= MAX_CHOICES {
            choices.clear();
        }
        let a = self
            .model
            .choose_among(bytes, self.topology, &self.candidates(shared));
        choices.insert((bytes, shared), a.clone());
        a
    }

    /// What `auto` runs for the next call of `bytes`, and whether it is a trial.
    fn plan(&self, bytes: usize) -> (Algorithm, bool) {
        let shared = self.shared();
        match &self.tuner {
            Some(tuner) if bytes > 0 => {
                let mut tuner = tuner.lock().unwrap_or_else(|e| e.into_inner());
                match tuner.plan(bytes, shared, || self.candidates(shared)) {
                    Plan::Chosen(a) => (a, false),
                    Plan::Trial(a) => (a, true),
                }
            }
            _ => (self.modelled(bytes, shared), false),
        }
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
    /// [`CommError::Mismatch`] naming each rank's count and type when they differ.
    pub fn allreduce<T: Element>(&self, buf: &mut [T], average: bool) -> Result<()> {
        self.reduce(buf, average, true)
    }

    /// [`Allreducer::allreduce`] for a caller that has already checked the ranks' calls (the
    /// stage between the nodes of `hierarchical`).
    pub(crate) fn allreduce_agreed<T: Element>(&self, buf: &mut [T], average: bool) -> Result<()> {
        self.reduce(buf, average, false)
    }

    fn reduce<T: Element>(&self, buf: &mut [T], average: bool, check: bool) -> Result<()> {
        let t = &*self.transport;
        if t.size() == 1 {
            return Ok(());
        }
        let mine = Signature::new(T::DTYPE, buf.len());
        if self.algorithm == Algorithm::Mpi {
            if let Some(f) = T::as_f32_mut(buf) {
                // Straight to MPI_Allreduce: no scratch to lock.
                return self.mpi_f32(f, average, check.then_some(mine));
            }
        }
        let mut guard = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let scratch = &mut *guard;
        match &self.algorithm {
            Algorithm::Auto => self.auto(scratch, buf, average, check.then_some(mine)),
            Algorithm::Shm { chunk_bytes } => {
                let Some(shm) = self.shared_memory(&mut scratch.shm, *chunk_bytes)? else {
                    return Err(CommError::Unsupported(
                        "the shm algorithm needs every rank on one node, with a writable /dev/shm"
                            .into(),
                    ));
                };
                shm.allreduce(t, buf, average)
            }
            Algorithm::Hierarchical {
                across,
                chunk_bytes,
            } => {
                let Some(h) = self.node_groups(&mut scratch.hierarchical, *across, *chunk_bytes)?
                else {
                    return Err(CommError::Unsupported(
                        "the hierarchical algorithm needs the ranks of every node to share its memory, with a writable /dev/shm"
                            .into(),
                    ));
                };
                h.allreduce(t, buf, average, check.then_some(mine))
            }
            algorithm if check && first_exchange::rides(algorithm, t.size()) => {
                let mut staging = std::mem::take(&mut scratch.staging);
                let done = {
                    let first = FirstExchange::new(t, mine, &mut staging);
                    self.run_elements(algorithm, &first, scratch, buf, average)
                        .and_then(|()| first.finish())
                };
                scratch.staging = staging;
                done
            }
            algorithm => {
                if check {
                    check_calls(t, mine, *algorithm == Algorithm::Mpi)?;
                }
                self.run_elements(algorithm, t, scratch, buf, average)
            }
        }
    }

    /// `mpi` on an f32 buffer: MPI_Allreduce in place, after the call check if `check`.
    fn mpi_f32(&self, buf: &mut [f32], average: bool, check: Option<Signature>) -> Result<()> {
        let t = &*self.transport;
        if let Some(mine) = check {
            check_calls(t, mine, true)?;
        }
        t.native_allreduce_f32(buf)?;
        if average {
            divide(buf, t.size() as f32);
        }
        Ok(())
    }

    /// `auto`: the algorithm the tuning tries or settled on for this size class (or the cost
    /// model's), timed while the tuning lasts; after the class's last trial the ranks agree
    /// on the fastest ([`tune`]).
    fn auto<T: Element>(
        &self,
        scratch: &mut Scratch,
        buf: &mut [T],
        average: bool,
        check: Option<Signature>,
    ) -> Result<()> {
        let bytes = 4 * buf.len();
        if self.topology.nodes == 1 {
            // Probed on the first call whatever its size, before anything is planned.
            self.shared_memory(&mut scratch.shm, ShmAllreduce::DEFAULT_CHUNK_BYTES)?;
        }
        let shared = self.shared();
        let (algorithm, trial) = self.plan(bytes);
        let mut check = check;
        if trial {
            // The ranks start a trial call together (see `tune::call_times`): the call check
            // goes first, on its own, and is the synchronisation. Ranks that passed other
            // sizes may be at other stages of their tuning, so nothing they do before it may
            // depend on the size.
            match check.take() {
                Some(mine) => self.check_alone(scratch, mine)?,
                None => self.transport.barrier()?,
            }
        }
        let start = Instant::now();
        self.run_auto(scratch, buf, average, check, algorithm)?;
        let Some(tuner) = self
            .tuner
            .as_ref()
            .filter(|_| trial && shared == self.shared())
        else {
            return Ok(());
        };
        let mut tuner = tuner.lock().unwrap_or_else(|e| e.into_inner());
        if tuner.record(bytes, shared, start.elapsed().as_secs_f64()) {
            tuner.agree(&*self.transport, bytes, shared)?;
        }
        Ok(())
    }

    /// The call check of `auto` without a call: where all ranks meet whatever they run (see
    /// [`Allreducer::run_auto`]).
    fn check_alone(&self, scratch: &mut Scratch, mine: Signature) -> Result<()> {
        let t = &*self.transport;
        match scratch.shm.as_mut().filter(|_| self.topology.nodes == 1) {
            Some(shm) => shm.check(t, mine),
            None => check_calls(t, mine, false),
        }
    }

    /// Runs `algorithm` for `auto`, the call check first. Ranks of different sizes may run
    /// different algorithms, so all must meet in the same check whatever they run: in the
    /// shared memory when the ranks share one node, where `shm` runs it in its own first
    /// synchronisation and the others alone ([`ShmAllreduce::check`]); otherwise
    /// [`check_calls`].
    fn run_auto<T: Element>(
        &self,
        scratch: &mut Scratch,
        buf: &mut [T],
        average: bool,
        check: Option<Signature>,
        algorithm: Algorithm,
    ) -> Result<()> {
        let t = &*self.transport;
        let bytes = 4 * buf.len();
        if self.topology.nodes == 1 {
            if let Some(shm) = scratch.shm.as_mut() {
                if let Algorithm::Shm { .. } = algorithm {
                    return shm.allreduce(t, buf, average);
                }
                if let Some(mine) = check {
                    shm.check(t, mine)?;
                }
                return self.run_elements(&algorithm, t, scratch, buf, average);
            }
        }
        if let Some(mine) = check {
            check_calls(t, mine, false)?;
        }
        if let Algorithm::Hierarchical {
            across,
            chunk_bytes,
        } = algorithm
        {
            if let Some(h) = self.node_groups(&mut scratch.hierarchical, across, chunk_bytes)? {
                return h.allreduce(t, buf, average, None);
            }
            // No shared memory after all: the model's choice without it.
            let algorithm = self.modelled(bytes, false);
            return self.run_elements(&algorithm, t, scratch, buf, average);
        }
        self.run_elements(&algorithm, t, scratch, buf, average)
    }

    /// Runs a message-based algorithm or `mpi` over `t` on a buffer of any element type: f32
    /// in place, f16 / bf16 widened block by block. An empty buffer runs it too, on no
    /// elements: its first exchange may carry the call check to a rank with elements.
    fn run_elements<T: Element>(
        &self,
        algorithm: &Algorithm,
        t: &dyn Transport,
        scratch: &mut Scratch,
        buf: &mut [T],
        average: bool,
    ) -> Result<()> {
        let p = t.size() as f32;
        let Scratch {
            recv,
            widened,
            steps,
            ..
        } = scratch;
        if let Some(f) = T::as_f32_mut(buf) {
            self.run(algorithm, t, f, recv, steps)?;
            if average {
                divide(f, p);
            }
            return Ok(());
        }
        // Block by block, so that the f32 copy stays in the caches: widening the whole buffer
        // first made a large f16 `mpi` call several times slower (BENCHMARKS.md, "Figures behind the defaults").
        widened.resize(WIDEN_BLOCK.min(buf.len()), 0.0);
        if buf.is_empty() {
            return self.run(algorithm, t, &mut [], recv, steps);
        }
        for part in buf.chunks_mut(WIDEN_BLOCK) {
            let wide = &mut widened[..part.len()];
            T::widen(part, wide);
            self.run(algorithm, t, wide, recv, steps)?;
            if average {
                divide(wide, p);
            }
            T::narrow(wide, part);
        }
        Ok(())
    }

    /// Sums an f16 buffer (reduced in f32); see [`Allreducer::allreduce`].
    pub fn allreduce_f16(&self, buf: &mut [f16], average: bool) -> Result<()> {
        self.allreduce(buf, average)
    }

    /// Sums a bf16 buffer (reduced in f32); see [`Allreducer::allreduce`].
    pub fn allreduce_bf16(&self, buf: &mut [bf16], average: bool) -> Result<()> {
        self.allreduce(buf, average)
    }

    /// The shared-memory allreduce, probed (collectively) on first use: `None` when the
    /// ranks do not share one node's memory.
    fn shared_memory<'a>(
        &self,
        slot: &'a mut Option<ShmAllreduce>,
        chunk_bytes: usize,
    ) -> Result<Option<&'a mut ShmAllreduce>> {
        if self.shm_probe.load(Ordering::Relaxed) == SHM_UNKNOWN {
            *slot = ShmAllreduce::create(&*self.transport, chunk_bytes, 0)?;
            let found = if slot.is_some() { SHM_YES } else { SHM_NO };
            self.shm_probe.store(found, Ordering::Relaxed);
        }
        Ok(slot.as_mut())
    }

    /// The hierarchical algorithm's groups and node regions, probed (collectively) on first
    /// use and made anew (collectively: every rank resolves the same algorithm) for another
    /// algorithm between the nodes or chunk: `None` when the ranks of some node do not share
    /// its memory.
    fn node_groups<'a>(
        &self,
        slot: &'a mut Option<Box<Hierarchical>>,
        across: Across,
        chunk_bytes: usize,
    ) -> Result<Option<&'a mut Box<Hierarchical>>> {
        let stale = slot.as_ref().is_none_or(|h| {
            *h.peers().algorithm() != across.algorithm() || h.chunk_bytes() != chunk_bytes
        });
        if stale && self.shm_probe.load(Ordering::Relaxed) != SHM_NO {
            let nodes = Topology::flat(self.topology.nodes);
            let peers = |t| Allreducer::new(t, across.algorithm(), nodes);
            *slot = Hierarchical::create(&*self.transport, self.topology, chunk_bytes, peers)?
                .map(Box::new);
            let found = if slot.is_some() { SHM_YES } else { SHM_NO };
            self.shm_probe.store(found, Ordering::Relaxed);
        }
        Ok(slot.as_mut())
    }

    /// Runs `algorithm` (resolved, not `shm` nor `hierarchical`) over `t` on an f32 buffer.
    fn run(
        &self,
        algorithm: &Algorithm,
        t: &dyn Transport,
        buf: &mut [f32],
        recv: &mut Vec<f32>,
        steps: &mut Vec<ring::Step>,
    ) -> Result<()> {
        let bytes = std::mem::size_of_val(buf);
        match algorithm {
            Algorithm::Ring => ring::multiring(t, &[t.size()], 1, buf, recv, steps),
            Algorithm::Multiring { segments, .. } => {
                let segments = ring::segments_for(&self.dims, bytes, *segments);
                ring::multiring(t, &self.dims, segments, buf, recv, steps)
            }
            Algorithm::Rhd => rhd::allreduce(t, buf, recv),
            Algorithm::Multicolor { .. } => {
                let plan = self
                    .multicolor
                    .as_ref()
                    .expect("multicolor plan is built for multicolor and auto");
                multicolor::allreduce(t, plan, buf, recv)
            }
            Algorithm::Mpi => t.native_allreduce_f32(buf),
            Algorithm::Shm { .. } | Algorithm::Hierarchical { .. } | Algorithm::Auto => {
                unreachable!(
                    "shm and hierarchical run on their own paths and resolve never returns auto"
                )
            }
        }
    }
}

/// Checks a chunk size of `shm` or `hierarchical`.
fn check_shm_chunk(chunk_bytes: usize) -> Result<()> {
    if !(crate::shared_region::LINE..=MAX_SHM_CHUNK).contains(&chunk_bytes) {
        return Err(CommError::InvalidArgument(format!(
            "shm needs chunks of {} bytes to {MAX_SHM_CHUNK} bytes, got {chunk_bytes}",
            crate::shared_region::LINE
        )));
    }
    Ok(())
}

/// `buf[i] /= p` (the mean of a sum over `p` ranks).
fn divide(buf: &mut [f32], p: f32) {
    for v in buf.iter_mut() {
        *v /= p;
    }
}
