//! Node shared-memory allreduce: the ranks of one node meet in a [`SharedRegion`] instead of
//! sending messages.
//!
//! The buffer is processed in chunks of `chunk_bytes` per rank, each cut into one part per
//! rank. For each chunk every rank copies the parts the others sum into its input slot and
//! announces it; then each rank sums its own part over all ranks (its own values straight
//! from its buffer, the others' from their slots), in rank order, writing the sums into its
//! buffer and its result slot; then each rank copies the other ranks' sums into its buffer,
//! while the next chunk is being announced. Buffers of at most [`WHOLE_BYTES`] are summed
//! whole by every rank, in the same order, with one synchronisation per call.
//!
//! Every rank reads its buffer once and writes it once; the slots are small (two chunks per
//! rank), so they stay in the caches and the copies between ranks never reach memory. An
//! element's sum is computed by one rank in a fixed order (or by every rank in the same
//! order), so all ranks end bitwise identical. f16 and bf16 travel as themselves (half the
//! bytes of f32) and are summed in f32 and rounded once.
//!
//! The same chunks serve as the node stage of the hierarchical allreduce
//! ([`ShmAllreduce::allreduce_across`]): each rank's node sums of its part go between the
//! nodes (in f32) before the others copy them; small buffers are one part, the first rank's,
//! so that they cross the network once per node.
//!
//! Ranks synchronise through counters in their own segments (acquire / release atomics): how
//! many chunks each has announced and summed. Slots are reused every [`SLOTS`] chunks (see
//! [`ShmAllreduce::run`] for why one wait per chunk suffices). A waiting rank spins briefly
//! (not when the ranks outnumber the cores), then sleeps until the counter moves ([`Pace`]). It gives up with
//! [`CommError::Timeout`](crate::CommError::Timeout) naming the rank it waited for after the
//! transport's timeout, or with [`CommError::PeerExited`](crate::CommError::PeerExited) within
//! a tenth of a second once that rank's process has exited.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::call_check::agree;
use super::context::{Allreduce, Context};
use super::declare::{positive, Declare, Declared};
use super::element::{with_elements, Buffer, Element};
use super::signature::Signature;
use super::util::{part, Probed};
use crate::cost::{CostModel, DEFAULT_SHM_SYNC};
use crate::error::{CommError, Result};
use crate::shared_region::{Pace, SharedRegion, COUNTER_BYTES, LINE};
use crate::topology::Topology;
use crate::transport::Transport;

/// Buffers of at most this many bytes are summed whole by every rank (one synchronisation).
pub const WHOLE_BYTES: usize = 16 << 10;

/// Input and result slots per rank: chunk `j` uses slot `j % SLOTS`.
const SLOTS: usize = 2;

/// Parts of a chunk start at multiples of this many elements (128 bytes of f32).
const PART_ALIGN: usize = 32;

/// Elements summed per block of the reduction (the accumulator stays in L1).
const BLOCK: usize = 1024;

/// The counters of one rank (see [`SharedRegion::counter`]).
#[derive(Clone, Copy)]
enum Counter {
    /// Chunks whose input this rank has written.
    Announced = 0,
    /// Chunks whose own part this rank has summed into its result slot.
    Reduced = 1,
}

/// What a waiting rank reports in a timeout.
const OP: &str = "shm allreduce";

/// Where a call's [`Signature`] lies on the line of the `Announced` counter: one word per
/// slot parity of the call's first chunk, after the counter. Published with the counter, it
/// reaches the other ranks in the cache line they wait on anyway: the call check costs no
/// extra synchronisation.
const SIGNATURE_OFFSET: usize = 8;

/// The shared-memory allreduce of one group: the region and how far this rank has got.
pub(crate) struct ShmAllreduce {
    region: SharedRegion,
    chunk_bytes: usize,
    /// Bytes of each result slot.
    result_bytes: usize,
    /// Buffers of up to this many bytes are summed by rank 0 alone in the hierarchical node
    /// stage (0 for `shm`).
    leader_bytes: usize,
    /// How a waiting rank waits.
    pace: Pace,
    /// Chunks this rank has started over all calls (the counters' next targets).
    chunks_started: u64,
    /// Where the inputs of the chunk being summed start (reused: no allocation per call).
    inputs: Vec<usize>,
    /// This rank's node sums of its part, in f32, on their way between the nodes (reused).
    wide: Vec<f32>,
}

/// The stage between the nodes of the hierarchical allreduce: sums a rank's node sums (f32)
/// with its peers on the other nodes, in place.
pub(crate) type AcrossNodes<'a> = dyn FnMut(&mut [f32]) -> Result<()> + 'a;

/// How a chunk is shared out among the ranks of the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Every rank sums all of it, in the same order (one synchronisation per chunk).
    Whole,
    /// Each rank sums one part ([`aligned_part`]) and the others copy its sums.
    Parts,
    /// Rank 0 sums all of it and the others copy its sums.
    Leader,
}

impl Mode {
    /// The elements of a chunk of `len` that rank `q` of `p` sums.
    fn part(self, len: usize, p: usize, q: usize) -> std::ops::Range<usize> {
        match self {
            Mode::Whole => 0..len,
            Mode::Parts => aligned_part(len, p, q),
            Mode::Leader if q == 0 => 0..len,
            Mode::Leader => len..len,
        }
    }
}

impl std::fmt::Debug for ShmAllreduce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmAllreduce")
            .field("chunk_bytes", &self.chunk_bytes)
            .field("chunks_started", &self.chunks_started)
            .finish()
    }
}

/// Elements of part `i` of a chunk of `len` elements cut into `p` parts that start at
/// multiples of [`PART_ALIGN`].
fn aligned_part(len: usize, p: usize, i: usize) -> std::ops::Range<usize> {
    let units = part(&(0..len.div_ceil(PART_ALIGN)), p, i);
    (units.start * PART_ALIGN).min(len)..(units.end * PART_ALIGN).min(len)
}

impl ShmAllreduce {
    /// Collective over `t`: the shared region for chunks of `chunk_bytes` per rank, or
    /// `None` when the ranks do not all share one node's memory. With `leader_bytes`, the
    /// hierarchical node stage ([`ShmAllreduce::allreduce_across`]) sums buffers of up to that
    /// many bytes (and at most a chunk) on rank 0 alone, so its result slots hold them.
    pub(crate) fn create(
        t: &dyn Transport,
        chunk_bytes: usize,
        leader_bytes: usize,
    ) -> Result<Option<ShmAllreduce>> {
        let chunk_bytes = chunk_bytes.max(LINE).div_ceil(LINE) * LINE;
        let leader_bytes = leader_bytes.min(chunk_bytes);
        // The largest part of a chunk, whatever the element size, or a leader's whole buffer.
        let result_bytes = ((chunk_bytes / LINE).div_ceil(t.size()) * LINE).max(leader_bytes);
        let segment = COUNTER_BYTES + SLOTS * (chunk_bytes + result_bytes);
        let pace = Pace::of(t)?;
        Ok(
            SharedRegion::create(t, segment)?.map(|region| ShmAllreduce {
                region,
                chunk_bytes,
                result_bytes,
                leader_bytes,
                pace,
                chunks_started: 0,
                inputs: Vec::with_capacity(t.size()),
                wide: Vec::new(),
            }),
        )
    }

    fn input<T>(&self, q: usize, slot: usize) -> *mut T {
        // SAFETY: within rank q's segment (see `create`).
        unsafe {
            self.region
                .segment(q)
                .add(COUNTER_BYTES + slot * self.chunk_bytes)
                .cast()
        }
    }

    fn result<T>(&self, q: usize, slot: usize) -> *mut T {
        // SAFETY: within rank q's segment (see `create`).
        unsafe {
            self.region
                .segment(q)
                .add(COUNTER_BYTES + SLOTS * self.chunk_bytes + slot * self.result_bytes)
                .cast()
        }
    }

    /// Rank `q`'s signature word for the call whose first chunk is `j`.
    fn signature(&self, q: usize, j: u64) -> &AtomicU64 {
        let at = Counter::Announced as usize * LINE + SIGNATURE_OFFSET + 8 * (j % 2) as usize;
        // SAFETY: within the first half of the counter's line, zero-initialised, only
        // accessed atomically.
        unsafe { &*self.region.segment(q).add(at).cast::<AtomicU64>() }
    }

    /// Every rank's call whose first chunk is `j`, once all have announced it: `Ok` when they
    /// agree with `mine`. A rank rewrites this word only for chunk j + 2, which it starts
    /// after every rank announced j + 1, that is after every rank read it.
    fn agree_at(&self, t: &dyn Transport, j: u64) -> Result<()> {
        let word = |q: usize| self.signature(q, j).load(Ordering::Relaxed);
        let mine = word(t.rank());
        if (0..t.size()).all(|q| word(q) == mine) {
            return Ok(());
        }
        let calls: Option<Vec<Signature>> = (0..t.size())
            .map(|q| Signature::from_word(word(q)))
            .collect();
        match calls {
            Some(calls) => agree(t.rank(), calls),
            None => Err(CommError::InvalidArgument(format!(
                "shm allreduce on rank {}: a rank announced chunk {j} without its call",
                t.rank()
            ))),
        }
    }

    /// The call check alone, for a call that runs another algorithm or has no elements
    /// (`auto` and empty buffers): one chunk's announcement, with no data.
    pub(crate) fn check(&mut self, t: &dyn Transport, mine: Signature) -> Result<()> {
        let j = self.chunks_started;
        self.chunks_started += 1;
        self.signature(t.rank(), j)
            .store(mine.to_word(), Ordering::Relaxed);
        self.publish(t.rank(), Counter::Announced, j + 1);
        self.wait_all(t, Counter::Announced, j + 1)?;
        self.agree_at(t, j)
    }

    /// Sets this rank's counter `c` to `value` and wakes the ranks sleeping on it.
    fn publish(&self, me: usize, c: Counter, value: u64) {
        self.region.publish(me, c as usize, value);
    }

    /// Waits until every rank's counter `c` reaches `target`.
    fn wait_all(&self, t: &dyn Transport, c: Counter, target: u64) -> Result<()> {
        self.region
            .wait_all(t, 0..t.size(), c as usize, target, self.pace, OP)
    }

    /// Copies the other ranks' sums of chunk `j` (rank q's part, from its result slot) into
    /// `chunk`.
    fn copy_out<T: Element>(&self, mode: Mode, p: usize, me: usize, j: u64, chunk: &mut [T]) {
        let slot = (j % SLOTS as u64) as usize;
        for q in (0..p).filter(|&q| q != me) {
            let r = mode.part(chunk.len(), p, q);
            // SAFETY: rank q has published `Reduced` for chunk j, so its result slot holds
            // the sums of its part, and rewrites it only after this rank announces j + 2.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.result::<T>(q, slot).cast_const(),
                    chunk[r.clone()].as_mut_ptr(),
                    r.len(),
                )
            };
        }
    }

    /// Sums `buf` over all ranks of `t` in place (divided by the rank count with `average`),
    /// after checking that every rank passed the same element count and type.
    pub(crate) fn allreduce<T: Element>(
        &mut self,
        t: &dyn Transport,
        buf: &mut [T],
        average: bool,
    ) -> Result<()> {
        let mine = Signature::new(T::DTYPE, buf.len());
        if buf.is_empty() {
            return self.check(t, mine);
        }
        let mode = if std::mem::size_of_val(buf) <= WHOLE_BYTES {
            Mode::Whole
        } else {
            Mode::Parts
        };
        let scale = average.then_some(t.size() as f32);
        self.run(t, buf, mode, scale, Some(mine), None)
    }

    /// The node stage of the hierarchical allreduce: sums `buf` over the ranks of `t` (one
    /// node) part by part, passes each rank's node sums of its part, in f32, to `across`
    /// (which sums them between the nodes, in place), divides them by `scale` if given and
    /// hands them back to every rank of `t`. Buffers of at most the region's `leader_bytes`
    /// are one part, rank 0's; the other ranks' parts are empty and `across` is not called
    /// for them. Every rank must call it with the same length.
    pub(crate) fn allreduce_across<T: Element>(
        &mut self,
        t: &dyn Transport,
        buf: &mut [T],
        scale: Option<f32>,
        across: &mut AcrossNodes<'_>,
    ) -> Result<()> {
        let mode = if std::mem::size_of_val(buf) <= self.leader_bytes {
            Mode::Leader
        } else {
            Mode::Parts
        };
        self.run(t, buf, mode, scale, None, Some(across))
    }

    /// Runs the chunks of `buf` through the region (see [`Mode`]): summed over the ranks,
    /// through `across` if given, divided by `scale` if given. With `check`, the first chunk
    /// carries this rank's call and nothing is summed unless all ranks' agree.
    ///
    /// Chunk j uses slot j % 2. A rank consumes what chunk j put in the slots (the inputs it
    /// sums, the others' sums it copies out) before it announces chunk j + 2, and rewrites
    /// its slots of chunk j only once every rank has announced j + 1 (inputs) or j + 2
    /// (sums): so one wait per chunk suffices, and copying out chunk j - 1 overlaps the
    /// other ranks' copying in of chunk j.
    fn run<T: Element>(
        &mut self,
        t: &dyn Transport,
        buf: &mut [T],
        mode: Mode,
        scale: Option<f32>,
        mut check: Option<Signature>,
        mut across: Option<&mut AcrossNodes<'_>>,
    ) -> Result<()> {
        let (p, me) = (t.size(), t.rank());
        let chunk_elems = self.chunk_bytes / std::mem::size_of::<T>();
        let mut pending: Option<&mut [T]> = None;
        for chunk in buf.chunks_mut(chunk_elems) {
            let j = self.chunks_started;
            self.chunks_started += 1;
            if let Some(mine) = check {
                self.signature(me, j)
                    .store(mine.to_word(), Ordering::Relaxed);
            }
            let slot = (j % SLOTS as u64) as usize;
            let len = chunk.len();
            // Whole: every rank needs all of the chunk, which it copies once. Otherwise the
            // others need only the parts they sum; this rank sums its own part straight from
            // its buffer.
            for q in 0..p {
                let r = match mode {
                    Mode::Whole if q > 0 => break,
                    Mode::Whole => 0..len,
                    _ if q == me => continue,
                    _ => mode.part(len, p, q),
                };
                // SAFETY: the slot holds chunk_bytes >= len elements, which every rank has
                // consumed (it announced j - 1 since).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        chunk[r.clone()].as_ptr(),
                        self.input::<T>(me, slot).add(r.start),
                        r.len(),
                    )
                };
            }
            self.publish(me, Counter::Announced, j + 1);
            if let Some(prev) = pending.take() {
                self.wait_all(t, Counter::Reduced, j)?;
                self.copy_out(mode, p, me, j - 1, prev);
            }
            self.wait_all(t, Counter::Announced, j + 1)?;
            if check.take().is_some() {
                self.agree_at(t, j)?;
            }
            let out = chunk.as_mut_ptr();
            let mut inputs = std::mem::take(&mut self.inputs);
            inputs.clear();
            inputs.extend((0..p).map(|q| {
                if mode == Mode::Whole || q != me {
                    self.input::<u8>(q, slot) as usize
                } else {
                    out as usize
                }
            }));
            let mine = mode.part(len, p, me);
            let result = self.result::<T>(me, slot);
            let store = |acc: &mut [f32], at: usize| {
                if let Some(s) = scale {
                    super::util::divide(acc, s);
                }
                // SAFETY: `out` holds the chunk; the result slot holds any part and every
                // rank has consumed its previous contents (they announced j).
                unsafe {
                    T::narrow(acc, std::slice::from_raw_parts_mut(out.add(at), acc.len()));
                    if mode != Mode::Whole {
                        let slot = result.add(at - mine.start);
                        T::narrow(acc, std::slice::from_raw_parts_mut(slot, acc.len()));
                    }
                }
            };
            match across.as_deref_mut() {
                Some(across) if !mine.is_empty() => {
                    let mut wide = std::mem::take(&mut self.wide);
                    wide.resize(mine.len(), 0.0);
                    // SAFETY: every input holds this chunk's elements, unchanged until this
                    // rank announces j + 1; this rank's own part is read from `out` before
                    // anything is written to it.
                    unsafe {
                        reduce::<T>(&inputs, mine.clone(), |acc, at| {
                            wide[at - mine.start..][..acc.len()].copy_from_slice(acc)
                        })
                    };
                    let crossed = across(&mut wide);
                    if crossed.is_ok() {
                        store(&mut wide, mine.start);
                    }
                    self.wide = wide;
                    crossed?;
                }
                // SAFETY: as above; each block of the own part is read whole before its sums
                // are written.
                _ => unsafe { reduce::<T>(&inputs, mine.clone(), store) },
            }
            self.inputs = inputs;
            if mode == Mode::Whole {
                continue;
            }
            self.publish(me, Counter::Reduced, j + 1);
            pending = Some(chunk);
        }
        if let Some(last) = pending {
            let j = self.chunks_started;
            self.wait_all(t, Counter::Reduced, j)?;
            self.copy_out(mode, p, me, j - 1, last);
        }
        Ok(())
    }
}

/// Sums elements `range` of every input (given as the address of its element 0) in input
/// order, in f32, block by block, handing each block's sums and the index of its first element
/// to `store`. An input may be where `store` writes: each block is read whole before `store`
/// sees it.
///
/// # Safety
/// Every input must hold at least `range.end` elements that nobody else writes meanwhile.
unsafe fn reduce<T: Element>(
    inputs: &[usize],
    range: std::ops::Range<usize>,
    mut store: impl FnMut(&mut [f32], usize),
) {
    let mut acc = [0f32; BLOCK];
    let mut start = range.start;
    while start < range.end {
        let n = BLOCK.min(range.end - start);
        let acc = &mut acc[..n];
        let input = |q: usize| std::slice::from_raw_parts((inputs[q] as *const T).add(start), n);
        T::widen(input(0), acc);
        for q in 1..inputs.len() {
            T::add_to(acc, input(q));
        }
        store(acc, start);
        start += n;
    }
}

/// Largest chunk of the shared-memory algorithm (its region holds two per rank).
const MAX_SHM_CHUNK: usize = 64 << 20;

/// Checks a chunk size of `shm` or `hierarchical`.
pub(crate) fn check_chunk(chunk_bytes: usize) -> Result<()> {
    if !(LINE..=MAX_SHM_CHUNK).contains(&chunk_bytes) {
        return Err(CommError::InvalidArgument(format!(
            "shm needs chunks of {LINE} bytes to {MAX_SHM_CHUNK} bytes, got {chunk_bytes}"
        )));
    }
    Ok(())
}

/// The shared-memory allreduce's parameters ([`crate::Algorithm::Shm`]): every rank copies
/// chunks of `chunk_bytes` into a region all ranks map, sums its share of each chunk there and
/// copies the others' sums back (all ranks on one node only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shm {
    /// Chunk per rank, in bytes.
    pub chunk_bytes: usize,
}

impl Shm {
    /// Chunks of 512 KiB per rank.
    pub const DEFAULT: Shm = Shm {
        chunk_bytes: 512 << 10,
    };
}

impl Default for Shm {
    fn default() -> Shm {
        Shm::DEFAULT
    }
}

impl Declare for Shm {
    const DECLARED: Declared = Declared {
        name: "shm",
        syntax: "shm[:CHUNK_BYTES]",
        help: "the ranks of one node meet in a small shared-memory region that nothing \
               outlives (all ranks on one node)",
        auto: true,
    };

    fn parse(args: Option<&str>) -> Result<Shm> {
        Ok(match args {
            None => Shm::DEFAULT,
            Some(c) => Shm {
                chunk_bytes: positive(c, "chunk bytes")?,
            },
        })
    }

    fn args(&self) -> Option<String> {
        (*self != Shm::DEFAULT).then(|| self.chunk_bytes.to_string())
    }

    fn build(&self) -> Box<dyn Allreduce> {
        Box::new(ShmRun::new(*self))
    }

    /// Where all ranks are on one node and share its memory.
    fn auto_here(topo: Topology, shared_memory: bool, _: bool) -> bool {
        shared_memory && topo.nodes == 1
    }
}

/// The shared-memory allreduce as it runs: its chunks, through the region its first call
/// probes (collectively).
pub(crate) struct ShmRun {
    chunk_bytes: usize,
    region: Mutex<Probed<ShmAllreduce>>,
}

impl ShmRun {
    /// As `params` says (checked by [`Allreduce::prepare`]).
    pub(crate) fn new(params: Shm) -> ShmRun {
        ShmRun {
            chunk_bytes: params.chunk_bytes,
            region: Mutex::new(Probed::NotYet),
        }
    }

    /// `f` of the region of the ranks of `t`, probed on first use: `None` when they do not
    /// share one node's memory.
    pub(crate) fn with_region<R>(
        &self,
        t: &dyn Transport,
        f: impl FnOnce(Option<&mut ShmAllreduce>) -> Result<R>,
    ) -> Result<R> {
        let mut region = self.region.lock().unwrap_or_else(|e| e.into_inner());
        f(region.get_or_probe(|| ShmAllreduce::create(t, self.chunk_bytes, 0))?)
    }

    /// Sums `buf` over the ranks of `t` in place (divided by their count with `average`),
    /// after the call check.
    pub(crate) fn run<T: Element>(
        &self,
        t: &dyn Transport,
        buf: &mut [T],
        average: bool,
    ) -> Result<()> {
        self.with_region(t, |region| match region {
            Some(shm) => shm.allreduce(t, buf, average),
            None => Err(CommError::Unsupported(
                "the shm algorithm needs every rank on one node, with a writable /dev/shm".into(),
            )),
        })
    }
}

impl Allreduce for ShmRun {
    fn prepare(&mut self, cx: &Context) -> Result<()> {
        if cx.topology.nodes > 1 {
            return Err(CommError::Unsupported(format!(
                "shm needs every rank on one node; the topology has {} nodes",
                cx.topology.nodes
            )));
        }
        check_chunk(self.chunk_bytes)
    }

    /// The call check always runs, in the first synchronisation (it costs nothing there).
    fn allreduce(
        &self,
        cx: &Context,
        buf: Buffer<'_>,
        average: bool,
        _: Option<Signature>,
    ) -> Result<()> {
        with_elements!(buf, b => self.run(&*cx.transport, b, average))
    }

    fn predict(&self, model: &CostModel, bytes: usize, topo: Topology) -> f64 {
        model.shm_time(self.chunk_bytes, bytes as f64, topo)
    }
}

/// The shared-memory allreduce's cost formula (`shm`'s, and `hierarchical`'s node stage).
impl CostModel {
    /// Seconds of the shared-memory allreduce in chunks of `chunk_bytes` per rank where it was
    /// not measured (infinite across nodes, where it cannot run): one synchronisation per
    /// chunk plus copying the others' parts in, summing the rank's part over all ranks and
    /// copying the other parts out.
    pub(crate) fn shm_time(&self, chunk_bytes: usize, n: f64, topo: Topology) -> f64 {
        if topo.nodes > 1 {
            return f64::INFINITY;
        }
        let p = topo.ranks() as f64;
        let sync = if self.shm_sync > 0.0 {
            self.shm_sync
        } else {
            DEFAULT_SHM_SYNC
        };
        let (copy, gamma) = (self.copy_per_byte(), self.intra.gamma);
        if n <= WHOLE_BYTES as f64 {
            return sync + n * copy + (p - 1.0) * n * gamma;
        }
        let chunks = (n / chunk_bytes.max(1) as f64).ceil();
        sync * chunks + (p - 1.0) / p * n * (2.0 * copy + gamma)
    }
}
