//! What `--allreduce auto`'s online tuning settled on, reported as the run goes: a user sees
//! when the first steps' races end, and a benchmark knows which steps to leave out.

use std::path::Path;

use crate::comm::Communicator;
use crate::config::Setting;
use crate::error::{Result, TrainError};
use crate::metrics::{MetricsWriter, TunedRecord};

/// Reports each buffer size whose algorithm `auto` settled on since the last call, after
/// global step `global`: a line where `print`, a record in `metrics` (rank 0 holds them), and
/// the tuned model saved to `save`. Every rank calls it after the same step.
pub(super) fn report(
    comm: &Communicator,
    global: u64,
    print: bool,
    mut metrics: Option<&mut MetricsWriter>,
    save: Option<&Path>,
) -> Result<()> {
    let fresh = comm.take_tuned();
    if fresh.is_empty() || comm.rank() != 0 {
        return Ok(());
    }
    for c in &fresh {
        let timings: Vec<(String, f64)> =
            c.timings.iter().map(|(a, s)| (a.to_string(), *s)).collect();
        if print {
            let tried: Vec<String> = timings
                .iter()
                .map(|(a, s)| format!("{a} {:.3} ms", s * 1e3))
                .collect();
            ddl_cli::outln!(
                "ddl-train: allreduce auto at {} bytes: {} (tried {}; tuning cost {:.1} ms)",
                c.bytes,
                c.algorithm,
                tried.join(", "),
                c.cost * 1e3
            );
        }
        if let Some(m) = metrics.as_deref_mut() {
            m.write(&TunedRecord {
                kind: "allreduce_tuned",
                step: global,
                bytes: c.bytes,
                algorithm: c.algorithm.to_string(),
                timings,
                cost_s: c.cost,
            })?;
        }
    }
    if let Some(path) = save {
        comm.tuned_model()
            .save(path)
            .map_err(|e| TrainError::config(Setting::SaveCostModel, e.to_string()))?;
    }
    Ok(())
}
