//! `ddl-bench sim`'s schedule table: one rank per GPU with `--overlap backward` (buckets cut at
//! the model's stage boundaries), the step simulated as three streams (backward, allreduce,
//! the next forward: [`crate::timeline`]) under `--comm-order fifo` and `priority`, so
//! that a user can predict what `priority` gains at a scale they cannot try.

use std::io::Write;

use ddl_comm::{Algorithm, CommOrder, CostModel, Topology};
use serde::Serialize;

use crate::contention::Contention;
use crate::resnet::Stage;
use crate::timeline::{simulate, StageCost, Streams};

/// The share of a step's compute that is forward (backward computes two gradients per
/// weight: about twice the forward's multiply-accumulates).
const FORWARD_SHARE: f64 = 1.0 / 3.0;

/// What the schedule is simulated for.
#[derive(Clone, Copy, Debug)]
pub struct ScheduleSetup<'a> {
    /// The model's stages in forward order.
    pub stages: &'a [Stage],
    /// Compute of one step per GPU, ms (split over the stages by their multiply-accumulates).
    pub compute_ms: f64,
    /// Largest bucket, bytes.
    pub bucket_bytes: usize,
    /// The `priority` chunk, bytes.
    pub chunk_bytes: usize,
    /// The layout of the ranks.
    pub topo: Topology,
    /// How the compute and the allreduce slow each other (CPU replicas; `SEPARATE` for GPUs).
    pub contention: Contention,
    /// The allreduce of every bucket and chunk (`auto`: what the model picks per size).
    pub algorithm: &'a Algorithm,
}

/// One simulated order.
#[derive(Clone, Debug, Serialize)]
pub struct ScheduleRow {
    /// `fifo` or `priority`.
    pub order: String,
    /// Ranks (GPUs).
    pub ranks: usize,
    /// Steady-state step, ms.
    pub step_ms: f64,
    /// Compute per step, ms.
    pub compute_ms: f64,
    /// Wait for the allreduce per step, ms (`step_ms - compute_ms`).
    pub exposed_ms: f64,
    /// Allreduce busy per step, ms (`priority`: with its negotiation rounds).
    pub allreduce_ms: f64,
    /// compute / step.
    pub efficiency: f64,
}

/// The stages' costs: gradient bytes (f32) and the compute split by multiply-accumulates.
fn costs(setup: &ScheduleSetup<'_>) -> Vec<StageCost> {
    let macs: u64 = setup.stages.iter().map(|s| s.macs).sum();
    let seconds = setup.compute_ms / 1e3;
    setup
        .stages
        .iter()
        .map(|s| {
            let share = s.macs as f64 / macs.max(1) as f64;
            StageCost {
                bytes: s.params as usize * 4,
                forward_s: seconds * FORWARD_SHARE * share,
                backward_s: seconds * (1.0 - FORWARD_SHARE) * share,
            }
        })
        .collect()
}

/// The `fifo` and `priority` rows, each allreduce as `model` predicts the setup's algorithm
/// at its size; a
/// negotiation round is the allreduce of its flags (two and one per bucket, f32).
pub fn simulate_schedule(model: &CostModel, setup: &ScheduleSetup<'_>) -> Vec<ScheduleRow> {
    let stages = costs(setup);
    let topo = setup.topo;
    let reduce = |bytes: usize| model.predict(setup.algorithm, bytes, topo);
    let buckets: usize = stages
        .iter()
        .map(|s| s.bytes.div_ceil(setup.bucket_bytes.max(1)))
        .sum();
    let negotiate_s = reduce(4 * (2 + buckets));
    let orders = [
        CommOrder::Fifo,
        CommOrder::Priority {
            chunk_bytes: setup.chunk_bytes,
        },
    ];
    orders
        .into_iter()
        .map(|order| {
            let streams = Streams {
                order,
                bucket_bytes: setup.bucket_bytes,
                reduce: &reduce,
                negotiate_s,
                contention: setup.contention,
            };
            let t = simulate(&stages, &streams);
            ScheduleRow {
                order: order.name().to_string(),
                ranks: topo.ranks(),
                step_ms: t.step_s * 1e3,
                compute_ms: t.compute_s * 1e3,
                exposed_ms: t.exposed_s * 1e3,
                allreduce_ms: t.allreduce_s * 1e3,
                efficiency: t.compute_s / t.step_s,
            }
        })
        .collect()
}

/// Writes the schedule table under `sim`'s (`rows` from [`simulate_schedule`]).
pub fn print_schedule(
    out: &mut dyn Write,
    rows: &[ScheduleRow],
    setup: &ScheduleSetup<'_>,
    image_size: u32,
) -> std::io::Result<()> {
    writeln!(
        out,
        "# schedule: flat/{}, --overlap backward, buckets of up to {:.1} MiB cut at the {} stages (compute split by their multiply-accumulates at {image_size} px, forward 1/3, backward 2/3); priority in chunks of {:.1} MiB, one negotiation round each",
        setup.algorithm,
        setup.bucket_bytes as f64 / (1u64 << 20) as f64,
        setup.stages.len(),
        setup.chunk_bytes as f64 / (1u64 << 20) as f64,
    )?;
    let c = setup.contention;
    if c.measured() {
        writeln!(
            out,
            "# CPU replicas on the cores of the communication ({} compute thread(s) per rank measured): beside the compute a bucket's allreduce runs {:.2}x as long, a negotiation round {:.2}x; the compute {:.2}x beside the allreduce",
            c.compute_threads, c.comm_slowdown, c.round_slowdown, c.compute_slowdown
        )?;
    }
    writeln!(
        out,
        "# {:>10} {:>10} {:>12} {:>14} {:>11} {:>9}",
        "order", "step(ms)", "exposed(ms)", "allreduce(ms)", "efficiency", "vs fifo"
    )?;
    let fifo = rows.iter().find(|r| r.order == "fifo").map(|r| r.step_ms);
    for r in rows {
        writeln!(
            out,
            "  {:>10} {:>10.2} {:>12.2} {:>14.2} {:>10.1}% {:>8.3}x",
            r.order,
            r.step_ms,
            r.exposed_ms,
            r.allreduce_ms,
            r.efficiency * 100.0,
            fifo.map_or(1.0, |f| f / r.step_ms)
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priority_gains_where_the_allreduce_outlasts_backward_and_nothing_where_it_hides() {
        let stages = crate::resnet::stages("resnet50", 1000, 224).unwrap();
        let setup = ScheduleSetup {
            stages: &stages,
            compute_ms: 150.0,
            bucket_bytes: 25 << 20,
            chunk_bytes: 4 << 20,
            topo: Topology::new(64, 4),
            contention: Contention::SEPARATE,
            algorithm: &Algorithm::Auto,
        };
        // The default model's links (10 Gbit/s): the 102 MB allreduce outlasts backward.
        let rows = simulate_schedule(&CostModel::default(), &setup);
        let (fifo, priority) = (&rows[0], &rows[1]);
        assert_eq!(
            (fifo.order.as_str(), priority.order.as_str()),
            ("fifo", "priority")
        );
        assert!(fifo.allreduce_ms > 100.0, "{rows:?}");
        assert!(priority.step_ms < 0.9 * fifo.step_ms, "{rows:?}");
        assert!((fifo.compute_ms - 150.0).abs() < 1e-9);
        // Minsky's (InfiniBand): backward hides all but the last bucket's either way.
        let fast = simulate_schedule(&CostModel::minsky(), &setup);
        for r in &fast {
            assert!(r.step_ms < 150.0 * 1.001, "{fast:?}");
        }
        let mut text = Vec::new();
        print_schedule(&mut text, &rows, &setup, 224).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("cut at the 18 stages"), "{text}");
        assert!(
            text.lines().any(|l| l.trim_start().starts_with("priority")),
            "{text}"
        );
    }
}
