//! Alpha-beta-gamma cost model per network tier, used to pick an algorithm (`auto`) and to
//! simulate large runs (`ddl-bench sim`).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::algorithm::Algorithm;
use crate::allreduce::multicolor::step_load;
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

    /// This tier with `beta` resolved for a `bytes` buffer.
    fn at(&self, bytes: usize) -> Tier {
        Tier {
            name: String::new(),
            alpha: self.alpha,
            beta: self.beta_at(bytes),
            gamma: self.gamma,
            beta_curve: Vec::new(),
        }
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
    /// The ranks share too few cores for node-local and cross-node transfers of one step to
    /// overlap (an emulated cluster on one machine, or more ranks than cores): a pipelined
    /// step then costs the sum of its tiers' transfer times instead of the larger one.
    #[serde(default)]
    pub serial_tiers: bool,
}

impl Default for CostModel {
    /// A conservative shared-memory / 10 GbE guess, used when nothing was measured.
    fn default() -> Self {
        CostModel {
            intra: Tier::new("shm", 2e-6, 1.0 / 5e9, 1.0 / 5e9),
            inter: Tier::new("10gbe", 20e-6, 1.0 / 1.1e9, 1.0 / 5e9),
            source: "default".into(),
            serial_tiers: false,
        }
    }
}

impl CostModel {
    /// IBM "Minsky" S822LC nodes as used by PowerAI DDL: 4 P100 per node over NVLink
    /// (~40 GB/s per direction), nodes over InfiniBand EDR (~12 GB/s), GPU reduction at
    /// HBM speed.
    pub fn minsky() -> CostModel {
        CostModel {
            intra: Tier::new("nvlink", 8e-6, 1.0 / 40e9, 1.0 / 200e9),
            inter: Tier::new("infiniband-edr", 5e-6, 1.0 / 12e9, 1.0 / 200e9),
            source: "preset minsky".into(),
            serial_tiers: false,
        }
    }

    /// A named preset (`minsky`, `default`).
    pub fn preset(name: &str) -> Result<CostModel> {
        match name {
            "minsky" => Ok(CostModel::minsky()),
            "default" => Ok(CostModel::default()),
            _ => Err(CommError::InvalidArgument(format!(
                "unknown cost-model preset {name:?} (expected minsky or default)"
            ))),
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

    /// Predicted seconds of one allreduce of `bytes` (f32) with `algorithm` over `topo`.
    /// `Mpi` is modelled as the better of ring and rhd (what MPI libraries choose between);
    /// `Auto` as the best prediction.
    pub fn predict(&self, algorithm: &Algorithm, bytes: usize, topo: Topology) -> f64 {
        let n = bytes as f64;
        let p = topo.ranks();
        if p <= 1 || bytes == 0 {
            return 0.0;
        }
        let g = topo.ranks_per_node;
        let multi_node = topo.nodes > 1;
        let intra_tier = self.intra.at(bytes);
        let inter_tier = self.inter.at(bytes);
        let (intra_t, inter_t) = (&intra_tier, &inter_tier);
        // The tier a flat algorithm's slowest step runs on.
        let flat = if multi_node { inter_t } else { intra_t };
        match algorithm {
            Algorithm::Ring => {
                let pf = p as f64;
                2.0 * (pf - 1.0) * (flat.alpha + n / pf * flat.beta)
                    + (pf - 1.0) * n / pf * flat.gamma
            }
            Algorithm::Rhd => {
                let pow = 1usize << (usize::BITS - 1 - p.leading_zeros());
                let extra = p - pow;
                let mut t = 0.0;
                if extra > 0 {
                    let tier = if g >= 2 || !multi_node {
                        intra_t
                    } else {
                        inter_t
                    };
                    t += 2.0 * (tier.alpha + n * tier.beta) + n * tier.gamma;
                }
                let mut d = 1;
                let mut size = n;
                while d < pow {
                    size /= 2.0;
                    let (tier, share) = if d < g || !multi_node {
                        (intra_t, 1.0)
                    } else {
                        (inter_t, g as f64)
                    };
                    // Halving (with reduction) and doubling move the same bytes.
                    t += 2.0 * (tier.alpha + size * share * tier.beta) + size * tier.gamma;
                    d *= 2;
                }
                t
            }
            Algorithm::Multiring { dims } => {
                let dims = if dims.is_empty() {
                    topo.dims()
                } else {
                    dims.clone()
                };
                let mut t = 0.0;
                let mut inner = 1usize;
                let mut size = n;
                for &d in &dims {
                    if d <= 1 {
                        continue;
                    }
                    let df = d as f64;
                    let intra = !multi_node || inner * d <= g;
                    let (tier, share) = if intra {
                        (intra_t, 1.0)
                    } else {
                        (inter_t, inner.min(g) as f64)
                    };
                    t += 2.0 * (df - 1.0) * (tier.alpha + size / df * share * tier.beta)
                        + (df - 1.0) * size / df * tier.gamma;
                    size /= df;
                    inner *= d;
                }
                t
            }
            Algorithm::Multicolor {
                colors,
                chunk_bytes,
            } => {
                let k = (*colors).clamp(1, p);
                let load = step_load(topo, k);
                let (intra_chunks, inter_chunks, height) = (load.intra, load.inter, load.height);
                let per_color = n / k as f64;
                let chunk = ((*chunk_bytes).max(4) as f64).min(per_color);
                let chunks = (per_color / chunk).ceil();
                // Every chunk crosses each tree edge once up (reduce) and once down
                // (broadcast): per chunk, a rank's node-local links and a node's NIC (shared
                // by its ranks) carry their edge counts. Filling and draining the pipeline
                // adds 2H steps of one chunk over one link.
                let intra = intra_chunks as f64 * chunk * intra_t.beta;
                let inter = inter_chunks as f64 * chunk * inter_t.beta;
                let link = if inter_chunks > 0 { inter_t } else { intra_t };
                // The busiest rank adds `adds` child chunks per step.
                let fan_in = load.adds as f64;
                let step = if self.serial_tiers {
                    intra + inter
                } else {
                    intra.max(inter)
                };
                chunks * (link.alpha + step + fan_in * chunk * flat.gamma)
                    + 2.0 * height as f64 * (link.alpha + chunk * link.beta)
            }
            Algorithm::Mpi => self
                .predict(&Algorithm::Ring, bytes, topo)
                .min(self.predict(&Algorithm::Rhd, bytes, topo)),
            Algorithm::Auto => {
                let best = self.choose(bytes, topo);
                self.predict(&best, bytes, topo)
            }
        }
    }

    /// The algorithm (ring, rhd, multiring over the topology, or multicolor with default
    /// parameters) with the smallest predicted time for `bytes` over `topo`.
    pub fn choose(&self, bytes: usize, topo: Topology) -> Algorithm {
        let candidates = [
            Algorithm::Ring,
            Algorithm::Rhd,
            Algorithm::Multiring { dims: Vec::new() },
            Algorithm::Multicolor {
                colors: crate::algorithm::DEFAULT_COLORS,
                chunk_bytes: crate::algorithm::DEFAULT_CHUNK_BYTES,
            },
        ];
        let mut best = Algorithm::Ring;
        let mut best_t = f64::INFINITY;
        for a in candidates {
            let t = self.predict(&a, bytes, topo);
            if t < best_t {
                best_t = t;
                best = a;
            }
        }
        best
    }
}
