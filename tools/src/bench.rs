//! `ddl-bench`: allreduce bandwidth tables (nccl-tests style) under MPI, cost-model
//! calibration, and cost-model simulation of large runs.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ddl_comm::mpi::World;
use ddl_comm::{Algorithm, Allreducer, CostModel, MpiCurve, Tier, Topology, Transport};
use serde::Serialize;

/// Parses a byte count: `4096`, `4K`/`4KiB`, `256M`/`256MiB`, `1G`/`1GiB` (powers of 1024).
pub fn parse_bytes(s: &str) -> Result<usize> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let stripped = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .unwrap_or(&lower);
    let (num, mult) = match stripped.chars().last() {
        Some('k') => (&stripped[..stripped.len() - 1], 1usize << 10),
        Some('m') => (&stripped[..stripped.len() - 1], 1 << 20),
        Some('g') => (&stripped[..stripped.len() - 1], 1 << 30),
        _ => (stripped, 1),
    };
    let n: usize = num
        .trim()
        .parse()
        .with_context(|| format!("bad byte count {s:?} (e.g. 4096, 4K, 256MiB)"))?;
    n.checked_mul(mult)
        .with_context(|| format!("byte count {s:?} is too large"))
}

/// Smallest allreduce message: one f32.
pub const MIN_MESSAGE_BYTES: usize = 4;

/// Parses an allreduce message size ([`parse_bytes`]) of at least [`MIN_MESSAGE_BYTES`].
pub fn parse_message_bytes(s: &str) -> Result<usize> {
    let n = parse_bytes(s)?;
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
    /// Timed calls per size (the median is reported).
    pub iters: usize,
    /// Cost model for `auto` and for the predicted column.
    pub model: CostModel,
    /// Print the model's prediction and measured / predicted per row (a model file was given).
    pub predict: bool,
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
    /// Number of ranks.
    pub ranks: usize,
    /// Message size in bytes.
    pub bytes: usize,
    /// Median over iterations of the slowest rank's time, microseconds.
    pub time_us: f64,
    /// bytes / time, GB/s (10^9).
    pub algbw_gbps: f64,
    /// algbw x 2(p-1)/p, GB/s.
    pub busbw_gbps: f64,
    /// Bitwise equal to MPI_Allreduce on every rank (integer-valued data, exact sums).
    pub correct: bool,
    /// What `auto` ran at this size (the cost model's choice); absent for other algorithms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolved: Option<String>,
    /// The cost model's predicted time, microseconds (with a model file).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_us: Option<f64>,
    /// Measured / predicted time (with a model file).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// Rank 0 gets, per entry, the maximum of `local` over all ranks; others get `local` back.
fn max_over_ranks(t: &dyn Transport, local: &[f64]) -> Result<Vec<f64>> {
    let bytes: Vec<u8> = local.iter().flat_map(|v| v.to_le_bytes()).collect();
    if t.rank() != 0 {
        t.send(0, 900, &bytes)?;
        return Ok(local.to_vec());
    }
    let mut out = local.to_vec();
    let mut buf = vec![0u8; bytes.len()];
    for r in 1..t.size() {
        t.recv(r, 900, &mut buf)?;
        for (o, c) in out.iter_mut().zip(buf.chunks_exact(8)) {
            *o = o.max(f64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
    }
    Ok(out)
}

/// Integer-valued test data: sums are exact in any order, so every algorithm must match
/// MPI_Allreduce bitwise.
fn fill(buf: &mut [f32], rank: usize, salt: usize) {
    for (i, v) in buf.iter_mut().enumerate() {
        *v = ((i * 7919 + rank * 104_729 + salt * 31) % 2001) as f32 - 1000.0;
    }
}

/// Runs the allreduce table on the MPI world; rank 0 writes the table (or JSON lines) to
/// `out` and returns the rows (other ranks return an empty list).
pub fn allreduce(
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
    let max_elems = sizes.last().copied().unwrap_or(0) / 4;
    let mut buf = vec![0f32; max_elems];
    let mut reference = vec![0f32; max_elems];
    let mpi = Allreducer::with_model(t.clone(), Algorithm::Mpi, topo, opts.model.clone())?;
    if rank == 0 && !json {
        writeln!(
            out,
            "# ddl-bench allreduce: {p} ranks ({} node(s) x {}), warmup {}, iters {}; time = median over iterations of the slowest rank",
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
    }
    let mut rows = Vec::new();
    for algo in &opts.algos {
        let ar = Allreducer::with_model(t.clone(), algo.clone(), topo, opts.model.clone())
            .with_context(|| format!("algorithm {algo}"))?;
        for (salt, &bytes) in sizes.iter().enumerate() {
            let n = bytes / 4;
            // Correctness against MPI_Allreduce.
            let check = &mut buf[..n];
            fill(check, rank, salt);
            let refv = &mut reference[..n];
            fill(refv, rank, salt);
            mpi.allreduce_f32(refv, false)?;
            ar.allreduce_f32(check, false)?;
            let bad = check
                .iter()
                .zip(refv.iter())
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            let mut flags = [bad.min(1) as f32];
            mpi.allreduce_f32(&mut flags, false)?;
            let correct = flags[0] == 0.0;
            // Timing (averaging keeps values bounded).
            let data = &mut buf[..n];
            for _ in 0..opts.warmup {
                ar.allreduce_f32(data, true)?;
            }
            let mut times = Vec::with_capacity(opts.iters);
            for _ in 0..opts.iters {
                t.barrier()?;
                let start = Instant::now();
                ar.allreduce_f32(data, true)?;
                times.push(start.elapsed().as_secs_f64());
            }
            let mut slowest = max_over_ranks(&*t, &times)?;
            if rank != 0 {
                continue;
            }
            let time = median(&mut slowest);
            let algbw = bytes as f64 / time / 1e9;
            let busbw = algbw * 2.0 * (p as f64 - 1.0) / p as f64;
            let predicted = opts.predict.then(|| opts.model.predict(algo, bytes, topo));
            let row = AllreduceRow {
                algo: algo.to_string(),
                ranks: p,
                bytes,
                time_us: time * 1e6,
                algbw_gbps: algbw,
                busbw_gbps: busbw,
                correct,
                resolved: (*algo == Algorithm::Auto).then(|| ar.resolve(bytes).to_string()),
                predicted_us: predicted.map(|t| t * 1e6),
                ratio: predicted.map(|t| time / t),
            };
            if json {
                writeln!(out, "{}", serde_json::to_string(&row)?)?;
            } else {
                write!(
                    out,
                    "  {:>12} {:>12} {:>11} {:>12.1} {:>12.3} {:>12.3} {:>8}",
                    row.algo,
                    bytes,
                    n,
                    row.time_us,
                    algbw,
                    busbw,
                    if correct { "yes" } else { "NO" }
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
            rows.push(row);
        }
    }
    Ok(rows)
}

/// One-way message time between ranks 0 and `peer` (median of ping-pongs / 2), measured on
/// rank 0; every rank must call this.
fn pingpong(t: &dyn Transport, peer: usize, bytes: usize, reps: usize) -> Result<f64> {
    let mut buf = vec![0u8; bytes];
    let mut times = Vec::with_capacity(reps);
    t.barrier()?;
    for i in 0..reps + 3 {
        if t.rank() == 0 {
            let start = Instant::now();
            t.send(peer, 901, &buf)?;
            t.recv(peer, 902, &mut buf)?;
            if i >= 3 {
                times.push(start.elapsed().as_secs_f64() / 2.0);
            }
        } else if t.rank() == peer {
            t.recv(0, 901, &mut buf)?;
            t.send(0, 902, &buf)?;
        }
    }
    Ok(median(&mut times))
}

/// Fits `alpha + bytes * beta` to ping-pong times: alpha from the smallest message, beta as
/// the least-squares slope over messages of 64 KiB and more.
fn fit(points: &[(usize, f64)]) -> (f64, f64) {
    let alpha = points.first().map(|p| p.1).unwrap_or(0.0);
    let big: Vec<(f64, f64)> = points
        .iter()
        .filter(|p| p.0 >= 64 << 10)
        .map(|&(b, t)| (b as f64, t))
        .collect();
    let n = big.len() as f64;
    let mx = big.iter().map(|p| p.0).sum::<f64>() / n;
    let my = big.iter().map(|p| p.1).sum::<f64>() / n;
    let sxy: f64 = big.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = big.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let beta = if sxx > 0.0 {
        (sxy / sxx).max(1e-13)
    } else {
        1e-10
    };
    (alpha, beta)
}

/// Seconds per byte of `op(dst, src)` over 16 MiB buffers (median of 7 timed runs).
fn per_byte(op: impl Fn(&mut [f32], &[f32])) -> f64 {
    let n = 4 << 20;
    let src = vec![1.0f32; n];
    let mut dst = vec![0.5f32; n];
    let mut times: Vec<f64> = (0..7)
        .map(|_| {
            let start = Instant::now();
            op(&mut dst, &src);
            std::hint::black_box(&mut dst);
            start.elapsed().as_secs_f64()
        })
        .collect();
    median(&mut times) / (n * 4) as f64
}

/// Seconds per byte of an f32 `dst += src` (the reduction).
fn measure_gamma() -> f64 {
    per_byte(|dst, src| {
        for (d, s) in dst.iter_mut().zip(src) {
            *d += *s;
        }
    })
}

/// Seconds per byte of a memory copy.
fn measure_copy() -> f64 {
    per_byte(|dst, src| dst.copy_from_slice(src))
}

/// Timed calls per calibration point: many for latency-bound sizes, fewer for the large ones.
fn calibration_iters(bytes: usize) -> usize {
    match bytes {
        0..=65536 => 50,
        65537..=4194304 => 15,
        _ => 5,
    }
}

/// Median over `iters` calls of the slowest rank's time of an allreduce of `buf` with `ar`,
/// timed as `ddl-bench allreduce` times it (five untimed calls, its default `--warmup`,
/// then a barrier before each timed call); every rank of `t` must call this. The result is
/// meaningful on rank 0 of `t`.
fn allreduce_time(
    t: &Arc<dyn Transport>,
    ar: &Allreducer,
    buf: &mut [f32],
    iters: usize,
) -> Result<f64> {
    for _ in 0..5 {
        ar.allreduce_f32(buf, true)?;
    }
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        t.barrier()?;
        let start = Instant::now();
        ar.allreduce_f32(buf, true)?;
        times.push(start.elapsed().as_secs_f64());
    }
    let mut slowest = max_over_ranks(&**t, &times)?;
    Ok(median(&mut slowest))
}

/// Times of an `algo` allreduce over `t` in `topo` at each of `sizes` (see
/// [`allreduce_time`]), swept `passes` times over all sizes; per size the median of the
/// passes, so that a burst of load from other tenants of the machine, which lasts seconds,
/// spoils one pass rather than the curve. Like the benchmark, every size is a prefix of one
/// buffer of the largest size and one [`Allreducer`] serves all sizes: a fresh buffer per
/// size made the 4 MiB ring at np 2 take 3x its benchmark time (2.8 against 0.94 ms, median
/// of three passes). Every rank of `t` must call this; rank 0 of `t` gets the times.
fn sweep(
    t: &Arc<dyn Transport>,
    algo: &Algorithm,
    topo: Topology,
    sizes: &[usize],
    passes: usize,
) -> Result<Vec<f64>> {
    let ar = Allreducer::new(t.clone(), algo.clone(), topo)?;
    let mut buf = vec![1.0f32; sizes.iter().copied().max().unwrap_or(0) / 4];
    let mut times = vec![Vec::with_capacity(passes); sizes.len()];
    for _ in 0..passes.max(1) {
        for (&bytes, ts) in sizes.iter().zip(times.iter_mut()) {
            let data = &mut buf[..bytes / 4];
            ts.push(allreduce_time(t, &ar, data, calibration_iters(bytes))?);
        }
    }
    Ok(times.iter_mut().map(|ts| median(ts)).collect())
}

/// Transfer time per byte at several buffer sizes, from ring allreduce times over `t`
/// ([`sweep`]; inverting the ring formula `2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma`
/// at each size). Every rank of `t` must call this; rank 0 of `t` gets the curve.
fn ring_curve(
    t: &Arc<dyn Transport>,
    sizes: &[usize],
    passes: usize,
    alpha: f64,
    gamma: f64,
) -> Result<Vec<(usize, f64)>> {
    let p = t.size() as f64;
    let times = sweep(t, &Algorithm::Ring, Topology::flat(t.size()), sizes, passes)?;
    Ok(sizes
        .iter()
        .zip(times)
        .map(|(&bytes, time)| {
            let n = bytes as f64;
            let moved = 2.0 * (p - 1.0) / p * n;
            let beta = (time - 2.0 * (p - 1.0) * alpha - (p - 1.0) / p * n * gamma) / moved;
            (bytes, beta.max(1e-13))
        })
        .collect())
}

/// Measures the cost model under MPI, in the layout the benchmarks will run in (same
/// mpirun, same ranks per node), so that memory bandwidth and oversubscription are part of
/// the numbers:
/// - alpha and a base beta per tier from ping-pong between rank 0 and a rank on its node
///   (intra) and on the next node (inter);
/// - gamma from a timed f32 addition and the copy cost from a timed memcpy (all ranks at
///   once, so that ranks sharing cores are part of the numbers);
/// - a beta curve per tier from ring allreduce times at buffer sizes up to `max_bytes`:
///   the intra tier from a ring over each node's ranks (all nodes at once), the inter tier
///   from the flat ring over all ranks (every step of which crosses each node link once,
///   ranks being node-contiguous); `curve_ranks` records each ring's size. The sweep
///   doubles the size from 64 KiB to 64 MiB (the 1-32 MiB range is where the buffers
///   leave the caches), then quadruples it;
/// - MPI_Allreduce itself (ddl's `mpi`) at the benchmark's sizes, 4 KiB x 4^k up to
///   `max_bytes`, timed like the benchmark: stored as the model's [`MpiCurve`] for this
///   layout, since Open MPI's own implementation is outside the round model.
///
/// Each sweep runs `passes` times, per size the median ([`sweep`]). A tier that this layout
/// cannot measure copies the other one (noted in `source`).
pub fn calibrate(world: &World, max_bytes: usize, passes: usize) -> Result<CostModel> {
    let t: Arc<dyn Transport> = world.transport();
    let topo = world.topology();
    if world.size() < 2 {
        bail!("calibrate needs at least 2 ranks (mpirun -np 2 or more)");
    }
    let sizes = [
        8usize,
        1 << 10,
        16 << 10,
        64 << 10,
        256 << 10,
        1 << 20,
        4 << 20,
    ];
    let curve_sizes: Vec<usize> = (16..=30)
        .filter(|k| k <= &26 || k % 2 == 0)
        .map(|k| 1usize << k)
        .filter(|&b| b <= max_bytes.max(64 << 10))
        .collect();
    let mpi_sizes: Vec<usize> = (12..=30)
        .step_by(2)
        .map(|k| 1usize << k)
        .filter(|&b| b <= max_bytes.max(4 << 10))
        .collect();
    let gamma = measure_gamma();
    let copy = measure_copy();
    let measure = |peer: usize, name: &str| -> Result<Tier> {
        let mut points = Vec::new();
        for &b in &sizes {
            let reps = if b <= 64 << 10 { 200 } else { 30 };
            points.push((b, pingpong(&*t, peer, b, reps)?));
        }
        let (alpha, beta) = fit(&points);
        Ok(Tier::new(name, alpha, beta, gamma))
    };
    let mut intra = (topo.ranks_per_node > 1)
        .then(|| measure(1, "intra"))
        .transpose()?;
    let mut inter = (topo.nodes > 1)
        .then(|| measure(topo.ranks_per_node, "inter"))
        .transpose()?;
    if let Some(tier) = intra.as_mut() {
        let node: Arc<dyn Transport> = Arc::from(t.split(world.node_index(), world.local_rank())?);
        tier.beta_curve = ring_curve(&node, &curve_sizes, passes, tier.alpha, gamma)?;
        tier.curve_ranks = node.size();
        // Rank 0 of the world is rank 0 of node 0: its curve is the one kept.
        t.barrier()?;
    }
    if let Some(tier) = inter.as_mut() {
        tier.beta_curve = ring_curve(&t, &curve_sizes, passes, tier.alpha, gamma)?;
        tier.curve_ranks = t.size();
    }
    let mpi_times = sweep(&t, &Algorithm::Mpi, topo, &mpi_sizes, passes)?;
    let mpi_points = mpi_sizes.iter().copied().zip(mpi_times).collect();
    let host = world.processor_name();
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let (intra, inter, note) = match (intra, inter) {
        (Some(a), Some(e)) => (a, e, ""),
        (Some(a), None) => (
            a.clone(),
            Tier {
                name: "inter (copied from intra)".into(),
                ..a
            },
            "; one node: inter copied from intra",
        ),
        (None, Some(e)) => (
            Tier {
                name: "intra (copied from inter)".into(),
                ..e.clone()
            },
            e,
            "; one rank per node: intra copied from inter",
        ),
        (None, None) => unreachable!("2+ ranks give at least one tier"),
    };
    Ok(CostModel {
        intra,
        inter,
        source: format!(
            "ddl-bench calibrate on {host}, {} ranks ({}x{}), {cores} usable core(s) per rank, ring curves and MPI_Allreduce to {} bytes, median of {passes} passes{note}",
            world.size(),
            topo.nodes,
            topo.ranks_per_node,
            curve_sizes.last().copied().unwrap_or(0)
        ),
        copy,
        mpi: Some(MpiCurve {
            nodes: topo.nodes,
            ranks_per_node: topo.ranks_per_node,
            points: mpi_points,
        }),
    })
}

/// Parameter count of a model known to the simulator.
pub fn model_params(name: &str) -> Option<u64> {
    match name {
        "resnet18" => Some(11_689_512),
        "resnet34" => Some(21_797_672),
        "resnet50" => Some(25_557_032),
        "resnet101" => Some(44_549_160),
        "resnet152" => Some(60_192_808),
        _ => None,
    }
}

/// One predicted row of `ddl-bench sim`.
#[derive(Clone, Debug, Serialize)]
pub struct SimRow {
    /// Algorithm.
    pub algo: String,
    /// Ranks (GPUs).
    pub ranks: usize,
    /// Gradient bytes (fp32).
    pub bytes: usize,
    /// Predicted allreduce time per step, ms.
    pub allreduce_ms: f64,
    /// Compute time per step, ms.
    pub compute_ms: f64,
    /// compute / (compute + exposed allreduce), exposed = allreduce x (1 - overlap).
    pub efficiency: f64,
}

/// Predicts per-step allreduce time and scaling efficiency of every algorithm for a model of
/// `params` fp32 parameters on `nodes x gpus_per_node` GPUs, in two layouts: one rank per GPU
/// (`flat`), and ddl's layout of one rank per node whose GPUs' gradients are first summed
/// inside the node (`node`: an intra-node allreduce over NVLink, then the algorithm over one
/// rank per node). `overlap` is the fraction of the allreduce hidden behind backward compute.
pub fn simulate(
    model: &CostModel,
    nodes: usize,
    gpus_per_node: usize,
    params: u64,
    compute_ms: f64,
    overlap: f64,
) -> Vec<SimRow> {
    let flat = Topology::new(nodes, gpus_per_node);
    let per_node = Topology::new(nodes, 1);
    let bytes = params as usize * 4;
    let algos = [
        Algorithm::Ring,
        Algorithm::Rhd,
        Algorithm::Multicolor {
            colors: ddl_comm::algorithm::DEFAULT_COLORS,
            chunk_bytes: ddl_comm::algorithm::DEFAULT_CHUNK_BYTES,
        },
        Algorithm::Multiring {
            dims: Vec::new(),
            segments: 0,
        },
        Algorithm::Auto,
    ];
    let in_node = model.predict(&Algorithm::Ring, bytes, Topology::flat(gpus_per_node));
    let mut rows = Vec::new();
    for (layout, topo, extra) in [("flat", flat, 0.0), ("node", per_node, in_node)] {
        for a in &algos {
            let t = (model.predict(a, bytes, topo) + extra) * 1e3;
            let name = match a {
                Algorithm::Auto => format!("auto={}", model.choose(bytes, topo)),
                other => other.to_string(),
            };
            let exposed = t * (1.0 - overlap.clamp(0.0, 1.0));
            rows.push(SimRow {
                algo: format!("{layout}/{name}"),
                ranks: flat.ranks(),
                bytes,
                allreduce_ms: t,
                compute_ms,
                efficiency: compute_ms / (compute_ms + exposed),
            });
        }
    }
    rows
}

/// Writes the `sim` table with DDL's published 95 % at 256 GPUs as the reference.
pub fn print_sim(
    out: &mut dyn Write,
    rows: &[SimRow],
    nodes: usize,
    gpus: usize,
    model_name: &str,
    cost: &CostModel,
    overlap: f64,
) -> Result<()> {
    let Some(first) = rows.first() else {
        return Ok(());
    };
    writeln!(
        out,
        "# sim: {nodes} nodes x {gpus} GPUs = {} ranks, {model_name} ({:.1}M params, {:.1} MB fp32), step compute {:.1} ms, cost model: {}",
        first.ranks,
        first.bytes as f64 / 4e6,
        first.bytes as f64 / 1e6,
        first.compute_ms,
        cost.source
    )?;
    writeln!(
        out,
        "# exposed-allreduce budget for DDL's published 95% scaling efficiency (256 GPUs): {:.2} ms per step; overlap {:.0}%",
        first.compute_ms * (1.0 / 0.95 - 1.0),
        overlap * 100.0
    )?;
    writeln!(
        out,
        "# flat = one rank per GPU; node = GPUs summed inside the node first, then one rank per node"
    )?;
    writeln!(
        out,
        "# {:>28} {:>14} {:>12} {:>11} {:>12}",
        "algo", "allreduce(ms)", "step(ms)", "efficiency", "vs DDL 95%"
    )?;
    for r in rows {
        writeln!(
            out,
            "  {:>28} {:>14.2} {:>12.2} {:>10.1}% {:>+11.1}pt",
            r.algo,
            r.allreduce_ms,
            r.compute_ms / r.efficiency,
            r.efficiency * 100.0,
            (r.efficiency - 0.95) * 100.0
        )?;
    }
    Ok(())
}

/// The timeout all `ddl-bench` MPI runs use unless told otherwise.
pub const DEFAULT_BENCH_TIMEOUT: Duration = Duration::from_secs(120);
