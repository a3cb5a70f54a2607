//! Calibration of the [`CostModel`] under MPI: ping-pong per tier, the reduction and copy
//! costs, ring allreduce curves and MPI_Allreduce itself, measured in the layout the job runs
//! in. `ddl-bench calibrate` is its command line.

use std::sync::Arc;
use std::time::Instant;

use crate::algorithm::Algorithm;
use crate::allreduce::Allreducer;
use crate::collective::max_on_root;
use crate::cost::{CostModel, MpiCurve, Tier};
use crate::error::{CommError, Result};
use crate::tags::PINGPONG;
use crate::topology::Topology;
use crate::transport::Transport;
use crate::world::World;

const TAG_PING: u32 = PINGPONG.tag(0);
const TAG_PONG: u32 = PINGPONG.tag(1);

/// Median of `v` (sorted in place); NaN when empty.
pub fn median(v: &mut [f64]) -> f64 {
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

/// One-way message time between ranks 0 and `peer` (median of ping-pongs / 2), measured on
/// rank 0; every rank must call this.
fn pingpong(t: &dyn Transport, peer: usize, bytes: usize, reps: usize) -> Result<f64> {
    let mut buf = vec![0u8; bytes];
    let mut times = Vec::with_capacity(reps);
    t.barrier()?;
    for i in 0..reps + 3 {
        if t.rank() == 0 {
            let start = Instant::now();
            t.send(peer, TAG_PING, &buf)?;
            t.recv(peer, TAG_PONG, &mut buf)?;
            if i >= 3 {
                times.push(start.elapsed().as_secs_f64() / 2.0);
            }
        } else if t.rank() == peer {
            t.recv(0, TAG_PING, &mut buf)?;
            t.send(0, TAG_PONG, &buf)?;
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
    let mut slowest = max_on_root(&**t, &times)?;
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
/// Each sweep runs `passes` times, per size the median. A tier that this layout
/// cannot measure copies the other one (noted in `source`).
pub fn calibrate(world: &World, max_bytes: usize, passes: usize) -> Result<CostModel> {
    let t: Arc<dyn Transport> = world.transport();
    let topo = world.topology();
    if world.size() < 2 {
        return Err(CommError::InvalidArgument(
            "calibrate needs at least 2 ranks (mpirun -np 2 or more)".into(),
        ));
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
