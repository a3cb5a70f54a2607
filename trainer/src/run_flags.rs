//! Which flags make a run what it is: `resume` continues a checkpoint only when every flag
//! that changes the training trajectory is the same as when it was written.
//!
//! Every field of [`TrainConfig`] is in exactly one of three lists, each with its reason (a
//! test checks that none is missing):
//!
//! - [`TRAJECTORY`]: a different value computes different weights from the same checkpoint, so
//!   continuing would silently mix two runs: refused, naming each flag with both values.
//! - [`ROUNDING`]: the same mathematics in another order; the weights differ only by rounding,
//!   so the run continues with a warning that it is no longer bitwise reproducible.
//! - [`FREE`]: no effect on the weights (how long to run, where to write what, how to load).
//!
//! The layout (ranks, replicas per rank, nodes) and the dataset are compared from the
//! checkpoint's header instead of the flags (see [`LayoutCheck`]).

use serde_json::Value;

use crate::config::TrainConfig;
use crate::setting::{spell, Setting};

/// Flags that change the weights a run computes: (field, reason).
pub const TRAJECTORY: &[(&str, &str)] = &[
    ("model", "a different network"),
    (
        "batch",
        "other batches, global batch and (linearly scaled) learning rate",
    ),
    ("image_size", "other input pixels"),
    ("seed", "another sampling order and augmentation"),
    ("base_lr", "another learning rate"),
    ("lr", "another learning rate"),
    ("momentum", "another optimizer"),
    ("nesterov", "another optimizer"),
    ("weight_decay", "another optimizer"),
    ("warmup_epochs", "another learning-rate schedule"),
    ("schedule", "another learning-rate schedule"),
    ("milestones", "another learning-rate schedule"),
    ("gamma", "another learning-rate schedule"),
    ("label_smoothing", "another loss"),
    ("precision", "other arithmetic on GPUs"),
    ("residency", "other records on each node, so other batches"),
    (
        "exchange",
        "other records on each node from the next epoch on",
    ),
    (
        "on_bad_record",
        "other stand-ins for bad records (or none), so other batches",
    ),
    (
        "image_size_schedule",
        "other input pixels from its epochs on",
    ),
    ("crop_scale", "other crops"),
    ("crop_ratio", "other crops"),
    ("flip_prob", "other flips"),
    ("mean", "other input values"),
    ("std", "other input values"),
];

/// Flags that change only the order of floating-point sums: (field, reason).
pub const ROUNDING: &[(&str, &str)] = &[
    ("allreduce", "another summation order across ranks"),
    (
        "cost_model",
        "auto may pick other algorithms, so another summation order",
    ),
    (
        "bucket_mb",
        "other allreduce buffers, so another summation order",
    ),
    (
        "overlap",
        "other allreduce buffers, so another summation order",
    ),
    (
        "comm_order",
        "priority cuts buckets into chunks: ring and rhd at 3 or more ranks sum a chunk in \
         another order than its bucket (shm, and any algorithm at 2 ranks, sum the same)",
    ),
    ("channels_last", "other convolution kernels"),
    (
        "compile",
        "Inductor's fused kernels compute the same step, summing in another order",
    ),
    (
        "head_parallel",
        "the head's gradient from every sample on the replica owning each class, not summed \
         over the replicas: another summation order",
    ),
    (
        "gather",
        "another allgather / reduce-scatter of `head_parallel`, so another summation order",
    ),
    ("deterministic", "other convolution algorithms on GPUs"),
    (
        "devices",
        "other devices round differently (the replica count is checked from the layout)",
    ),
];

/// Flags that do not change the weights: (field, reason).
pub const FREE: &[(&str, &str)] = &[
    (
        "data",
        "a path: the dataset is compared by content (its fingerprint in the checkpoint)",
    ),
    (
        "epochs",
        "only where the run ends (with `schedule` cosine it also stretches the decay: warned)",
    ),
    ("max_steps", "only where the run stops"),
    (
        "workers",
        "batches depend only on seed, epoch, step and replica",
    ),
    (
        "prefetch",
        "batches depend only on seed, epoch, step and replica",
    ),
    ("metrics", "output only"),
    ("trace_records", "output only"),
    ("compile_cache", "where the compiled step is kept"),
    ("save_cost_model", "output only"),
    ("checkpoint_dir", "output only"),
    ("checkpoint_every", "output only"),
    ("keep_checkpoints", "output only"),
    ("resume", "how this run starts"),
    ("restart", "how this run starts"),
    ("allow_new_layout", "how this run starts"),
    ("dump_weights", "output only"),
    ("export", "output only"),
    (
        "init_from",
        "only the first step's weights, which a resumed run takes from its checkpoint",
    ),
    (
        "reset_head",
        "only the first step's weights, which a resumed run takes from its checkpoint",
    ),
    ("check_replicas", "a check, changes nothing"),
    ("eval", "evaluation does not train"),
    ("eval_resize", "evaluation does not train"),
    ("eval_resize_ratio", "evaluation does not train"),
    ("populate", "how the shards are loaded"),
    ("lock", "how the shards are loaded"),
    ("stage", "how the shards are loaded"),
    ("comm_timeout_s", "when a hung job fails"),
    ("verbose", "output only"),
    (
        "synthetic_data",
        "a run on synthetic data writes no checkpoint",
    ),
    (
        "classes",
        "only with `synthetic_data`, which writes no checkpoint",
    ),
];

/// The layout and data a checkpoint was written for, against this run's.
#[derive(Clone, Copy, Debug)]
pub struct LayoutCheck {
    /// (checkpoint, this run) ranks.
    pub ranks: (usize, usize),
    /// (checkpoint, this run) replicas per rank.
    pub replicas: (usize, usize),
    /// (checkpoint, this run) nodes sharing the data; `None` in checkpoints that predate it.
    pub nodes: (Option<usize>, usize),
    /// (checkpoint, this run) dataset fingerprints; `None` in checkpoints that predate it.
    pub data: (Option<u32>, u32),
}

/// What comparing a checkpoint with this run found.
#[derive(Debug, Default, PartialEq)]
pub struct Comparison {
    /// Differences that change the trajectory, one per flag: `seed` 3 (this run: 4).
    pub refused: Vec<String>,
    /// Differences in the layout (ranks, replicas, nodes), allowed with `allow_new_layout`.
    pub layout: Vec<String>,
    /// Warnings: rounding-only differences, a stretched cosine schedule.
    pub warnings: Vec<String>,
}

/// The setting of a field of the checkpoint's header, as this process spells settings.
fn setting_name(field: &str) -> String {
    Setting::from_name(field).map_or_else(|| format!("`{field}`"), |s| s.to_string())
}

fn show(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "unset".into(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| show(Some(x)))
            .collect::<Vec<_>>()
            .join(","),
        Some(other) => other.to_string(),
    }
}

/// Compares the flags a checkpoint was written with (`old`, its header's `flags`) and its
/// layout with this run's `cfg` and layout.
pub fn compare(old: &Value, cfg: &TrainConfig, layout: LayoutCheck) -> Comparison {
    let new = serde_json::to_value(cfg).unwrap_or_default();
    let mut out = Comparison::default();
    let differs = |field: &str| {
        let (a, b) = (old.get(field), new.get(field));
        // A flag the checkpoint predates was not recorded: nothing to compare.
        (a.is_some() && a != b).then(|| {
            format!(
                "{} {} (this run: {})",
                setting_name(field),
                show(a),
                show(b)
            )
        })
    };
    for (field, why) in TRAJECTORY {
        if let Some(d) = differs(field) {
            out.refused.push(format!("{d}: {}", spell(why)));
        }
    }
    let (data_old, data_new) = layout.data;
    if data_old.is_some_and(|d| d != data_new) {
        out.refused.push(format!(
            "{}: another dataset (fingerprint {:08x}, this run's {data_new:08x})",
            Setting::Data,
            data_old.unwrap_or_default()
        ));
    }
    for (field, why) in ROUNDING {
        if let Some(d) = differs(field) {
            out.warnings.push(format!(
                "{d}: {}; the run continues but is no longer bitwise reproducible",
                spell(why)
            ));
        }
    }
    if old.get("schedule").and_then(Value::as_str) == Some("cosine") {
        if let Some(d) = differs("epochs") {
            out.warnings.push(format!(
                "{d}: the cosine decay is stretched to the new length from here"
            ));
        }
    }
    let mut layout_diff = |what: &str, a: usize, b: usize| {
        if a != b {
            out.layout.push(format!("{what} {a} (this run: {b})"));
        }
    };
    layout_diff("ranks", layout.ranks.0, layout.ranks.1);
    layout_diff(
        &format!("replicas per rank ({})", Setting::Devices),
        layout.replicas.0,
        layout.replicas.1,
    );
    if let Some(nodes) = layout.nodes.0 {
        layout_diff("nodes", nodes, layout.nodes.1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn same_layout() -> LayoutCheck {
        LayoutCheck {
            ranks: (2, 2),
            replicas: (1, 1),
            nodes: (Some(1), 1),
            data: (Some(7), 7),
        }
    }

    #[test]
    fn every_flag_is_classified_once() {
        let v = serde_json::to_value(TrainConfig::default()).unwrap();
        let mut fields: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        fields.sort_unstable();
        let mut listed: Vec<&str> = TRAJECTORY
            .iter()
            .chain(ROUNDING)
            .chain(FREE)
            .map(|(f, _)| *f)
            .collect();
        listed.sort_unstable();
        assert_eq!(
            listed, fields,
            "classify every TrainConfig field exactly once"
        );
    }

    #[test]
    fn trajectory_flags_are_refused_and_named_others_pass() {
        let old = TrainConfig::default();
        let old_v = serde_json::to_value(&old).unwrap();
        let mut new = old.clone();
        new.epochs += 10;
        new.keep_checkpoints = 1;
        new.verbose = false;
        assert_eq!(compare(&old_v, &new, same_layout()), Comparison::default());

        new.seed = 3;
        new.lr = Some(0.5);
        new.allreduce = ddl_comm::Algorithm::Ring;
        let c = compare(&old_v, &new, same_layout());
        assert_eq!(c.refused.len(), 2, "{c:?}");
        assert!(c.refused[0].starts_with("`seed` 0 (this run: 3)"), "{c:?}");
        assert!(
            c.refused[1].starts_with("`lr` unset (this run: 0.5)"),
            "{c:?}"
        );
        assert_eq!(c.warnings.len(), 1, "{c:?}");
        assert!(c.warnings[0].starts_with("`allreduce` auto (this run: ring)"));

        let moved = LayoutCheck {
            ranks: (2, 4),
            data: (Some(7), 8),
            ..same_layout()
        };
        let c = compare(&old_v, &old, moved);
        assert_eq!(c.layout, vec!["ranks 2 (this run: 4)".to_string()]);
        assert!(c.refused[0].starts_with("`data`"), "{c:?}");
    }
}
