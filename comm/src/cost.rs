//! Alpha-beta-gamma cost model per network tier, used to pick an algorithm (`auto`) and to
//! simulate large runs (`ddl-bench sim`). Each algorithm's formula lives beside the algorithm,
//! in its file under `allreduce/` ([`CostModel::predict`] asks it); this file holds the tiers,
//! the rounds the formulas are built of, the measured curves and the choice among the
//! algorithms.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{CommError, Result};
use crate::topology::Topology;

/// Costs of one tier of the network: a message of `b` bytes takes `alpha + b * beta`
/// seconds, and reducing `b` bytes of f32 takes `b * gamma` seconds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tier {
    /// Name of the tier (e.g. `nvlink`, `infiniband-edr`, `shm`).
    pub name: String,
    /// Latency per message, seconds.
    pub alpha: f64,
    /// Transfer time per byte, seconds (1 / bandwidth).
    pub beta: f64,
    /// Reduction (f32 add) time per byte, seconds.
    pub gamma: f64,
    /// Transfer time per byte as a function of the allreduce buffer size: `(bytes, seconds
    /// per byte)` points sorted by size, interpolated linearly in log(bytes) and clamped at
    /// both ends. Measured from ring allreduce times by `ddl-bench calibrate`, it captures
    /// what one `beta` cannot: the buffer spilling out of the caches (memory bandwidth),
    /// ranks sharing cores (oversubscription) and TCP/shaper behaviour. Empty: `beta` at
    /// every size.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub beta_curve: Vec<(usize, f64)>,
    /// Ranks of the ring whose times gave `beta_curve`: a ring of `b` bytes over them moves
    /// `b / curve_ranks` bytes per step over each rank's (or, between nodes, each node
    /// link's) connection, so [`Tier::beta_load`] of a load L reads the curve at
    /// `L x curve_ranks`. 0 (no curve): the load itself.
    #[serde(default)]
    pub curve_ranks: usize,
}

impl Tier {
    /// A tier with one `beta` at every size.
    pub fn new(name: &str, alpha: f64, beta: f64, gamma: f64) -> Tier {
        Tier {
            name: name.into(),
            alpha,
            beta,
            gamma,
            beta_curve: Vec::new(),
            curve_ranks: 0,
        }
    }

    /// Transfer time per byte during an allreduce of a `bytes` buffer (see `beta_curve`).
    pub fn beta_at(&self, bytes: usize) -> f64 {
        let c = &self.beta_curve;
        let (Some(first), Some(last)) = (c.first(), c.last()) else {
            return self.beta;
        };
        if bytes <= first.0 {
            return first.1;
        }
        if bytes >= last.0 {
            return last.1;
        }
        let i = c.partition_point(|p| p.0 <= bytes);
        let (lo, hi) = (c[i - 1], c[i]);
        let x =
            ((bytes as f64).ln() - (lo.0 as f64).ln()) / ((hi.0 as f64).ln() - (lo.0 as f64).ln());
        lo.1 + x * (hi.1 - lo.1)
    }

    /// Transfer time per byte of a lock-step round that moves `load` bytes over one rank's
    /// connection (or one node link): the curve point of the calibration ring whose steps
    /// moved the same load (see `curve_ranks`).
    pub fn beta_load(&self, load: f64) -> f64 {
        self.beta_at((load * self.curve_ranks.max(1) as f64) as usize)
    }

    /// Seconds to move `load` bytes in one round.
    pub(crate) fn xfer(&self, load: f64) -> f64 {
        if load <= 0.0 {
            0.0
        } else {
            load * self.beta_load(load)
        }
    }

    /// Seconds to move `load` bytes over shared memory in one round of an allreduce of a
    /// `buffer`-byte buffer: copies are memory-bound, and whether they hit the caches
    /// depends on the buffer the algorithm walks over, not on one message, so the curve is
    /// read at no less than the buffer size (the calibration ring's working set is its
    /// buffer too). Small pipeline chunks of a large buffer cost what the ring over that
    /// buffer pays per byte.
    pub(crate) fn xfer_in(&self, load: f64, buffer: f64) -> f64 {
        if load <= 0.0 {
            0.0
        } else {
            let at = (load * self.curve_ranks.max(1) as f64).max(buffer);
            load * self.beta_at(at as usize)
        }
    }
}

/// What one lock-step round of an algorithm costs: its exchange (node-local transfers and
/// node-link transfers proceed at once) followed by the additions.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Round {
    /// Latency (the slower tier's alpha when any message crosses nodes).
    pub(crate) alpha: f64,
    /// Node-local transfer time of the busiest rank.
    pub(crate) local: f64,
    /// Transfer time of the busiest node link.
    pub(crate) link: f64,
    /// Reduction time of the busiest rank.
    pub(crate) add: f64,
}

impl Round {
    /// Seconds of the round.
    pub(crate) fn time(&self) -> f64 {
        self.alpha + self.local.max(self.link) + self.add
    }

    /// Two rounds run as one (the steps of several pipeline segments in one exchange).
    pub(crate) fn with(self, o: &Round) -> Round {
        Round {
            alpha: self.alpha.max(o.alpha),
            local: self.local + o.local,
            link: self.link + o.link,
            add: self.add + o.add,
        }
    }
}

/// The allreduce algorithms Open MPI 4.1's `tuned` collective component chooses between for
/// a commutative operation (4.1 has no Rabenseifner allreduce; its segmented ring moves the
/// same bytes in the same steps as the ring).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMpiAllreduce {
    /// Recursive doubling of the whole buffer.
    RecursiveDoubling,
    /// Ring or segmented ring (reduce-scatter + allgather).
    Ring,
}

/// What Open MPI 4.1 runs for MPI_Allreduce of a commutative operation over `ranks` ranks
/// and `bytes` bytes: recursive doubling in the small-message ranges of the `tuned`
/// component's fixed decision rules (`coll_tuned_decision_fixed.c`), the ring otherwise.
/// Checked on the emulated 2 x 4 cluster by forcing each algorithm (BENCHMARKS.md, "Figures behind the defaults").
pub fn open_mpi_choice(ranks: usize, bytes: usize) -> OpenMpiAllreduce {
    use OpenMpiAllreduce::*;
    let doubling = match ranks {
        0..=3 => (8..4096).contains(&bytes) || (8192..16384).contains(&bytes),
        4..=7 => (16..8192).contains(&bytes),
        8..=15 => bytes < 8192,
        16..=31 => (64..4096).contains(&bytes),
        32..=63 => false,
        _ => bytes < 262144,
    };
    if doubling {
        RecursiveDoubling
    } else {
        Ring
    }
}

/// One allreduce algorithm as `ddl-bench calibrate` timed it in one layout: `auto` chooses
/// from these curves, measured, not assumed. Formulas miss what decides the winner on a real
/// machine: Open MPI's internals, polling and yielding when ranks share cores, TCP and its
/// shaper, copies at cache or memory speed (BENCHMARKS.md, "Figures behind the defaults", has a formula
/// that picked the wrong winner).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MeasuredCurve {
    /// The algorithm timed, as it prints (`ring`, `rhd`, `multiring`, `multicolor:4:1048576`,
    /// `shm`, `mpi`): a curve serves that algorithm with exactly those parameters.
    pub algorithm: String,
    /// Nodes of the layout the curve was measured in.
    pub nodes: usize,
    /// Ranks per node of that layout.
    pub ranks_per_node: usize,
    /// `(bytes, seconds)` of one call, sorted by size.
    pub points: Vec<(usize, f64)>,
}

impl MeasuredCurve {
    /// Seconds of one call of `bytes`: log(time) interpolated linearly in
    /// log(bytes) between the measured points; below the smallest point its time (the
    /// latency floor), above the largest its time per byte. `None` without points.
    pub fn time(&self, bytes: usize) -> Option<f64> {
        let c = &self.points;
        let (first, last) = (c.first()?, c.last()?);
        if bytes <= first.0 {
            return Some(first.1);
        }
        if bytes >= last.0 {
            return Some(last.1 * bytes as f64 / last.0 as f64);
        }
        let i = c.partition_point(|p| p.0 <= bytes);
        let (lo, hi) = (c[i - 1], c[i]);
        let ln = |v: f64| v.max(1e-12).ln();
        let x = (ln(bytes as f64) - ln(lo.0 as f64)) / (ln(hi.0 as f64) - ln(lo.0 as f64));
        Some((ln(lo.1) + x * (ln(hi.1) - ln(lo.1))).exp())
    }
}

/// Two-tier cost model: within a node and between nodes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CostModel {
    /// Costs between ranks of the same node.
    pub intra: Tier,
    /// Costs between ranks of different nodes (one NIC per node, shared by its ranks).
    pub inter: Tier,
    /// Where the numbers come from (preset name or calibration host and date).
    #[serde(default)]
    pub source: String,
    /// Seconds per byte of a memory copy (0: unknown, `intra.gamma` is used).
    #[serde(default)]
    pub copy: f64,
    /// Seconds of one synchronisation of a node's ranks through shared memory (a whole
    /// `shm` allreduce of one f32, as `calibrate` times it); 0: unknown,
    /// [`DEFAULT_SHM_SYNC`] is used.
    #[serde(default)]
    pub shm_sync: f64,
    /// Algorithms timed by `calibrate` in the job's layout (see [`MeasuredCurve`]): where a
    /// curve matches an algorithm and a layout it is the prediction; the formulas serve the
    /// other layouts (the simulator's) and algorithms not timed. Absent in presets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub measured: Vec<MeasuredCurve>,
    /// The file's fields that this crate does not read (ddl-sim's `contention`), kept as
    /// they were so that a model loaded and saved again (`--save-cost-model`) loses none.
    #[serde(flatten)]
    pub other: serde_json::Map<String, serde_json::Value>,
}

/// Shared-memory synchronisation time assumed when none was measured.
pub const DEFAULT_SHM_SYNC: f64 = 1e-6;

impl Default for CostModel {
    /// A conservative shared-memory / 10 GbE guess, used when nothing was measured.
    fn default() -> Self {
        CostModel {
            intra: Tier::new("shm", 2e-6, 1.0 / 5e9, 1.0 / 5e9),
            inter: Tier::new("10gbe", 20e-6, 1.0 / 1.1e9, 1.0 / 5e9),
            source: "default".into(),
            copy: 0.0,
            shm_sync: 0.0,
            measured: Vec::new(),
            other: serde_json::Map::new(),
        }
    }
}

/// A cost model known by name, for a job where nothing was measured.
#[derive(Clone, Copy, Debug)]
pub struct Preset {
    /// The name a user gives (`ddl-bench --preset`).
    pub name: &'static str,
    /// One line on the machines it models.
    pub help: &'static str,
    /// The model.
    pub model: fn() -> CostModel,
}

/// The presets, by name (`ddl-bench --preset`); the first is used where neither a preset nor a
/// measured model is given.
pub const PRESETS: [Preset; 2] = [
    Preset {
        name: "minsky",
        help: "PowerAI DDL's IBM Minsky nodes: 4 P100 over NVLink, InfiniBand EDR between nodes",
        model: CostModel::minsky,
    },
    Preset {
        name: "default",
        help: "a conservative guess: shared memory in a node, 10 GbE between nodes",
        model: CostModel::default,
    },
];

impl CostModel {
    /// IBM "Minsky" S822LC nodes as used by PowerAI DDL: 4 P100 per node over NVLink
    /// (~40 GB/s per direction), nodes over InfiniBand EDR (~12 GB/s), GPU reduction at
    /// HBM speed.
    pub fn minsky() -> CostModel {
        CostModel {
            intra: Tier::new("nvlink", 8e-6, 1.0 / 40e9, 1.0 / 200e9),
            inter: Tier::new("infiniband-edr", 5e-6, 1.0 / 12e9, 1.0 / 200e9),
            source: "preset minsky".into(),
            copy: 0.0,
            shm_sync: 0.0,
            measured: Vec::new(),
            other: serde_json::Map::new(),
        }
    }

    /// The preset named `name`, one of [`PRESETS`].
    pub fn preset(name: &str) -> Result<CostModel> {
        match PRESETS.iter().find(|p| p.name == name) {
            Some(p) => Ok((p.model)()),
            None => {
                let names: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
                Err(CommError::InvalidArgument(format!(
                    "unknown cost-model preset {name:?} (expected one of {})",
                    names.join(", ")
                )))
            }
        }
    }

    /// Reads a model saved by [`CostModel::save`] (JSON).
    pub fn load(path: &Path) -> Result<CostModel> {
        let err = |message: String| CommError::CostModelFile {
            path: path.to_path_buf(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        serde_json::from_str(&text).map_err(|e| err(e.to_string()))
    }

    /// Writes the model as pretty JSON.
    pub fn save(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).map_err(|e| CommError::CostModelFile {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        std::fs::write(path, text + "\n").map_err(|e| CommError::CostModelFile {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    }

    /// Seconds per byte of a memory copy (the measured copy, or `gamma` when unknown).
    pub(crate) fn copy_per_byte(&self) -> f64 {
        if self.copy > 0.0 {
            self.copy
        } else {
            self.intra.gamma
        }
    }

    /// One lock-step round of an allreduce of `buffer` bytes in which every rank `r` sends
    /// `msg` bytes to `to(r)` (ranks mapping to themselves send nothing), optionally adding
    /// what it receives.
    pub(crate) fn pairs_round(
        &self,
        topo: Topology,
        buffer: f64,
        msg: f64,
        reduce: bool,
        to: impl Fn(usize) -> usize,
    ) -> Round {
        let mut crossing = vec![0usize; topo.nodes];
        let mut local = false;
        for r in 0..topo.ranks() {
            let q = to(r);
            if q == r {
                continue;
            }
            if topo.node_of(q) == topo.node_of(r) {
                local = true;
            } else {
                crossing[topo.node_of(r)] += 1;
            }
        }
        let link_load = crossing.iter().copied().max().unwrap_or(0) as f64 * msg;
        Round {
            alpha: if link_load > 0.0 {
                self.inter.alpha
            } else {
                self.intra.alpha
            },
            local: if local {
                self.intra.xfer_in(msg, buffer)
            } else {
                0.0
            },
            link: self.inter.xfer(link_load),
            add: if reduce { msg * self.intra.gamma } else { 0.0 },
        }
    }

    /// Predicted seconds of one call of `bytes` (f32) over `topo` by the algorithm that prints
    /// as `algorithm`: none where there is nothing to reduce, the measured time where
    /// `calibrate` timed it in this layout ([`MeasuredCurve`]), otherwise its `formula`.
    pub(crate) fn predicted(
        &self,
        algorithm: &str,
        bytes: usize,
        topo: Topology,
        formula: impl FnOnce() -> f64,
    ) -> f64 {
        if topo.ranks() <= 1 || bytes == 0 {
            return 0.0;
        }
        self.measured
            .iter()
            .find(|c| {
                c.algorithm == algorithm
                    && c.nodes == topo.nodes
                    && c.ranks_per_node == topo.ranks_per_node
            })
            .and_then(|c| c.time(bytes))
            .unwrap_or_else(formula)
    }

    /// Whether `calibrate` (or an online tuning, saved) timed some algorithm in `topo`'s
    /// layout: then `auto` chooses from these times instead of tuning itself.
    pub fn measures(&self, topo: Topology) -> bool {
        self.measured
            .iter()
            .any(|c| c.nodes == topo.nodes && c.ranks_per_node == topo.ranks_per_node)
    }
}
