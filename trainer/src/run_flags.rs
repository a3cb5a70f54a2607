//! Which flags make a run what it is: `resume` continues a checkpoint only when every flag
//! that changes the training trajectory is the same as when it was written.
//!
//! Every field of [`TrainConfig`] has its [`ResumeClass`] and the reason in the configuration's
//! table (config.rs, [`Setting::on_resume`]):
//!
//! - [`ResumeClass::Trajectory`]: a different value computes different weights from the same
//!   checkpoint, so continuing would silently mix two runs: refused, naming each flag with both
//!   values.
//! - [`ResumeClass::Rounding`]: the same mathematics in another order; the weights differ only
//!   by rounding, so the run continues with a warning that it is no longer bitwise
//!   reproducible.
//! - [`ResumeClass::Free`]: no effect on the weights (how long to run, where to write what, how
//!   to load).
//!
//! The layout (ranks, replicas per rank, nodes) and the dataset are compared from the
//! checkpoint's header instead of the flags (see [`LayoutCheck`]).

use serde_json::Value;

use crate::config::TrainConfig;
use crate::config::{spell, Setting};
use crate::setting::ResumeClass;

/// The settings of `class`, in the configuration's order, with their reasons.
pub fn of_class(class: ResumeClass) -> impl Iterator<Item = (Setting, &'static str)> {
    Setting::TRAIN.iter().filter_map(move |&s| {
        let on_resume = s.on_resume()?;
        (on_resume.class == class).then_some((s, on_resume.why))
    })
}

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
    for (setting, why) in of_class(ResumeClass::Trajectory) {
        if let Some(d) = differs(setting.name()) {
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
    for (setting, why) in of_class(ResumeClass::Rounding) {
        if let Some(d) = differs(setting.name()) {
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
        assert!(c.refused[0].starts_with("--seed 0 (this run: 3)"), "{c:?}");
        assert!(
            c.refused[1].starts_with("--lr unset (this run: 0.5)"),
            "{c:?}"
        );
        assert_eq!(c.warnings.len(), 1, "{c:?}");
        assert!(c.warnings[0].starts_with("--allreduce auto (this run: ring)"));

        let moved = LayoutCheck {
            ranks: (2, 4),
            data: (Some(7), 8),
            ..same_layout()
        };
        let c = compare(&old_v, &old, moved);
        assert_eq!(c.layout, vec!["ranks 2 (this run: 4)".to_string()]);
        assert!(c.refused[0].starts_with("--data"), "{c:?}");
    }
}
