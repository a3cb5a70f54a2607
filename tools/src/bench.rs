//! `ddl-bench`: allreduce bandwidth tables (nccl-tests style) under MPI, cost-model
//! calibration, and cost-model simulation of large runs.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use ddl_comm::calibrate::{calls_for, mean_call_time};
use ddl_comm::World;
use ddl_comm::{
    bf16, f16, Across, Algorithm, Allreducer, CostModel, Element, Multiring, ShardAlgorithm,
    Topology, Transport,
};
use ddl_sim::step::{crossover_batch, HeadExchange, Step};
use serde::Serialize;

use ddl_loader::units::parse_size;

/// Smallest allreduce message: one f32.
pub const MIN_MESSAGE_BYTES: usize = 4;

/// Parses an allreduce message size ([`parse_size`]) of at least [`MIN_MESSAGE_BYTES`].
pub fn parse_message_bytes(s: &str) -> Result<usize> {
    let n = usize::try_from(parse_size(s).map_err(anyhow::Error::msg)?)?;
    if n < MIN_MESSAGE_BYTES {
        bail!("{n} bytes is below {MIN_MESSAGE_BYTES} bytes (one f32)");
    }
    Ok(n)
}

/// Options of `ddl-bench allreduce`.
#[derive(Clone, Debug)]
pub struct AllreduceOpts {
    /// Algorithms to measure, in order.
    pub algos: Vec<Algorithm>,
    /// Smallest message in bytes (rounded down to whole f32).
    pub min_bytes: usize,
    /// Largest message in bytes.
    pub max_bytes: usize,
    /// Size multiplier between rows.
    pub factor: usize,
    /// Untimed calls per size.
    pub warmup: usize,
    /// Timed calls per size from 1 MiB up; more below ([`calls_for`]).
    pub iters: usize,
    /// Cost model for `auto` and for the predicted column.
    pub model: CostModel,
    /// Print the model's prediction and measured / predicted per row (a model file was given).
    pub predict: bool,
    /// Element type of the buffers.
    pub dtype: Dtype,
}

impl AllreduceOpts {
    /// Checks the sizes and counts before any MPI work; errors name the flag.
    pub fn validate(&self) -> Result<()> {
        if self.algos.is_empty() {
            bail!("--algos names no algorithm");
        }
        if self.min_bytes < MIN_MESSAGE_BYTES || self.max_bytes < MIN_MESSAGE_BYTES {
            bail!(
                "--min-bytes {} and --max-bytes {} must be at least {MIN_MESSAGE_BYTES} bytes \
                 (one f32)",
                self.min_bytes,
                self.max_bytes
            );
        }
        if self.min_bytes > self.max_bytes {
            bail!(
                "--min-bytes {} is larger than --max-bytes {}: the table would be empty; swap \
                 them",
                self.min_bytes,
                self.max_bytes
            );
        }
        if self.factor < 2 {
            bail!(
                "--step-factor {} must be at least 2 (the size multiplier between rows)",
                self.factor
            );
        }
        if self.iters == 0 {
            bail!("--iters must be at least 1 (the timed calls per size)");
        }
        Ok(())
    }

    /// The message sizes of the table: `min_bytes` rounded down to whole f32, times
    /// `factor`, up to `max_bytes`.
    pub fn sizes(&self) -> Vec<usize> {
        let mut sizes = Vec::new();
        let mut s = self.min_bytes / 4 * 4;
        while s <= self.max_bytes && s > 0 {
            sizes.push(s);
            s = match s.checked_mul(self.factor) {
                Some(next) => next,
                None => break,
            };
        }
        sizes
    }
}

/// One row of the allreduce table (also the `--json` line).
#[derive(Clone, Debug, Serialize)]
pub struct AllreduceRow {
    /// Algorithm (as given).
    pub algo: String,
    /// Element type.
    pub dtype: Dtype,
    /// Number of ranks.
    pub ranks: usize,
    /// Message size in bytes.
    pub bytes: usize,
    /// Timed calls.
    pub calls: usize,
    /// Mean time per call of the timed calls, back to back, on the slowest rank,
    /// microseconds ([`mean_call_time`]).
    pub time_us: f64,
    /// bytes / time, GB/s (10^9).
    pub algbw_gbps: f64,
    /// algbw x 2(p-1)/p, GB/s.
    pub busbw_gbps: f64,
    /// Bitwise equal to MPI_Allreduce on every rank (integer-valued data, exact sums).
    pub correct: bool,
    /// What `auto` ran at this size (its online tuning's choice, or the cost model's with a
    /// measured model); absent for other algorithms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolved: Option<String>,
    /// Calls `auto` spent trying the candidates at this size before the timed ones (not
    /// timed); absent for other algorithms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tuning_calls: Option<usize>,
    /// What `auto`'s tuning timed at this size: each candidate's time per call,
    /// microseconds (absent unless it tuned here), to tell a wrong choice from a slow host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tuned_us: Option<Vec<(String, f64)>>,
    /// The cost model's predicted time, microseconds (with a model file).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_us: Option<f64>,
    /// Measured / predicted time (with a model file).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
}

/// Integer-valued test data: sums are exact in f32 in any order (and rounded once to f16 /
/// bf16), so every algorithm must match MPI_Allreduce bitwise.
fn fill<T: Element>(buf: &mut [T], rank: usize, salt: usize) {
    for (i, v) in buf.iter_mut().enumerate() {
        *v = T::from_f32(((i * 7919 + rank * 104_729 + salt * 31) % 2001) as f32 - 1000.0);
    }
}

/// The element type of `ddl-bench allreduce --dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// 32-bit float.
    F32,
    /// IEEE half precision (summed in f32, rounded once).
    F16,
    /// bfloat16 (summed in f32, rounded once).
    Bf16,
}

/// Runs the allreduce table on the MPI world; rank 0 writes the table (or JSON lines) to
/// `out` and returns the rows (other ranks return an empty list).
pub fn allreduce(
    world: &World,
    opts: &AllreduceOpts,
    json: bool,
    out: &mut dyn Write,
) -> Result<Vec<AllreduceRow>> {
    match opts.dtype {
        Dtype::F32 => allreduce_of::<f32>(world, opts, json, out),
        Dtype::F16 => allreduce_of::<f16>(world, opts, json, out),
        Dtype::Bf16 => allreduce_of::<bf16>(world, opts, json, out),
    }
}

/// [`allreduce`] on buffers of `T`.
fn allreduce_of<T: Element + Default>(
    world: &World,
    opts: &AllreduceOpts,
    json: bool,
    out: &mut dyn Write,
) -> Result<Vec<AllreduceRow>> {
    let t: Arc<dyn Transport> = world.transport();
    let p = world.size();
    let topo = world.topology();
    let rank = world.rank();
    opts.validate()?;
    let sizes = opts.sizes();
    let size = std::mem::size_of::<T>();
    let max_elems = sizes.last().copied().unwrap_or(0) / size;
    let mut buf = vec![T::default(); max_elems];
    let mut reference = vec![T::default(); max_elems];
    let mpi = Allreducer::with_model(t.clone(), Algorithm::Mpi, topo, opts.model.clone())?;
    if rank == 0 && !json {
        write_header(out, opts, p, topo)?;
    }
    let reducers = opts
        .algos
        .iter()
        .map(|algo| {
            Allreducer::with_model(t.clone(), algo.clone(), topo, opts.model.clone())
                .with_context(|| format!("algorithm {algo}"))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut rows = Vec::new();
    // Size by size, the algorithms taking turns: `auto` is timed next to the algorithm it
    // picks, under the same load (one after the other over all sizes, minutes apart on a
    // shared machine, they met different bursts of other tenants' load).
    for (salt, &bytes) in sizes.iter().enumerate() {
        for (algo, ar) in opts.algos.iter().zip(&reducers) {
            let n = bytes / size;
            let correct =
                agrees_with_mpi(&mpi, ar, &mut buf[..n], &mut reference[..n], rank, salt)?;
            let calls = calls_for(bytes, opts.iters);
            let tuning_calls = finish_tuning(ar, &mut buf[..n])?;
            let tuned = ar.take_tuned().pop().map(|c| {
                c.timings
                    .iter()
                    .map(|(a, s)| (a.to_string(), s * 1e6))
                    .collect()
            });
            let time = mean_call_time(&*t, ar, &mut buf[..n], opts.warmup, calls)?;
            if rank != 0 {
                continue;
            }
            let algbw = bytes as f64 / time / 1e9;
            let busbw = algbw * 2.0 * (p as f64 - 1.0) / p as f64;
            // `auto` is predicted as the algorithm it ran: the model's own pick may be one
            // `auto` never runs here (multiring over one tier is the ring).
            let ran = ar.resolve(4 * n);
            let predicted = opts.predict.then(|| opts.model.predict(&ran, bytes, topo));
            let row = AllreduceRow {
                algo: algo.to_string(),
                dtype: opts.dtype,
                ranks: p,
                bytes,
                calls,
                time_us: time * 1e6,
                algbw_gbps: algbw,
                busbw_gbps: busbw,
                correct,
                resolved: (*algo == Algorithm::Auto).then(|| ran.to_string()),
                tuning_calls: (*algo == Algorithm::Auto).then_some(tuning_calls),
                tuned_us: tuned,
                predicted_us: predicted.map(|t| t * 1e6),
                ratio: predicted.map(|t| time / t),
            };
            write_row(out, &row, n, json)?;
            rows.push(row);
        }
    }
    Ok(rows)
}

/// The table's title and column heads.
fn write_header(
    out: &mut dyn Write,
    opts: &AllreduceOpts,
    p: usize,
    topo: ddl_comm::Topology,
) -> Result<()> {
    writeln!(
        out,
        "# ddl-bench allreduce: {p} ranks ({} node(s) x {}), warmup {}, iters {}; time = mean of back-to-back calls on the slowest rank",
        topo.nodes, topo.ranks_per_node, opts.warmup, opts.iters
    )?;
    if opts.predict {
        writeln!(out, "# cost model: {}", opts.model.source)?;
    }
    write!(
        out,
        "# {:>12} {:>12} {:>11} {:>12} {:>12} {:>12} {:>8}",
        "algo", "size(B)", "count", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "correct"
    )?;
    if opts.predict {
        write!(out, " {:>12} {:>10}", "pred(us)", "meas/pred")?;
    }
    writeln!(out)?;
    Ok(())
}

/// Whether `ar` gives every rank the bits `MPI_Allreduce` gives, on inputs that depend on the
/// rank and `salt` (`check` and `reference`: buffers of the message's length).
fn agrees_with_mpi<T: Element>(
    mpi: &Allreducer,
    ar: &Allreducer,
    check: &mut [T],
    reference: &mut [T],
    rank: usize,
    salt: usize,
) -> Result<bool> {
    fill(check, rank, salt);
    fill(reference, rank, salt);
    mpi.allreduce(reference, false)?;
    ar.allreduce(check, false)?;
    let bad = check
        .iter()
        .zip(reference.iter())
        .filter(|(a, b)| a.to_f32().to_bits() != b.to_f32().to_bits())
        .count();
    let mut flags = [bad.min(1) as f32];
    mpi.allreduce_f32(&mut flags, false)?;
    Ok(flags[0] == 0.0)
}

/// One measured row as a JSON line or a table row (`n`: elements).
fn write_row(out: &mut dyn Write, row: &AllreduceRow, n: usize, json: bool) -> Result<()> {
    if json {
        writeln!(out, "{}", serde_json::to_string(row)?)?;
    } else {
        write!(
            out,
            "  {:>12} {:>12} {:>11} {:>12.1} {:>12.3} {:>12.3} {:>8}",
            row.algo,
            row.bytes,
            n,
            row.time_us,
            row.algbw_gbps,
            row.busbw_gbps,
            if row.correct { "yes" } else { "NO" }
        )?;
        if let (Some(pred), Some(ratio)) = (row.predicted_us, row.ratio) {
            write!(out, " {pred:>12.1} {ratio:>10.2}")?;
        }
        if let Some(r) = &row.resolved {
            write!(out, "  (auto ran {r})")?;
        }
        writeln!(out)?;
    }
    out.flush()?;
    Ok(())
}

/// Runs `auto`'s remaining trial calls on `buf` (every rank makes the same calls), so that
/// the timed calls see what it settled on; returns how many it made.
fn finish_tuning<T: Element>(ar: &Allreducer, buf: &mut [T]) -> Result<usize> {
    let mut calls = 0;
    while ar.tuning(4 * buf.len()) {
        ar.allreduce(buf, false)?;
        calls += 1;
    }
    Ok(calls)
}

/// The models `ddl-bench sim --model` knows ([`backbone`]), as listed in its help and errors.
pub const SIM_MODELS: [&str; 5] = ["resnet18", "resnet34", "resnet50", "resnet101", "resnet152"];

/// A model the simulator knows, as torchvision has it.
pub struct Backbone {
    /// Parameters without the classifier.
    pub params: u64,
    /// Width of the features the classifier reads (512 for the BasicBlock ResNets, 2048 for
    /// the Bottleneck ones).
    pub features: u64,
    /// Multiply-accumulates of one 224 px forward pass, in billions (torchvision's "GFLOPS").
    pub gmac: f64,
}

/// The model `name` as the simulator knows it, or `None` for a model it does not.
pub fn backbone(name: &str) -> Option<Backbone> {
    let (params, features, gmac) = match name {
        "resnet18" => (11_176_512, 512, 1.81),
        "resnet34" => (21_284_672, 512, 3.66),
        "resnet50" => (23_508_032, 2048, 4.09),
        "resnet101" => (42_500_160, 2048, 7.80),
        "resnet152" => (58_143_808, 2048, 11.51),
        _ => return None,
    };
    Some(Backbone {
        params,
        features,
        gmac,
    })
}

/// Parameter count of a model known to the simulator with a `classes`-way head: the backbone
/// plus `features x classes` weights and `classes` biases (ResNet-101 at ImageNet-22k's 21,841
/// classes: 87,252,369).
pub fn model_params(name: &str, classes: u64) -> Option<u64> {
    backbone(name).map(|b| b.params + (b.features + 1) * classes)
}

/// Compute time of one training step per GPU in ms that `ddl-bench sim` assumes when none is
/// given: the 150 ms of DDL's ResNet-50 step on a P100 (BENCHMARKS.md, "Cost model") scaled
/// by the model's forward cost with its head (ResNet-101 at 21,841 classes: 288 ms).
pub fn default_step_compute_ms(name: &str, classes: u64) -> Option<f64> {
    let cost = |b: &Backbone, classes: u64| b.gmac + (b.features * classes) as f64 / 1e9;
    let resnet50 = backbone("resnet50")?;
    backbone(name).map(|b| 150.0 * cost(&b, classes) / cost(&resnet50, 1000))
}

/// A scaling efficiency PowerAI DDL published for 64 nodes x 4 P100 GPUs (Cho et al. 2017,
/// arXiv:1708.02188).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Published {
    /// Scaling efficiency at 256 GPUs, in [0, 1].
    pub efficiency: f64,
    /// The run it was measured on.
    pub run: &'static str,
}

/// DDL's published figure for the run closest to `model` with `classes` classes: ResNet-101 on
/// ImageNet-22k (88%) for resnet101 with more than 1,000 classes, otherwise ResNet-50 on
/// ImageNet-1k (95%).
pub fn published(model: &str, classes: u64) -> Published {
    if model == "resnet101" && classes > 1000 {
        Published {
            efficiency: 0.88,
            run: "ResNet-101, ImageNet-22k",
        }
    } else {
        Published {
            efficiency: 0.95,
            run: "ResNet-50, ImageNet-1k",
        }
    }
}

/// What `ddl-bench sim` simulates: a model, its head and the batch per GPU.
#[derive(Clone, Copy, Debug)]
pub struct SimModel {
    /// Parameters of the backbone (everything but the classifier).
    pub backbone: u64,
    /// Features the classifier reads.
    pub features: u64,
    /// Classes of the classifier.
    pub classes: u64,
    /// Images per GPU per step.
    pub batch: usize,
}

impl SimModel {
    /// Parameters of the whole model: the backbone plus `features x classes` weights and
    /// `classes` biases (ResNet-101 at ImageNet-22k's 21,841 classes: 87,252,369).
    pub fn params(&self) -> u64 {
        self.backbone + (self.features + 1) * self.classes
    }
}

/// One predicted row of `ddl-bench sim`.
#[derive(Clone, Debug, Serialize)]
pub struct SimRow {
    /// Algorithm.
    pub algo: String,
    /// Ranks (GPUs).
    pub ranks: usize,
    /// Gradient bytes allreduced (fp32): the whole model's, or the backbone's for `hybrid`.
    pub bytes: usize,
    /// `hybrid` rows: predicted time of the head's exchange per step (allgather of the
    /// features, the softmax's sums, reduce-scatter of their gradient), ms; on the critical
    /// path, never overlapped.
    pub exchange_ms: f64,
    /// Predicted allreduce time per step, ms.
    pub allreduce_ms: f64,
    /// Compute time per step, ms.
    pub compute_ms: f64,
    /// compute / (compute + exposed allreduce), exposed = allreduce x (1 - overlap).
    pub efficiency: f64,
}

/// Predicts per-step allreduce time and scaling efficiency of every algorithm for `m` on
/// `nodes x gpus_per_node` GPUs, in three layouts: one rank per GPU (`flat`); ddl's layout of
/// one rank per node whose GPUs' gradients are first summed inside the node (`node`: an
/// intra-node allreduce over NVLink, then the algorithm over one rank per node); and one rank
/// per GPU with the head split by class over all GPUs (`hybrid`, ddl-train's
/// `--head-parallel`): the algorithm allreduces the backbone's gradient only, and the head's
/// exchange (ring or shared memory, as `auto` picks) is added in full. `overlap` is the
/// fraction of the allreduce hidden behind backward compute.
pub fn simulate(
    model: &CostModel,
    nodes: usize,
    gpus_per_node: usize,
    m: SimModel,
    compute_ms: f64,
    overlap: f64,
) -> Vec<SimRow> {
    let flat = Topology::new(nodes, gpus_per_node);
    let per_node = Topology::new(nodes, 1);
    let bytes = m.params() as usize * 4;
    let algos = [
        Algorithm::Ring,
        Algorithm::Rhd,
        Algorithm::MULTICOLOR,
        Algorithm::Multiring(Multiring {
            dims: Vec::new(),
            segments: 0,
        }),
        Algorithm::hierarchical(Across::Rhd),
        Algorithm::Auto,
    ];
    let in_node = model.predict(&Algorithm::Ring, bytes, Topology::flat(gpus_per_node));
    let backbone = m.backbone as usize * 4;
    let exchange = Step {
        gradient_bytes: 0,
        head: Some(HeadExchange {
            features: m.features as usize,
            global_batch: flat.ranks() * m.batch,
        }),
    }
    .predict(model, &Algorithm::Auto, &ShardAlgorithm::Auto, flat)
        * 1e3;
    let mut rows = Vec::new();
    let layouts = [
        ("flat", flat, bytes, 0.0, 0.0),
        ("node", per_node, bytes, in_node, 0.0),
        ("hybrid", flat, backbone, 0.0, exchange),
    ];
    for (layout, topo, bytes, extra, exchange_ms) in layouts {
        for a in &algos {
            let t = (model.predict(a, bytes, topo) + extra) * 1e3;
            let name = match a {
                Algorithm::Auto => format!("auto={}", model.choose(bytes, topo)),
                other => other.to_string(),
            };
            let exposed = t * (1.0 - overlap.clamp(0.0, 1.0)) + exchange_ms;
            rows.push(SimRow {
                algo: format!("{layout}/{name}"),
                ranks: flat.ranks(),
                bytes,
                exchange_ms,
                allreduce_ms: t,
                compute_ms,
                efficiency: compute_ms / (compute_ms + exposed),
            });
        }
    }
    rows
}

/// What a `sim` table is of: the layout, the model and the reference figure.
#[derive(Clone, Copy, Debug)]
pub struct SimSetup<'a> {
    /// Nodes.
    pub nodes: usize,
    /// GPUs (ranks) per node.
    pub gpus: usize,
    /// Model name.
    pub model: &'a str,
    /// The model simulated.
    pub shape: SimModel,
    /// Fraction of the allreduce hidden behind backward compute.
    pub overlap: f64,
}

/// Writes the `sim` table with DDL's published efficiency at 256 GPUs for the closest run
/// ([`published`]) as the reference, and the crossover global batch of the `hybrid` rows.
pub fn print_sim(
    out: &mut dyn Write,
    rows: &[SimRow],
    setup: &SimSetup<'_>,
    cost: &CostModel,
) -> Result<()> {
    let SimSetup {
        nodes,
        gpus,
        model: model_name,
        shape,
        overlap,
    } = *setup;
    let classes = shape.classes;
    let reference = published(model_name, classes);
    let target = reference.efficiency;
    let Some(first) = rows.first() else {
        return Ok(());
    };
    let params = shape.params() as f64;
    writeln!(
        out,
        "# sim: {nodes} nodes x {gpus} GPUs = {} ranks, {model_name} with {classes} classes ({:.1}M params, {:.1} MB fp32), step compute {:.1} ms, cost model: {}",
        first.ranks,
        params / 1e6,
        params * 4.0 / 1e6,
        first.compute_ms,
        cost.source
    )?;
    writeln!(
        out,
        "# exposed-allreduce budget for DDL's published {:.0}% scaling efficiency ({}, 256 GPUs): {:.2} ms per step; overlap {:.0}%",
        target * 100.0,
        reference.run,
        first.compute_ms * (1.0 / target - 1.0),
        overlap * 100.0
    )?;
    writeln!(
        out,
        "# flat = one rank per GPU; node = GPUs summed inside the node first, then one rank per node"
    )?;
    writeln!(
        out,
        "# hybrid = one rank per GPU, the head split by class over all GPUs (ddl-train --head-parallel): the backbone's {:.1} MB allreduced, and the features of the global batch of {} ({} per GPU) exchanged, never overlapped; it sends fewer bytes than flat below a global batch of {:.0}",
        shape.backbone as f64 * 4.0 / 1e6,
        first.ranks * shape.batch,
        shape.batch,
        crossover_batch(shape.features as usize, classes as usize)
    )?;
    writeln!(
        out,
        "# {:>28} {:>14} {:>12} {:>12} {:>11} {:>12}",
        "algo",
        "allreduce(ms)",
        "exchange(ms)",
        "step(ms)",
        "efficiency",
        format!("vs DDL {:.0}%", target * 100.0)
    )?;
    for r in rows {
        writeln!(
            out,
            "  {:>28} {:>14.2} {:>12.2} {:>12.2} {:>10.1}% {:>+11.1}pt",
            r.algo,
            r.allreduce_ms,
            r.exchange_ms,
            r.compute_ms / r.efficiency,
            r.efficiency * 100.0,
            (r.efficiency - target) * 100.0
        )?;
    }
    Ok(())
}

/// The timeout all `ddl-bench` MPI runs use unless told otherwise.
pub const DEFAULT_BENCH_TIMEOUT: Duration = Duration::from_secs(120);

#[cfg(test)]
mod tests {
    use super::*;

    /// Every model the help lists is one the simulator knows, stages included.
    #[test]
    fn every_sim_model_listed_is_known() {
        for name in SIM_MODELS {
            assert!(backbone(name).is_some(), "{name}");
            assert!(ddl_sim::resnet::stages(name, 1000, 224).is_some(), "{name}");
        }
    }

    fn model_params(name: &str, classes: u64) -> Option<u64> {
        backbone(name).map(
            |Backbone {
                 params: backbone,
                 features,
                 ..
             }| {
                SimModel {
                    backbone,
                    features,
                    classes,
                    batch: 1,
                }
                .params()
            },
        )
    }

    #[test]
    fn parameter_counts_follow_the_head() {
        // torchvision's counts at 1,000 classes.
        for (model, count) in [
            ("resnet18", 11_689_512),
            ("resnet34", 21_797_672),
            ("resnet50", 25_557_032),
            ("resnet101", 44_549_160),
            ("resnet152", 60_192_808),
        ] {
            assert_eq!(model_params(model, 1000), Some(count), "{model}");
        }
        // ImageNet-22k: the 2048 x 21,841 + 21,841 head (44.75 M) is over half of ResNet-101.
        assert_eq!(model_params("resnet50", 21_841), Some(68_260_241));
        assert_eq!(model_params("resnet101", 21_841), Some(87_252_369));
        assert_eq!(model_params("resnet18", 10), Some(11_176_512 + 513 * 10));
        assert_eq!(model_params("vgg16", 1000), None);
    }

    #[test]
    fn the_reference_is_ddls_run_closest_to_the_model() {
        assert_eq!(published("resnet101", 21_841).efficiency, 0.88);
        assert_eq!(published("resnet50", 1000).efficiency, 0.95);
        assert_eq!(published("resnet101", 1000).efficiency, 0.95);
    }
}
