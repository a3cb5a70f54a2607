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
//! schedule: how much of the allreduce the compute hides.

use crate::priority::CommOrder;

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
/// each `priority` chunk.
pub struct Streams<'a> {
    /// The order of the buckets.
    pub order: CommOrder,
    /// Largest bucket (a stage's bytes are cut into equal buckets no larger).
    pub bucket_bytes: usize,
    /// Seconds to allreduce a buffer of that many bytes.
    pub reduce: &'a dyn Fn(usize) -> f64,
    /// Seconds of one negotiation round (`priority`).
    pub negotiate_s: f64,
}

/// One bucket of the simulated model: its stage and bytes.
struct Bucket {
    stage: usize,
    bytes: usize,
}

/// The allreduce stream: per bucket, when its current instance was handed over, how many of
/// its bytes are left, and when its last instance was complete.
struct Comm<'s, 'a> {
    streams: &'s Streams<'a>,
    buckets: Vec<Bucket>,
    ready: Vec<f64>,
    left: Vec<usize>,
    done: Vec<f64>,
    clock: f64,
    busy: f64,
}

impl Comm<'_, '_> {
    /// Serves chunks until bucket `b`'s last instance is complete; returns when it was.
    fn finish(&mut self, b: usize) -> f64 {
        while self.left[b] > 0 {
            self.serve_one();
        }
        self.done[b]
    }

    /// The next allreduce the order picks at the stream's clock (or, when nothing is ready
    /// yet, at the next hand-over).
    fn serve_one(&mut self) {
        let pending: Vec<usize> = (0..self.buckets.len())
            .filter(|&b| self.left[b] > 0)
            .collect();
        let Some(first) = pending.iter().map(|&b| self.ready[b]).reduce(f64::min) else {
            return;
        };
        let now = self.clock.max(first);
        let (b, bytes, took) = match self.streams.order {
            // Handed over in bucket order, each reduced whole.
            CommOrder::Fifo => {
                let b = pending[0];
                let bytes = self.left[b];
                (b, bytes, (self.streams.reduce)(bytes))
            }
            CommOrder::Priority { chunk_bytes } => {
                let b = pending
                    .iter()
                    .copied()
                    .filter(|&b| self.ready[b] <= now)
                    .min_by_key(|&b| (self.buckets[b].stage, b))
                    .unwrap_or(pending[0]);
                let bytes = self.left[b].min(chunk_bytes.max(4));
                let took = self.streams.negotiate_s + (self.streams.reduce)(bytes);
                (b, bytes, took)
            }
        };
        let start = self.clock.max(self.ready[b]);
        self.clock = start + took;
        self.busy += took;
        self.left[b] -= bytes;
        if self.left[b] == 0 {
            self.done[b] = self.clock;
        }
    }

    /// Bucket `b` handed over at `t`.
    fn hand_over(&mut self, b: usize, t: f64) {
        self.ready[b] = t;
        self.left[b] = self.buckets[b].bytes;
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
/// says (see the module doc).
pub fn simulate(stages: &[StageCost], streams: &Streams<'_>) -> StepTime {
    let buckets = buckets(stages, streams.bucket_bytes);
    let n = buckets.len();
    let mut comm = Comm {
        streams,
        buckets,
        ready: vec![0.0; n],
        left: vec![0; n],
        done: vec![0.0; n],
        clock: 0.0,
        busy: 0.0,
    };
    let mut of_stage = vec![Vec::new(); stages.len()];
    for (b, bucket) in comm.buckets.iter().enumerate() {
        of_stage[bucket.stage].push(b);
    }
    let priority = matches!(streams.order, CommOrder::Priority { .. });
    let mut t = 0.0;
    let mut starts = Vec::with_capacity(STEPS);
    let mut busy_at = Vec::with_capacity(STEPS);
    for _ in 0..STEPS {
        if !priority {
            for b in 0..n {
                t = comm.finish(b).max(t);
            }
        }
        starts.push(t);
        busy_at.push(comm.busy);
        for (stage, s) in stages.iter().enumerate() {
            if priority {
                for &b in &of_stage[stage] {
                    t = comm.finish(b).max(t);
                }
            }
            t += s.forward_s;
        }
        for (stage, s) in stages.iter().enumerate().rev() {
            t += s.backward_s;
            for &b in &of_stage[stage] {
                comm.hand_over(b, t);
            }
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
    fn stages_are_cut_into_equal_buckets_last_stage_first() {
        let b = buckets(&[stage(10, 0.0, 0.0), stage(2500, 0.0, 0.0)], 1000);
        let got: Vec<(usize, usize)> = b.iter().map(|b| (b.stage, b.bytes)).collect();
        assert_eq!(got, vec![(1, 833), (1, 833), (1, 834), (0, 10)]);
    }
}
