//! How the allreduce and the compute slow each other where they share the cores (CPU
//! replicas): measured by [`crate::calibrate`] with stand-ins for the replicas, used by
//! `ddl-bench sim`'s schedule ([`crate::timeline`]) to predict a step on such a cluster.
//!
//! The slowdowns are what a step feels of the sharing: an allreduce waits for its threads to
//! be scheduled between hops (most of the time of a tiny one, as `priority`'s negotiation
//! rounds are), and takes cycles from the compute beside it. With GPU replicas they are 1
//! ([`Contention::SEPARATE`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use ddl_comm::calibrate::median;
use ddl_comm::collective::max_on_root;
use ddl_comm::cores::{lower_thread_priority, COMPUTE_NICE};
use ddl_comm::{Allreducer, Result, Transport};

/// The slowdowns of the allreduce and the compute running at once on shared cores.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Contention {
    /// A bucket's allreduce time while every rank's compute threads run, over its time alone.
    pub comm_slowdown: f64,
    /// The same for an allreduce of a few floats, the size of a negotiation round
    /// ([`ROUND_BYTES`]): its time is the hops' latency, which the sharing stretches most.
    #[serde(default = "no_slowdown")]
    pub round_slowdown: f64,
    /// The compute's time for the same work while an allreduce runs, over its time alone.
    pub compute_slowdown: f64,
    /// Compute threads per rank it was measured with (0: not measured).
    pub compute_threads: usize,
}

impl Default for Contention {
    fn default() -> Self {
        Contention::SEPARATE
    }
}

impl Contention {
    /// Compute and communication on resources of their own (GPU replicas, presets).
    pub const SEPARATE: Contention = Contention {
        comm_slowdown: 1.0,
        round_slowdown: 1.0,
        compute_slowdown: 1.0,
        compute_threads: 0,
    };

    /// Whether this was measured (a model from `calibrate` with compute threads).
    pub fn measured(&self) -> bool {
        self.compute_threads > 0
    }
}

/// A slowdown of 1, for model files written before it was measured.
fn no_slowdown() -> f64 {
    1.0
}

/// Bytes of the tiny allreduce timed for [`Contention::round_slowdown`]: a negotiation round's
/// flags for a dozen buckets.
pub const ROUND_BYTES: usize = 64;

/// Calls of that allreduce per phase.
const ROUND_CALLS: usize = 100;

/// Floats of the stand-in's working set: 256 KiB, in the caches, like a convolution's tile.
const UNIT_FLOATS: usize = 64 << 10;

/// The shortest phase timed: a time slice of the scheduler is a few milliseconds.
const MIN_PHASE: Duration = Duration::from_millis(300);

/// Stand-ins for a rank's replicas: `threads` threads doing multiply-adds over a cached buffer
/// until dropped, counting the units of work done, at the replicas' nice value when they
/// yield to the communication.
struct ComputeLoad {
    done: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl ComputeLoad {
    fn start(threads: usize, yield_to_comm: bool) -> ComputeLoad {
        let done = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..threads)
            .map(|_| {
                let (done, stop) = (done.clone(), stop.clone());
                std::thread::spawn(move || {
                    if yield_to_comm {
                        // Without it the measurement is of replicas that do not yield.
                        let _ = lower_thread_priority(COMPUTE_NICE);
                    }
                    let mut buf = vec![1.0f32; UNIT_FLOATS];
                    while !stop.load(Ordering::Relaxed) {
                        for x in buf.iter_mut() {
                            *x = x.mul_add(0.999, 0.001);
                        }
                        std::hint::black_box(&mut buf);
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        ComputeLoad {
            done,
            stop,
            threads,
        }
    }

    /// Units of work done so far.
    fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }
}

impl Drop for ComputeLoad {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Seconds per call of `calls` allreduces of `buf` on this rank.
fn time_calls(ar: &Allreducer, buf: &mut [f32], calls: usize) -> Result<f64> {
    let start = Instant::now();
    for _ in 0..calls {
        ar.allreduce(buf, false)?;
    }
    Ok(start.elapsed().as_secs_f64() / calls as f64)
}

/// One pass: the allreduces alone (the bucket's, then the round's), the compute alone for as
/// long as the bucket's took, then each allreduce beside the compute (its rate counted during
/// the bucket's); the slowest rank's (comm, compute, round) slowdowns on rank 0.
fn pass(
    t: &dyn Transport,
    [ar, round]: [&Allreducer; 2],
    buf: &mut [f32],
    calls: usize,
    threads: usize,
    yield_to_comm: bool,
) -> Result<[f64; 3]> {
    let round_buf = &mut [0.0f32; ROUND_BYTES / 4];
    t.barrier()?;
    let alone = time_calls(ar, buf, calls)?;
    let round_alone = time_calls(round, round_buf, ROUND_CALLS)?;
    let load = ComputeLoad::start(threads, yield_to_comm);
    t.barrier()?;
    let (start, before) = (Instant::now(), load.done());
    std::thread::sleep(MIN_PHASE.max(Duration::from_secs_f64(alone * calls as f64)));
    let rate_alone = (load.done() - before) as f64 / start.elapsed().as_secs_f64();
    t.barrier()?;
    let (start, before) = (Instant::now(), load.done());
    let beside = time_calls(ar, buf, calls)?;
    let rate_beside = (load.done() - before) as f64 / start.elapsed().as_secs_f64();
    let round_beside = time_calls(round, round_buf, ROUND_CALLS)?;
    drop(load);
    let worst = max_on_root(
        t,
        &[
            beside / alone,
            rate_alone / rate_beside.max(1e-9),
            round_beside / round_alone,
        ],
    )?;
    Ok([worst[0], worst[1], worst[2]])
}

/// Measures [`Contention`] with `threads` compute threads per rank (at the replicas' nice
/// value with `yield_to_comm`), `ar`'s allreduce of `bytes` and `round`'s of
/// [`ROUND_BYTES`]: per pass the allreduces alone, the compute alone, then both (`calls`
/// bucket allreduces, [`ROUND_CALLS`] rounds per phase); the median of `passes`, each the
/// slowest rank's. Every rank of `t` must call this; rank 0 gets the figures.
pub fn measure(
    t: &dyn Transport,
    [ar, round]: [&Allreducer; 2],
    bytes: usize,
    calls: usize,
    threads: usize,
    yield_to_comm: bool,
    passes: usize,
) -> Result<Contention> {
    let mut buf = vec![0.0f32; (bytes / 4).max(1)];
    for _ in 0..2 {
        ar.allreduce(&mut buf, false)?;
        round.allreduce(&mut [0.0f32; ROUND_BYTES / 4], false)?;
    }
    let mut figures: [Vec<f64>; 3] = Default::default();
    for _ in 0..passes.max(1) {
        let pass = pass(
            t,
            [ar, round],
            &mut buf,
            calls.max(1),
            threads,
            yield_to_comm,
        )?;
        for (all, one) in figures.iter_mut().zip(pass) {
            all.push(one);
        }
    }
    let [comm, compute, round] = &mut figures;
    Ok(Contention {
        comm_slowdown: median(comm),
        round_slowdown: median(round),
        compute_slowdown: median(compute),
        compute_threads: threads,
    })
}
