//! The time of a data-parallel training step whose gradient allreduce overlaps the compute,
//! for `ddl-bench sim`: three streams simulated chunk by chunk over a few steps. Backward runs
//! the model's stages last first and hands each stage's buckets over as it ends; the allreduce
//! stream serves them in the order of a [`CommOrder`]; the next step's forward runs the stages
//! first to last. Under `fifo` the allreduce takes each bucket whole, as handed over, and the
//! next forward starts once every bucket is reduced. Under `priority` it takes the lowest
//! stage's ready bucket first, a chunk at a time (each after a negotiation round), and the
//! next forward starts each stage once that stage's own buckets are reduced, as ddl-train
//! and `ddl.dist.DistributedOptimizer` run them.
//!
//! The compute is one stream (a rank's replicas in step), and the allreduce times come from
//! the caller (the cost model's prediction per size), so what the simulation adds is the
//! schedule: how much of the allreduce the compute hides. Where the replicas compute on the
//! cores that run the communication (CPU replicas) the two streams slow each other while both
//! run, as the [`Contention`] measured by `calibrate` says; with GPU replicas neither does.

use ddl_comm::CommOrder;

use crate::contention::Contention;

/// One stage of a model in a simulated step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StageCost {
    /// Bytes of gradient its parameters hand over (its buckets).
    pub bytes: usize,
    /// Seconds of its forward pass.
    pub forward_s: f64,
    /// Seconds of its backward pass.
    pub backward_s: f64,
}

/// A simulated step in steady state, in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepTime {
    /// From one step's forward start to the next one's.
    pub step_s: f64,
    /// Forward and backward compute.
    pub compute_s: f64,
    /// The step's wait for the allreduce (`step_s - compute_s`): under `fifo` after backward,
    /// under `priority` in the forward, before the stages whose buckets are not reduced yet.
    pub exposed_s: f64,
    /// Time the allreduce stream is busy (negotiations included).
    pub allreduce_s: f64,
}

/// The steps simulated, and the first one whose time counts (the schedule settles after a
/// step or two).
const STEPS: usize = 8;
const SETTLED: usize = 3;

/// How the allreduce stream runs: `order`, buckets of at most `bucket_bytes` cut at stage
/// boundaries, `reduce(bytes)` the seconds of one allreduce, `negotiate_s` the round before
/// each `priority` chunk, and `contention` how it and the compute slow each other.
pub struct Streams<'a> {
    /// The order of the buckets.
    pub order: CommOrder,
    /// Largest bucket (a stage's bytes are cut into equal buckets no larger).
    pub bucket_bytes: usize,
    /// Seconds to allreduce a buffer of that many bytes.
    pub reduce: &'a dyn Fn(usize) -> f64,
    /// Seconds of one negotiation round (`priority`).
    pub negotiate_s: f64,
    /// While both streams run, the allreduce's work proceeds at `1 / comm_slowdown` of its
    /// speed, a negotiation round's at `1 / round_slowdown`, and the compute's at
    /// `1 / compute_slowdown` ([`Contention::SEPARATE`]: neither slows).
    pub contention: Contention,
}

/// One bucket of the simulated model: its stage and bytes.
struct Bucket {
    stage: usize,
    bytes: usize,
}

/// What the compute stream does next in a step.
#[derive(Clone, Copy)]
enum Op {
    /// Wait until every bucket is reduced (`fifo`).
    WaitAll,
    /// Wait until the buckets of this stage are reduced (`priority`).
    Wait(usize),
    /// A stage's forward.
    Forward(usize),
    /// A stage's backward; its buckets are handed over as it ends.
    Backward(usize),
}

/// A step's operations in the order the compute stream runs them.
fn step_ops(stages: usize, priority: bool) -> Vec<Op> {
    let mut ops = Vec::with_capacity(3 * stages + 1);
    if !priority {
        ops.push(Op::WaitAll);
    }
    for stage in 0..stages {
        if priority {
            ops.push(Op::Wait(stage));
        }
        ops.push(Op::Forward(stage));
    }
    ops.extend((0..stages).rev().map(Op::Backward));
    ops
}

/// An allreduce in flight: its negotiation round, then the allreduce itself.
#[derive(Clone, Copy)]
struct Chunk {
    bucket: usize,
    bytes: usize,
    /// Seconds of the round left at full speed (0 once done, and under `fifo`).
    round_s: f64,
    /// Seconds of the allreduce left at full speed.
    reduce_s: f64,
}

impl Chunk {
    /// The seconds of work left in the current part at full speed (the round until it is
    /// done, then the allreduce), and its slowdown beside the compute.
    fn part(&mut self, c: &Contention) -> (&mut f64, f64) {
        if self.round_s > 0.0 {
            (&mut self.round_s, c.round_slowdown)
        } else {
            (&mut self.reduce_s, c.comm_slowdown)
        }
    }
}

/// The allreduce stream: each bucket's bytes handed over and not yet reduced, the chunk in
/// flight, and the seconds it was busy.
struct Comm<'s, 'a> {
    streams: &'s Streams<'a>,
    buckets: Vec<Bucket>,
    left: Vec<usize>,
    chunk: Option<Chunk>,
    busy: f64,
}

impl Comm<'_, '_> {
    /// The buckets of `stage` handed over.
    fn hand_over(&mut self, stage: usize) {
        for (left, bucket) in self.left.iter_mut().zip(&self.buckets) {
            if bucket.stage == stage {
                *left = bucket.bytes;
            }
        }
    }

    /// Runs the chunk in flight for `dt` seconds at `rate` of its speed; `ends`: its current
    /// part (the round, or the allreduce and with it the chunk) is done.
    fn advance(&mut self, dt: f64, rate: f64, ends: bool) {
        let Some(mut c) = self.chunk else {
            return;
        };
        self.busy += dt;
        let (part, _) = c.part(&self.streams.contention);
        *part = if ends { 0.0 } else { *part - dt * rate };
        if c.reduce_s == 0.0 {
            self.left[c.bucket] -= c.bytes;
            self.chunk = None;
        } else {
            self.chunk = Some(c);
        }
    }

    /// Whether every bucket of `stage` (of all stages with `None`) is reduced.
    fn reduced(&self, stage: Option<usize>) -> bool {
        self.buckets
            .iter()
            .zip(&self.left)
            .all(|(b, &left)| left == 0 || stage.is_some_and(|s| s != b.stage))
    }

    /// When the stream is free, starts the allreduce the order picks among the buckets
    /// handed over: `fifo` the first one whole, `priority` a chunk of the lowest stage's after
    /// a negotiation round.
    fn start_next(&mut self) {
        if self.chunk.is_some() {
            return;
        }
        let mut pending = (0..self.buckets.len()).filter(|&b| self.left[b] > 0);
        let streams = self.streams;
        let (bucket, bytes, round_s) = match streams.order {
            CommOrder::Fifo => match pending.next() {
                Some(b) => (b, self.left[b], 0.0),
                None => return,
            },
            CommOrder::Priority { chunk_bytes } => {
                match pending.min_by_key(|&b| (self.buckets[b].stage, b)) {
                    Some(b) => (b, self.left[b].min(chunk_bytes.max(4)), streams.negotiate_s),
                    None => return,
                }
            }
        };
        self.chunk = Some(Chunk {
            bucket,
            bytes,
            round_s,
            reduce_s: (streams.reduce)(bytes).max(f64::MIN_POSITIVE),
        });
    }
}

/// The buckets of `stages` in hand-over order (the last stage's first), each stage's bytes
/// cut into equal buckets of at most `bucket_bytes`.
fn buckets(stages: &[StageCost], bucket_bytes: usize) -> Vec<Bucket> {
    let mut out = Vec::new();
    for (stage, s) in stages.iter().enumerate().rev() {
        let n = s.bytes.div_ceil(bucket_bytes.max(1));
        for i in 0..n {
            let bytes = s.bytes * (i + 1) / n - s.bytes * i / n;
            out.push(Bucket { stage, bytes });
        }
    }
    out
}

/// The steady-state step of `stages` (in forward order) with the allreduce run as `streams`
/// says (see the module doc): the two streams advance event by event, each at the speed the
/// contention leaves it while the other runs.
pub fn simulate(stages: &[StageCost], streams: &Streams<'_>) -> StepTime {
    let buckets = buckets(stages, streams.bucket_bytes);
    let mut comm = Comm {
        streams,
        left: vec![0; buckets.len()],
        buckets,
        chunk: None,
        busy: 0.0,
    };
    let ops = step_ops(stages.len(), streams.order != CommOrder::Fifo);
    // A stream's speed: slowed while the other one runs.
    let speed = |other_runs: bool, slowdown: f64| if other_runs { 1.0 / slowdown } else { 1.0 };
    let (mut t, mut op, mut work) = (0.0, 0, None::<f64>);
    let mut starts = Vec::with_capacity(STEPS);
    let mut busy_at = Vec::with_capacity(STEPS);
    while starts.len() < STEPS {
        // The compute stream passes the waits that are met and starts its next stage.
        while work.is_none() {
            match ops[op] {
                Op::WaitAll if comm.reduced(None) => op += 1,
                Op::Wait(stage) if comm.reduced(Some(stage)) => op += 1,
                Op::WaitAll | Op::Wait(_) => break,
                Op::Forward(stage) => {
                    if stage == 0 {
                        starts.push(t);
                        busy_at.push(comm.busy);
                    }
                    work = Some(stages[stage].forward_s);
                }
                Op::Backward(stage) => work = Some(stages[stage].backward_s),
            }
        }
        comm.start_next();
        let compute_rate = speed(comm.chunk.is_some(), streams.contention.compute_slowdown);
        let (part_s, part_slowdown) = comm.chunk.map_or((f64::INFINITY, 1.0), |mut c| {
            let (left, slowdown) = c.part(&streams.contention);
            (*left, slowdown)
        });
        let comm_rate = speed(work.is_some(), part_slowdown);
        let compute_end = work.map_or(f64::INFINITY, |w| w / compute_rate);
        let comm_end = part_s / comm_rate;
        let dt = compute_end.min(comm_end);
        assert!(dt.is_finite(), "a wait with nothing left to reduce is met");
        t += dt;
        comm.advance(dt, comm_rate, comm_end == dt);
        work = work.map(|w| w - dt * compute_rate);
        if compute_end == dt {
            work = None;
            if let Op::Backward(stage) = ops[op] {
                comm.hand_over(stage);
            }
            op = (op + 1) % ops.len();
        }
    }
    let steps = (STEPS - 1 - SETTLED) as f64;
    let step_s = (starts[STEPS - 1] - starts[SETTLED]) / steps;
    let compute_s: f64 = stages.iter().map(|s| s.forward_s + s.backward_s).sum();
    StepTime {
        step_s,
        compute_s,
        exposed_s: (step_s - compute_s).max(0.0),
        allreduce_s: (busy_at[STEPS - 1] - busy_at[SETTLED]) / steps,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(bytes: usize, forward_s: f64, backward_s: f64) -> StageCost {
        StageCost {
            bytes,
            forward_s,
            backward_s,
        }
    }

    /// 3 s per 100 bytes, no negotiation cost.
    fn linear(bytes: usize) -> f64 {
        bytes as f64 * 0.03
    }

    fn run(stages: &[StageCost], order: CommOrder) -> StepTime {
        let streams = Streams {
            order,
            bucket_bytes: 1000,
            reduce: &linear,
            negotiate_s: 0.0,
            contention: Contention::SEPARATE,
        };
        simulate(stages, &streams)
    }

    #[test]
    fn fifo_waits_for_the_whole_allreduce_after_backward() {
        // Forward 0-2, backward: stage 1 ends at 4, stage 0 at 6; its buckets are reduced
        // 4-7 and 7-10, and the next forward starts at 10.
        let stages = [stage(100, 1.0, 2.0), stage(100, 1.0, 2.0)];
        let fifo = run(&stages, CommOrder::Fifo);
        assert_eq!(fifo.step_s, 10.0);
        assert_eq!(fifo.exposed_s, 4.0);
        assert_eq!(fifo.allreduce_s, 6.0);
        // Whole buckets in the same order: priority gains nothing here.
        let whole = run(&stages, CommOrder::Priority { chunk_bytes: 1000 });
        assert_eq!(whole.step_s, 10.0);
    }

    #[test]
    fn priority_overlaps_the_next_forward_with_the_allreduce() {
        // A large last stage handed over early and a first stage handed over late: chunks of
        // the first stage overtake the last one's, and the next forward runs beside them.
        let stages = [
            stage(50, 1.0, 0.5),
            stage(50, 1.0, 1.0),
            stage(300, 1.0, 1.0),
        ];
        let fifo = run(&stages, CommOrder::Fifo);
        let priority = run(&stages, CommOrder::Priority { chunk_bytes: 25 });
        // 12 s of allreduce per step either way. fifo: forward (3 s) and the last stage's
        // backward (1 s), then the allreduce (12 s). priority: the allreduce runs from one
        // step's first hand-over on, the last stage's bucket (9 s of it) last, so only the
        // last stage's forward and backward (2 s) go without any.
        assert_eq!((fifo.allreduce_s, priority.allreduce_s), (12.0, 12.0));
        assert_eq!((fifo.step_s, priority.step_s), (16.0, 14.0));
        assert_eq!(priority.exposed_s, 14.0 - 5.5);
        // Without communication both are the compute.
        let free = [stage(0, 1.0, 2.0), stage(0, 1.0, 2.0)];
        for order in [CommOrder::Fifo, CommOrder::PRIORITY] {
            assert_eq!(run(&free, order).step_s, 6.0);
        }
    }

    #[test]
    fn streams_sharing_the_cores_slow_each_other_while_both_run() {
        // As in the fifo test, but the allreduce runs at half its speed beside the compute
        // and the compute at two thirds of its speed beside the allreduce. Stage 1's bucket is
        // handed over at 4; stage 0's backward (2 s of work) then ends at 7, while 1.5 s of
        // the bucket's 3 are reduced; the rest of it alone ends at 8.5, stage 0's bucket at
        // 11.5, when the next forward starts.
        let stages = [stage(100, 1.0, 2.0), stage(100, 1.0, 2.0)];
        let streams = Streams {
            order: CommOrder::Fifo,
            bucket_bytes: 1000,
            reduce: &linear,
            negotiate_s: 0.0,
            contention: Contention {
                comm_slowdown: 2.0,
                round_slowdown: 10.0,
                compute_slowdown: 1.5,
                compute_threads: 1,
            },
        };
        let shared = simulate(&stages, &streams);
        assert!((shared.step_s - 11.5).abs() < 1e-9, "{shared:?}");
        assert!((shared.allreduce_s - 7.5).abs() < 1e-9, "{shared:?}");
        // Under priority the next forward's stage 0 runs beside stage 1's reduction, slowed.
        let priority = simulate(
            &stages,
            &Streams {
                order: CommOrder::Priority { chunk_bytes: 25 },
                ..streams
            },
        );
        let separate = run(&stages, CommOrder::Priority { chunk_bytes: 25 });
        assert!(
            priority.step_s > separate.step_s + 1.0,
            "{priority:?} {separate:?}"
        );
        // Rounds of 0.1 s (1 s beside the compute): the step grows by more than their idle
        // cost where the compute runs beside them.
        let rounds = |contention| {
            simulate(
                &stages,
                &Streams {
                    order: CommOrder::Priority { chunk_bytes: 25 },
                    negotiate_s: 0.1,
                    contention,
                    ..streams
                },
            )
        };
        let slow_rounds = rounds(streams.contention);
        let idle_rounds = rounds(Contention {
            round_slowdown: 1.0,
            ..streams.contention
        });
        assert!(
            slow_rounds.step_s > idle_rounds.step_s + 0.5,
            "{slow_rounds:?} {idle_rounds:?}"
        );
        assert!(idle_rounds.step_s > priority.step_s, "{idle_rounds:?}");
    }

    #[test]
    fn stages_are_cut_into_equal_buckets_last_stage_first() {
        let b = buckets(&[stage(10, 0.0, 0.0), stage(2500, 0.0, 0.0)], 1000);
        let got: Vec<(usize, usize)> = b.iter().map(|b| (b.stage, b.bytes)).collect();
        assert_eq!(got, vec![(1, 833), (1, 833), (1, 834), (0, 10)]);
    }
}
