//! What a rank holds for its model: the f32 copies of the parameters the table keeps, and the
//! buckets its gradient is reduced in, as `ddl-plan` prints them before a run.
//!
//! Each replica keeps [`REPLICA_COPIES`] copies on its device (weights, gradients, momentum:
//! three flat buffers the parameters and their gradients are views of) and each rank of a job
//! of several ranks [`HOST_COPIES`] in host memory (the buckets' host buffers the allreduce
//! runs on; a job of one rank keeps its gradients on the devices). A classifier head is part of
//! the parameters like any layer: a 21,841-way ResNet-50 head adds 44.75 M parameters, so
//! 179 MB to every copy.

use std::fmt::Write;

use crate::config::Overlap;
use crate::table::Layout;
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

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

/// The plan as text: parameter count (and the head's share), one line per bucket in reduction
/// order, and the bytes of model state per replica and per rank.
pub fn describe(layout: &Layout, plan: &PlanFor<'_>) -> String {
    let head: usize = layout
        .params
        .iter()
        .filter(|p| weights::is_head(&p.name))
        .map(|p| p.numel)
        .sum();
    let copy = copy_bytes(layout);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}, {} classes: {} parameters, {:.1} MB f32 (head fc: {} parameters, {:.1} MB)",
        plan.model,
        plan.classes,
        layout.parameters(),
        mb(copy),
        head,
        mb(head as u64 * 4)
    );
    let largest = &layout.buckets[layout.largest_bucket()];
    let _ = writeln!(
        out,
        "buckets (overlap {}, {:.1} MiB): {}, largest {:.1} MB ({})",
        plan.overlap.name(),
        plan.bucket_bytes as f64 / f64::from(1u32 << 20),
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
