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
//! Ranks synchronise through counters in their own segments (acquire / release atomics): how
//! many chunks each has announced and summed. Slots are reused every [`SLOTS`] chunks (see
//! [`ShmAllreduce::allreduce`] for why one wait per chunk suffices). A waiting rank spins
//! briefly, then yields its core. When the ranks outnumber the cores it does not spin, and
//! after [`YIELDS`] yields it sleeps on the counter (a futex in the shared region, woken by
//! the rank that publishes it): yielding ranks keep their cores busy, so the kernel never
//! moves a rank with work onto them, and on 2 cores a run of 3 or 4 ranks could fall into
//! rounds 4x slower. It gives up with [`CommError::Timeout`] naming the rank it waited for
//! after the transport's timeout.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

use super::util::part;
use super::Element;
use crate::error::{CommError, Result};
use crate::shm::{SharedRegion, LINE};
use crate::transport::Transport;

/// Default chunk per rank, in bytes.
pub const DEFAULT_CHUNK_BYTES: usize = 512 << 10;

/// Buffers of at most this many bytes are summed whole by every rank (one synchronisation).
pub const WHOLE_BYTES: usize = 16 << 10;

/// Input and result slots per rank: chunk `j` uses slot `j % SLOTS`.
const SLOTS: usize = 2;

/// Parts of a chunk start at multiples of this many elements (128 bytes of f32).
const PART_ALIGN: usize = 32;

/// Elements summed per block of the reduction (the accumulator stays in L1).
const BLOCK: usize = 1024;

/// Polls of a counter before a waiting rank starts yielding its core, while every rank has a
/// core of its own. When the ranks outnumber the cores a waiting rank yields at once: its
/// spinning would take the core from a rank that has work to do.
const SPINS: u32 = 128;

/// Yields of a waiting rank before it sleeps on the counter, when the ranks outnumber the
/// cores. Measured at 3 and 4 ranks on 2 cores (1-16 MiB): 4 or 64 yields made every call
/// pay wake-ups (1 MiB at 4 ranks: 340-450 us), 1024 let half of the runs fall into rounds of
/// yielding ranks (850-870 us), 256 kept all runs at 200-250 us.
const YIELDS: u32 = 256;

/// Longest sleep on a counter before the waiting rank looks again (and checks its timeout).
const SLEEP: std::time::Duration = std::time::Duration::from_millis(5);

/// The counters of one rank, each on its own line of its segment (the counter in the first
/// half, how many ranks sleep on it in the second).
#[derive(Clone, Copy)]
enum Counter {
    /// Chunks whose input this rank has written.
    Announced = 0,
    /// Chunks whose own part this rank has summed into its result slot.
    Reduced = 1,
}

/// Bytes of the counter lines at the start of every segment.
const COUNTER_BYTES: usize = 2 * LINE;

/// The shared-memory allreduce of one group: the region and how far this rank has got.
pub(crate) struct ShmAllreduce {
    region: SharedRegion,
    chunk_bytes: usize,
    result_bytes: usize,
    /// Polls before yielding ([`SPINS`], or 0 when the ranks outnumber the cores).
    spins: u32,
    /// Whether a waiting rank goes to sleep after [`YIELDS`] yields (the ranks outnumber
    /// the cores).
    sleep: bool,
    /// Chunks this rank has started over all calls (the counters' next targets).
    chunks_started: u64,
    /// Where the inputs of the chunk being summed start (reused: no allocation per call).
    inputs: Vec<usize>,
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
    /// `None` when the ranks do not all share one node's memory.
    pub(crate) fn create(t: &dyn Transport, chunk_bytes: usize) -> Result<Option<ShmAllreduce>> {
        let chunk_bytes = chunk_bytes.max(LINE).div_ceil(LINE) * LINE;
        // The largest part of a chunk, whatever the element size.
        let result_bytes = (chunk_bytes / LINE).div_ceil(t.size()) * LINE;
        let segment = COUNTER_BYTES + SLOTS * (chunk_bytes + result_bytes);
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        let oversubscribed = t.size() > cores;
        let spins = if oversubscribed { 0 } else { SPINS };
        Ok(
            SharedRegion::create(t, segment)?.map(|region| ShmAllreduce {
                region,
                chunk_bytes,
                result_bytes,
                spins,
                sleep: oversubscribed,
                chunks_started: 0,
                inputs: Vec::with_capacity(t.size()),
            }),
        )
    }

    fn counter(&self, q: usize, c: Counter) -> &AtomicU64 {
        // SAFETY: counters lie at the start of every segment, LINE-aligned, zero-initialised,
        // and are only ever accessed atomically.
        unsafe {
            &*self
                .region
                .segment(q)
                .add(c as usize * LINE)
                .cast::<AtomicU64>()
        }
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

    /// How many ranks sleep on counter `c` of rank `q` (the line's second half).
    fn sleepers(&self, q: usize, c: Counter) -> &AtomicU32 {
        // SAFETY: the second half of the counter's line, zero-initialised, only accessed
        // atomically.
        unsafe {
            &*self
                .region
                .segment(q)
                .add(c as usize * LINE + LINE / 2)
                .cast::<AtomicU32>()
        }
    }

    /// Sets this rank's counter `c` to `value` and wakes the ranks sleeping on it.
    fn publish(&self, me: usize, c: Counter, value: u64) {
        let counter = self.counter(me, c);
        counter.store(value, Ordering::SeqCst);
        if self.sleepers(me, c).load(Ordering::SeqCst) > 0 {
            futex_wake(counter);
        }
    }

    /// Waits until every rank's counter `c` reaches `target`: spinning, then yielding the
    /// core, then (when the ranks outnumber the cores) sleeping on the counter, so that a
    /// waiting rank leaves its core to the ranks with work to do.
    fn wait_all(&self, t: &dyn Transport, c: Counter, target: u64) -> Result<()> {
        let mut polls = 0u32;
        let mut since: Option<Instant> = None;
        for q in 0..t.size() {
            let counter = self.counter(q, c);
            while counter.load(Ordering::Acquire) < target {
                polls = polls.wrapping_add(1);
                if polls < self.spins {
                    std::hint::spin_loop();
                    continue;
                }
                if self.sleep && polls >= self.spins + YIELDS {
                    let sleepers = self.sleepers(q, c);
                    sleepers.fetch_add(1, Ordering::SeqCst);
                    let seen = counter.load(Ordering::SeqCst);
                    if seen < target {
                        futex_wait(counter, seen);
                    }
                    sleepers.fetch_sub(1, Ordering::SeqCst);
                } else {
                    std::thread::yield_now();
                }
                if polls % 16 == 0 {
                    let start = *since.get_or_insert_with(Instant::now);
                    if start.elapsed() > t.timeout() {
                        return Err(CommError::Timeout {
                            op: "shm allreduce",
                            rank: t.rank(),
                            peer: Some(q),
                            timeout: t.timeout(),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// Copies the other ranks' sums of chunk `j` (rank q's part, from its result slot) into
    /// `chunk`.
    fn copy_out<T: Element>(&self, p: usize, me: usize, j: u64, chunk: &mut [T]) {
        let slot = (j % SLOTS as u64) as usize;
        for q in (0..p).filter(|&q| q != me) {
            let r = aligned_part(chunk.len(), p, q);
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

    /// Sums `buf` over all ranks of `t` in place (divided by the rank count with `average`).
    /// Every rank must call it with the same length.
    ///
    /// Chunk j uses slot j % 2. A rank consumes what chunk j put in the slots (the inputs it
    /// sums, the others' sums it copies out) before it announces chunk j + 2, and rewrites
    /// its slots of chunk j only once every rank has announced j + 1 (inputs) or j + 2
    /// (sums): so one wait per chunk suffices, and copying out chunk j - 1 overlaps the
    /// other ranks' copying in of chunk j.
    pub(crate) fn allreduce<T: Element>(
        &mut self,
        t: &dyn Transport,
        buf: &mut [T],
        average: bool,
    ) -> Result<()> {
        let (p, me) = (t.size(), t.rank());
        let whole = std::mem::size_of_val(buf) <= WHOLE_BYTES;
        let scale = average.then_some(p as f32);
        let chunk_elems = self.chunk_bytes / std::mem::size_of::<T>();
        let mut pending: Option<&mut [T]> = None;
        for chunk in buf.chunks_mut(chunk_elems) {
            let j = self.chunks_started;
            self.chunks_started += 1;
            let slot = (j % SLOTS as u64) as usize;
            let len = chunk.len();
            // Whole: every rank needs all of the chunk. Otherwise the others need only the
            // parts they sum; this rank sums its own part straight from its buffer.
            let shared = |q: usize| whole || q != me;
            for q in (0..p).filter(|&q| shared(q)) {
                let r = if whole {
                    0..len
                } else {
                    aligned_part(len, p, q)
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
                if whole {
                    break;
                }
            }
            self.publish(me, Counter::Announced, j + 1);
            if let Some(prev) = pending.take() {
                self.wait_all(t, Counter::Reduced, j)?;
                self.copy_out(p, me, j - 1, prev);
            }
            self.wait_all(t, Counter::Announced, j + 1)?;
            let out = chunk.as_mut_ptr();
            let mut inputs = std::mem::take(&mut self.inputs);
            inputs.clear();
            inputs.extend((0..p).map(|q| {
                if shared(q) {
                    self.input::<u8>(q, slot) as usize
                } else {
                    out as usize
                }
            }));
            if whole {
                // SAFETY: every input slot holds this chunk's `len` elements, unchanged until
                // this rank announces j + 1.
                unsafe { reduce(&inputs, 0..len, out, None, scale) };
            } else {
                // SAFETY: as above; this rank's own part is read from `out` block by block
                // before the block's sums are written; the result slot holds any part and
                // every rank has consumed its previous contents (they announced j).
                let mine = aligned_part(len, p, me);
                unsafe { reduce(&inputs, mine, out, Some(self.result::<T>(me, slot)), scale) };
                self.publish(me, Counter::Reduced, j + 1);
                pending = Some(chunk);
            }
            self.inputs = inputs;
        }
        if let Some(last) = pending {
            let j = self.chunks_started;
            self.wait_all(t, Counter::Reduced, j)?;
            self.copy_out(p, me, j - 1, last);
        }
        Ok(())
    }
}

/// Sums elements `range` of every input (given as the address of its element 0) in input
/// order, in f32, divides by `scale` if given, and writes the result into `out[range]` and,
/// if given, to `result[..range.len()]`.
/// An input may be `out` itself: each block is read whole before its sums are written.
///
/// # Safety
/// Every input and `out` must hold at least `range.end` elements that nobody else writes
/// meanwhile, and `result` must hold `range.len()` elements that nobody else accesses.
unsafe fn reduce<T: Element>(
    inputs: &[usize],
    range: std::ops::Range<usize>,
    out: *mut T,
    result: Option<*mut T>,
    scale: Option<f32>,
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
        if let Some(s) = scale {
            for v in acc.iter_mut() {
                *v /= s;
            }
        }
        T::narrow(acc, std::slice::from_raw_parts_mut(out.add(start), n));
        if let Some(result) = result {
            T::narrow(
                acc,
                std::slice::from_raw_parts_mut(result.add(start - range.start), n),
            );
        }
        start += n;
    }
}

/// The futex word of `counter`: its low 32 bits.
fn futex_word(counter: &AtomicU64) -> *mut u32 {
    let low = usize::from(cfg!(target_endian = "big"));
    // SAFETY: within the counter's 8 bytes.
    unsafe { counter.as_ptr().cast::<u32>().add(low) }
}

/// Sleeps while the low 32 bits of `counter` still equal those of `seen` (at most [`SLEEP`]);
/// returns early on a wake-up, a signal or a changed value (the caller looks again). Not
/// `FUTEX_PRIVATE`: the ranks are processes sharing the region.
fn futex_wait(counter: &AtomicU64, seen: u64) {
    let timeout = libc::timespec {
        tv_sec: 0,
        tv_nsec: SLEEP.as_nanos() as libc::c_long,
    };
    // SAFETY: the futex word lies within the counter, valid for the call; the kernel only
    // reads it.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            futex_word(counter),
            libc::FUTEX_WAIT,
            seen as u32,
            &timeout as *const libc::timespec,
            std::ptr::null::<u32>(),
            0,
        );
    }
}

/// Wakes every rank sleeping on `counter` ([`futex_wait`]).
fn futex_wake(counter: &AtomicU64) {
    // SAFETY: as in `futex_wait`.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            futex_word(counter),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0,
        );
    }
}
