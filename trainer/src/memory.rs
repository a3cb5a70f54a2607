//! What a rank holds for its model: the f32 copies of the parameters the table keeps, and the
//! buckets its gradient is reduced in, as `ddl-plan` prints them before a run.
//!
//! Each replica keeps [`REPLICA_COPIES`] copies on its device (weights, gradients, momentum:
//! three flat buffers the parameters and their gradients are views of) and each rank of a job
//! of several ranks [`HOST_COPIES`] in host memory (the buckets' host buffers the allreduce
//! runs on; a job of one rank keeps its gradients on the devices). A classifier head is part of
//! the parameters like any layer: a 21,841-way ResNet-50 head adds 44.75 M parameters, so
//! 179 MB to every copy. Under `head_parallel` each replica keeps its slice of the head
//! instead, and a step sends the features of the global batch instead of the head's gradient:
//! [`compare`] prints both modes side by side for a job ([`Job`]).

use std::fmt::Write;

use ddl_loader::units::{mb, mib};
use ddl_sim::step::{crossover_batch, HeadExchange, Step};

use crate::config::Overlap;
use crate::config::Setting;
use crate::table::{Layout, ALIGN};
use crate::weights;

/// f32 copies of the parameters each replica keeps on its device: weights, gradients and
/// momentum.
pub const REPLICA_COPIES: u64 = 3;

/// f32 copies of the parameters each rank of a job of several ranks keeps in host memory
/// besides its replicas: the buckets' host buffers.
pub const HOST_COPIES: u64 = 1;

/// Bytes of one f32 copy of the parameters of `layout`.
pub fn copy_bytes(layout: &Layout) -> u64 {
    layout.total as u64 * 4
}

/// Bytes of model state a rank of `replicas` CPU replicas holds in host memory:
/// `(REPLICA_COPIES x replicas + HOST_COPIES)` copies of the parameters.
pub fn cpu_rank_bytes(layout: &Layout, replicas: usize) -> u64 {
    (REPLICA_COPIES * replicas as u64 + HOST_COPIES) * copy_bytes(layout)
}

/// What the plan is for: the flags that shape the layout.
#[derive(Clone, Copy, Debug)]
pub struct PlanFor<'a> {
    /// Model name.
    pub model: &'a str,
    /// Output classes.
    pub classes: i64,
    /// How the reduction overlaps backward (decides where buckets are cut).
    pub overlap: Overlap,
    /// Target bucket size in bytes.
    pub bucket_bytes: usize,
    /// Replicas per rank.
    pub replicas: usize,
}

/// The plan as text: parameter count (and the head's share), one line per bucket in reduction
/// order, and the bytes of model state per replica and per rank.
pub fn describe(layout: &Layout, plan: &PlanFor<'_>) -> String {
    let numel = |head: bool| -> usize {
        layout
            .model_params()
            .filter(|p| weights::is_head(&p.name) == head)
            .map(|p| p.numel)
            .sum()
    };
    let (head, backbone) = (numel(true), numel(false));
    let copy = copy_bytes(layout);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}, {} classes: {} parameters, {:.1} MB f32 (head fc: {} parameters, {:.1} MB{})",
        plan.model,
        plan.classes,
        head + backbone,
        mb((head + backbone) as u64 * 4),
        head,
        mb(head as u64 * 4),
        if layout.left_out.is_empty() {
            String::new()
        } else {
            format!(
                "; {}: split over the replicas, outside the buckets and the state below",
                Setting::HeadParallel
            )
        }
    );
    let largest = &layout.buckets[layout.largest_bucket()];
    let _ = writeln!(
        out,
        "buckets (overlap {}, {:.1} MiB): {}, largest {:.1} MB ({})",
        plan.overlap.name(),
        mib(plan.bucket_bytes as u64),
        layout.buckets.len(),
        mb(largest.len as u64 * 4),
        layout.params[largest.params[0]].name
    );
    let _ = writeln!(
        out,
        "  {:>4} {:>6} {:>7} {:>10}  parameters (reduction order)",
        "#", "stage", "params", "MB"
    );
    for (k, b) in layout.buckets.iter().enumerate() {
        let name = |i: usize| layout.params[b.params[i]].name.as_str();
        let names = match b.params.len() {
            1 => name(0).to_string(),
            n => format!("{} .. {}", name(0), name(n - 1)),
        };
        let _ = writeln!(
            out,
            "  {k:>4} {:>6} {:>7} {:>10.3}  {names}",
            b.stage,
            b.params.len(),
            mb(b.len as u64 * 4)
        );
    }
    let _ = writeln!(
        out,
        "state: {REPLICA_COPIES} copies per replica (weights, gradients, momentum) = {:.1} MB on \
         its device, {HOST_COPIES} per rank of a multi-rank job (host buckets) = {:.1} MB; a rank \
         of {} CPU replica(s): {:.1} MB",
        mb(REPLICA_COPIES * copy),
        mb(HOST_COPIES * copy),
        plan.replicas,
        mb(cpu_rank_bytes(layout, plan.replicas))
    );
    out
}

/// The job `ddl-plan` compares the two modes for.
#[derive(Clone, Copy, Debug)]
pub struct Job {
    /// Ranks of the job.
    pub ranks: usize,
    /// Replicas per rank.
    pub replicas: usize,
    /// Images per replica per step.
    pub batch: usize,
}

/// What one mode costs a job: memory and bytes sent per step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModeCost {
    /// Parameters a replica holds.
    pub replica_params: u64,
    /// Bytes of model state on a replica's device (weights, gradients, momentum).
    pub replica_bytes: u64,
    /// Bytes of host buffers a rank of a multi-rank job keeps for its collectives.
    pub host_bytes: u64,
    /// Bytes a rank sends per step with the ring algorithms.
    pub sent_per_step: f64,
}

/// The head's `(features, classes)`, from the layout of either mode.
fn head_shape(layout: &Layout) -> (usize, usize) {
    layout
        .model_params()
        .filter(|p| weights::is_head(&p.name))
        .find_map(|p| match p.shape.as_slice() {
            &[c, f] => Some((f as usize, c as usize)),
            _ => None,
        })
        .unwrap_or((0, 0))
}

/// The cost of `job` with the data-parallel `layout`, or with the head split over the job's
/// replicas when `head_parallel` (`layout` then leaves the head out).
pub fn cost(layout: &Layout, job: Job, head_parallel: bool) -> ModeCost {
    let (features, classes) = head_shape(layout);
    let padded = |n: usize| n.next_multiple_of(ALIGN) as u64;
    let global_batch = job.ranks * job.replicas * job.batch;
    let (slice, step, host) = if head_parallel {
        // The replica with the most classes holds ceil(classes / replicas) rows.
        let rows = classes.div_ceil(job.ranks * job.replicas);
        let slice = padded(rows * features) + padded(rows);
        let exchange = HeadExchange {
            features,
            global_batch,
        };
        let host = (global_batch * (features + 1)) as u64 * 4;
        (slice, Some(exchange), host)
    } else {
        (0, None, 0)
    };
    let multi = job.ranks > 1;
    let gradient = copy_bytes(layout);
    ModeCost {
        replica_params: (layout.parameters() as u64)
            + slice.min(((features + 1) * classes) as u64) * u64::from(head_parallel),
        replica_bytes: REPLICA_COPIES * (gradient + slice * 4),
        host_bytes: if multi {
            HOST_COPIES * gradient + host
        } else {
            0
        },
        sent_per_step: Step {
            gradient_bytes: gradient as usize,
            head: step,
        }
        .ring_bytes_sent(job.ranks),
    }
}

/// Both modes of `job` side by side, from the data-parallel layout `dp` and the head-parallel
/// `hp`, with the global batch above which the split sends more.
pub fn compare(dp: &Layout, hp: &Layout, job: Job) -> String {
    let (features, classes) = head_shape(dp);
    let [d, h] = [cost(dp, job, false), cost(hp, job, true)];
    let global = job.ranks * job.replicas * job.batch;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "data-parallel vs head-parallel ({}: fc split over {} replicas), {} rank(s) \
         x {} replica(s) x {} images = global batch {global}:",
        Setting::HeadParallel,
        job.ranks * job.replicas,
        job.ranks,
        job.replicas,
        job.batch
    );
    let _ = writeln!(
        out,
        "  {:<34} {:>14} {:>14}",
        "", "data-parallel", "head-parallel"
    );
    let rows: [(&str, f64, f64, &str); 4] = [
        (
            "parameters per replica (M)",
            d.replica_params as f64 / 1e6,
            h.replica_params as f64 / 1e6,
            "",
        ),
        (
            "model state per replica (MB)",
            mb(d.replica_bytes),
            mb(h.replica_bytes),
            "  weights, gradients, momentum",
        ),
        (
            "host buffers per rank (MB)",
            mb(d.host_bytes),
            mb(h.host_bytes),
            "  of a multi-rank job",
        ),
        (
            "sent per rank per step (MB)",
            d.sent_per_step / 1e6,
            h.sent_per_step / 1e6,
            "  ring algorithms",
        ),
    ];
    for (what, a, b, note) in rows {
        let _ = writeln!(out, "  {what:<34} {a:>14.3} {b:>14.3}{note}");
    }
    let _ = writeln!(
        out,
        "crossover: head-parallel sends more than data-parallel above a global batch of {:.0} \
         ({features} features, {classes} classes); this job's is {global}",
        crossover_batch(features, classes)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_split_head_saves_memory_and_bytes_at_22k_classes_not_at_1k() {
        let job = Job {
            ranks: 8,
            replicas: 1,
            batch: 16,
        };
        let layout = |classes, split| {
            Layout::of_model(
                crate::model::ModelKind::Resnet50,
                classes,
                64,
                Overlap::Backward,
                25 << 20,
                split,
            )
        };
        let [dp, hp] = [false, true].map(|split| cost(&layout(21_841, split), job, split));
        // 68.26 M parameters data-parallel; the backbone and an eighth of the head split.
        assert_eq!(dp.replica_params, 68_260_241);
        assert!(hp.replica_params < 30_000_000, "{hp:?}");
        assert!(hp.replica_bytes * 2 < dp.replica_bytes, "{hp:?} {dp:?}");
        assert!(hp.sent_per_step * 2.5 < dp.sent_per_step, "{hp:?} {dp:?}");
        let [dp, hp] = [false, true].map(|split| cost(&layout(1000, split), job, split));
        assert!((hp.sent_per_step - dp.sent_per_step).abs() < 0.1 * dp.sent_per_step);
        let text = compare(&layout(21_841, false), &layout(21_841, true), job);
        assert!(text.contains("above a global batch of 21809"), "{text}");
        assert!(text.contains("this job's is 128"), "{text}");
    }
}
