//! Calibration of the [`CostModel`] under MPI: ping-pong per tier, the reduction and copy
//! costs, ring allreduce curves and every algorithm `auto` chooses between, measured in the
//! layout the job runs in. `ddl-bench calibrate` is its command line.

use std::sync::Arc;
use std::time::Instant;

use crate::algorithm::{auto_candidates, Algorithm};
use crate::allreduce::{Allreducer, Element};
use crate::collective::max_on_root;
use crate::cost::{CostModel, MeasuredCurve, Tier};
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
pub fn calibration_iters(bytes: usize) -> usize {
    match bytes {
        0..=65536 => 50,
        65537..=4194304 => 15,
        _ => 5,
    }
}

/// Calls timed per benchmark size: `iters` from 64 MiB up, more for smaller messages
/// (`iters x 64 MiB / bytes`, at most 10,000), so that every size is timed over a similar
/// span and small ones over many calls. `tools/bench/mpi_allreduce.c` uses the same rule.
pub fn calls_for(bytes: usize, iters: usize) -> usize {
    (iters.saturating_mul(64 << 20) / bytes.max(1)).clamp(iters, iters.max(10_000))
}

/// Mean seconds per call of `calls` back-to-back allreduces of `buf` with `ar` on the
/// slowest rank, after `warmup` untimed calls and a barrier: the statistic of OSU's
/// `osu_allreduce`, of nccl-tests and of `tools/bench/mpi_allreduce.c`. Like those loops the
/// calls sum without averaging (the buffer is zeroed first, so it stays finite). Every rank
/// of `t` must call this; rank 0 of `t` gets the time.
pub fn mean_call_time<T: Element>(
    t: &dyn Transport,
    ar: &Allreducer,
    buf: &mut [T],
    warmup: usize,
    calls: usize,
) -> Result<f64> {
    buf.fill(T::from_f32(0.0));
    for _ in 0..warmup {
        ar.allreduce(buf, false)?;
    }
    t.barrier()?;
    let start = Instant::now();
    for _ in 0..calls.max(1) {
        ar.allreduce(buf, false)?;
    }
    let mean = start.elapsed().as_secs_f64() / calls.max(1) as f64;
    Ok(max_on_root(t, &[mean])?[0])
}

/// Times of each of `algos` over `t` in `topo` at each of `sizes` (five warm-up calls, then
/// [`mean_call_time`]), swept `passes` times over all sizes, the algorithms taking turns at
/// each size so that they meet the same load; per size the median of the passes
/// ([`median_pass`]), so that bursts of load from other tenants of the machine, which last
/// seconds, spoil no point unless they cover half the passes. (Other tenants hurt `shm` most:
/// they evict the slots it keeps in the shared cache.) The benchmark reports the median of
/// its runs (each, like a pass, the mean of many calls): the median pass predicts it, where
/// the fastest pass (or a low quantile) takes an algorithm that is fast only now and then for
/// fast. Like the benchmark, every size is a prefix of one buffer of the largest size and one
/// [`Allreducer`] per algorithm serves all sizes: a fresh buffer per size timed the ring far
/// above its benchmark time. (BENCHMARKS.md, "Figures behind the defaults", has each case.) An algorithm this group cannot run (`shm` across nodes) gets `None`.
/// Every rank of `t` must call this; rank 0 of `t` gets the times.
fn sweep(
    t: &Arc<dyn Transport>,
    algos: &[Algorithm],
    topo: Topology,
    sizes: &[usize],
    passes: usize,
) -> Result<Vec<Option<Vec<f64>>>> {
    let mut reducers = Vec::with_capacity(algos.len());
    for algo in algos {
        let ar = Allreducer::new(t.clone(), algo.clone(), topo)?;
        // The first call sets up what the algorithm needs (shm's region).
        match ar.allreduce_f32(&mut [0.0], false) {
            Ok(()) => reducers.push(Some(ar)),
            Err(CommError::Unsupported(_)) => reducers.push(None),
            Err(e) => return Err(e),
        }
    }
    let mut buf = vec![0.0f32; sizes.iter().copied().max().unwrap_or(0) / 4];
    let mut times = vec![vec![Vec::with_capacity(passes); sizes.len()]; algos.len()];
    for _ in 0..passes.max(1) {
        for (i, &bytes) in sizes.iter().enumerate() {
            for (ar, ts) in reducers.iter().zip(times.iter_mut()) {
                if let Some(ar) = ar {
                    let data = &mut buf[..bytes / 4];
                    ts[i].push(mean_call_time(&**t, ar, data, 5, calibration_iters(bytes))?);
                }
            }
        }
    }
    Ok(reducers
        .iter()
        .zip(times)
        .map(|(ar, ts)| {
            ar.as_ref()
                .map(|_| ts.into_iter().map(median_pass).collect())
        })
        .collect())
}

/// The median of `times` (of an even count, the faster of the middle two).
fn median_pass(mut times: Vec<f64>) -> f64 {
    times.sort_by(f64::total_cmp);
    times
        .get(times.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or(f64::INFINITY)
}

/// Transfer time per byte at each of `sizes` from the times of a ring allreduce over `p`
/// ranks, inverting the ring formula `2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma`.
fn beta_curve(
    p: usize,
    sizes: &[usize],
    times: &[f64],
    alpha: f64,
    gamma: f64,
) -> Vec<(usize, f64)> {
    let p = p as f64;
    sizes
        .iter()
        .zip(times)
        .map(|(&bytes, &time)| {
            let n = bytes as f64;
            let moved = 2.0 * (p - 1.0) / p * n;
            let beta = (time - 2.0 * (p - 1.0) * alpha - (p - 1.0) / p * n * gamma) / moved;
            (bytes, beta.max(1e-13))
        })
        .collect()
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
///   leave the caches), then quadruples it. `shm` of one f32 over each node's ranks (where
///   they share memory) gives the synchronisation time;
/// - every algorithm `auto` chooses between here ([`auto_candidates`]: the ring, rhd,
///   multiring over several tiers, multicolor, `mpi`, and `shm` on one node; the ones that
///   run the same code are timed once) at the benchmark's sizes, 4 KiB x
///   4^k up to `max_bytes`, taking turns at each size, timed like the benchmark: the model's
///   [`MeasuredCurve`]s for this layout, so that `auto` picks what ran fastest, not what the
///   formulas (which serve `ddl-bench sim`'s other layouts) say.
///
/// Each sweep runs `passes` times, per size the median pass. A tier that this layout
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
    let auto_sizes: Vec<usize> = (12..=30)
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
    let mut shm_sync = 0.0;
    if let Some(tier) = intra.as_mut() {
        shm_sync = node_curve(world, tier, &curve_sizes, passes, gamma)?;
    }
    if let Some(tier) = inter.as_mut() {
        let ring = sweep(
            &t,
            &[Algorithm::Ring],
            Topology::flat(t.size()),
            &curve_sizes,
            passes,
        )?;
        let ring = ring[0].as_ref().expect("the ring runs on any group");
        tier.beta_curve = beta_curve(t.size(), &curve_sizes, ring, tier.alpha, gamma);
        tier.curve_ranks = t.size();
    }
    let measured = auto_curves(&t, topo, &auto_sizes, passes)?;
    let host = world.processor_name();
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let (intra, inter, note) = both_tiers(intra, inter);
    Ok(CostModel {
        intra,
        inter,
        source: format!(
            "ddl-bench calibrate on {host}, {} ranks ({}x{}), {cores} usable core(s) per rank, ring curves to {} bytes, auto's candidates to {} bytes, median of {passes} passes{note}",
            world.size(),
            topo.nodes,
            topo.ranks_per_node,
            curve_sizes.last().copied().unwrap_or(0),
            auto_sizes.last().copied().unwrap_or(0)
        ),
        copy,
        shm_sync,
        measured,
        other: serde_json::Map::new(),
    })
}

/// The ring's curve within this rank's node into `tier` (and its rank count), timed over the
/// node's ranks at `curve_sizes`: the seconds of one `shm` synchronisation (a whole allreduce
/// of one f32), 0 where the node's ranks share no memory.
fn node_curve(
    world: &World,
    tier: &mut Tier,
    curve_sizes: &[usize],
    passes: usize,
    gamma: f64,
) -> Result<f64> {
    let t = world.transport();
    let node: Arc<dyn Transport> = Arc::from(t.split(world.node_index(), world.local_rank())?);
    let sizes: Vec<usize> = [4].into_iter().chain(curve_sizes.iter().copied()).collect();
    let [ring, shm] = <[Option<Vec<f64>>; 2]>::try_from(sweep(
        &node,
        &[Algorithm::Ring, Algorithm::SHM],
        Topology::flat(node.size()),
        &sizes,
        passes,
    )?)
    .expect("one result per algorithm");
    let ring = ring.expect("the ring runs on any group");
    tier.beta_curve = beta_curve(node.size(), curve_sizes, &ring[1..], tier.alpha, gamma);
    tier.curve_ranks = node.size();
    // Rank 0 of the world is rank 0 of node 0: its curves are the ones kept.
    t.barrier()?;
    Ok(shm.map_or(0.0, |shm| shm[0]))
}

/// The curves of every algorithm `auto` chooses between in `topo`, timed at `sizes`.
fn auto_curves(
    t: &Arc<dyn Transport>,
    topo: Topology,
    sizes: &[usize],
    passes: usize,
) -> Result<Vec<MeasuredCurve>> {
    let all = auto_candidates(topo, true, t.has_native_allreduce());
    let candidates = crate::allreduce::tune::distinct(all, topo);
    Ok(candidates
        .iter()
        .zip(sweep(t, &candidates, topo, sizes, passes)?)
        .filter_map(|(algo, times)| {
            Some(MeasuredCurve {
                algorithm: algo.to_string(),
                nodes: topo.nodes,
                ranks_per_node: topo.ranks_per_node,
                points: sizes.iter().copied().zip(times?).collect(),
            })
        })
        .collect())
}

/// Both tiers from the ones this layout measured (a missing one copies the other), with the
/// note that says so.
fn both_tiers(intra: Option<Tier>, inter: Option<Tier>) -> (Tier, Tier, &'static str) {
    match (intra, inter) {
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
    }
}

#[cfg(test)]
mod tests {
    use super::median_pass;

    #[test]
    fn the_median_pass_skips_lucky_passes_and_bursts() {
        // Two passes of 5 ran fast by luck (8.8, 9.0), the others at the usual 11-13: the
        // point is a usual one. A burst slowing 2 of 5 passes (40+) leaves it usual too.
        assert_eq!(median_pass(vec![12.9, 8.8, 11.9, 12.6, 9.0]), 11.9);
        assert_eq!(median_pass(vec![45.0, 10.9, 41.0, 11.2, 11.0]), 11.2);
        assert_eq!(median_pass(vec![3.0, 1.0, 2.0, 4.0]), 2.0);
        assert_eq!(median_pass(vec![7.0]), 7.0);
        assert_eq!(median_pass(Vec::new()), f64::INFINITY);
    }
}
