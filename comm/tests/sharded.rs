//! Allgather, reduce-scatter and the allreduce with `max` on in-process ranks: exact results
//! (integer data sums exactly in any order), bitwise identical on every rank, for every
//! algorithm, on 1 to 8 ranks, odd sizes and uneven parts (empty ones included).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ddl_comm::{
    thread_group_with_timeout, CommError, CostModel, Parts, Reduce, ShardAlgorithm, Sharded,
    Topology, Transport,
};
use proptest::prelude::*;

use crate::common;
use common::{input, on_ranks};

fn algorithms() -> Vec<ShardAlgorithm> {
    vec![
        ShardAlgorithm::Ring,
        ShardAlgorithm::SHM,
        // Chunks of 32 f32: many per call, each slot reused many times.
        ShardAlgorithm::Shm { chunk_bytes: 128 },
        ShardAlgorithm::Auto,
    ]
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// What every rank ends with after an allgather, a sum and a max reduce-scatter and an
/// allreduce with `max` of its [`input`], twice on the same `Sharded` (scratch reused).
struct Ends {
    gathered: Vec<f32>,
    summed: Vec<f32>,
    maxed: Vec<f32>,
    allmax: Vec<f32>,
}

fn run(p: usize, parts: &Parts, algo: &ShardAlgorithm, seed: u64, integers: bool) -> Vec<Ends> {
    let (parts, algo) = (parts.clone(), algo.clone());
    let len = parts.len();
    on_ranks(p, move |r, t| {
        let s = Sharded::new(t, algo.clone(), Topology::flat(p), CostModel::default())
            .expect("sharded");
        let mut ends = Vec::new();
        for _ in 0..2 {
            let mut gathered = vec![f32::NAN; len];
            let mine = parts.range(r);
            gathered[mine.clone()].copy_from_slice(&input(r, len, seed, integers)[mine]);
            s.all_gather(&mut gathered, &parts).expect("allgather");
            let mut summed = input(r, len, seed, integers);
            s.reduce_scatter(&mut summed, &parts, Reduce::Sum)
                .expect("sum");
            let mut maxed = input(r, len, seed, integers);
            s.reduce_scatter(&mut maxed, &parts, Reduce::Max)
                .expect("max");
            let mut allmax = input(r, len, seed, integers);
            s.allreduce_max(&mut allmax).expect("allreduce max");
            let own = parts.range(r);
            ends.push(Ends {
                gathered,
                summed: summed[own.clone()].to_vec(),
                maxed: maxed[own].to_vec(),
                allmax,
            });
        }
        let second = ends.pop().expect("two rounds");
        let first = &ends[0];
        assert_eq!(bits(&first.gathered), bits(&second.gathered), "rank {r}");
        assert_eq!(bits(&first.summed), bits(&second.summed), "rank {r}");
        second
    })
}

/// Checks integer data against the sequential results, bitwise, on every rank.
fn check_exact(p: usize, parts: &Parts, seed: u64) {
    let len = parts.len();
    let inputs: Vec<Vec<f32>> = (0..p).map(|r| input(r, len, seed, true)).collect();
    let concatenated: Vec<f32> = (0..len)
        .map(|i| inputs[(0..p).find(|&q| parts.range(q).contains(&i)).unwrap()][i])
        .collect();
    let sum: Vec<f32> = (0..len)
        .map(|i| inputs.iter().map(|v| v[i]).sum())
        .collect();
    let max: Vec<f32> = (0..len)
        .map(|i| inputs.iter().map(|v| v[i]).fold(f32::MIN, f32::max))
        .collect();
    for algo in algorithms() {
        let ends = run(p, parts, &algo, seed, true);
        for (r, e) in ends.iter().enumerate() {
            let what = format!("{algo} p={p} parts={parts:?} rank {r}");
            assert_eq!(bits(&e.gathered), bits(&concatenated), "{what}: allgather");
            assert_eq!(bits(&e.summed), bits(&sum[parts.range(r)]), "{what}: sum");
            assert_eq!(bits(&e.maxed), bits(&max[parts.range(r)]), "{what}: max");
            assert_eq!(bits(&e.allmax), bits(&max), "{what}: allreduce max");
        }
    }
}

#[test]
fn even_and_odd_sizes_on_1_to_8_ranks() {
    for p in 1usize..=8 {
        for len in [0, 1, p.saturating_sub(1), 2 * p + 1, 97, 4099, 70_001] {
            check_exact(p, &Parts::even(len, p), len as u64);
        }
    }
}

#[test]
fn uneven_parts_with_empty_ones() {
    check_exact(3, &Parts::from_counts(&[5, 0, 9]), 1);
    check_exact(4, &Parts::from_counts(&[0, 0, 3, 0]), 2);
    check_exact(5, &Parts::from_counts(&[1000, 1, 0, 20_000, 7]), 3);
    check_exact(2, &Parts::from_counts(&[0, 0]), 4);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    /// Parts of random lengths (rows of a random width, as the trainer cuts features).
    #[test]
    fn random_parts_are_exact(
        counts in proptest::collection::vec(0usize..40, 1..=8),
        width in 1usize..70,
        seed in any::<u64>(),
    ) {
        let p = counts.len();
        check_exact(p, &Parts::from_counts(&counts).scaled(width), seed);
    }

    /// Fractional data: every rank bitwise the same after the allreduce with `max`; the ring's
    /// reduce-scatter sums part k in ring order from rank k + 1.
    #[test]
    fn ring_sums_in_ring_order(p in 1usize..=8, len in 0usize..300, seed in any::<u64>()) {
        let parts = Parts::even(len, p);
        let inputs: Vec<Vec<f32>> = (0..p).map(|r| input(r, len, seed, false)).collect();
        for algo in algorithms() {
            let ends = run(p, &parts, &algo, seed, false);
            for e in &ends {
                prop_assert_eq!(bits(&e.allmax), bits(&ends[0].allmax));
            }
        }
        let ends = run(p, &parts, &ShardAlgorithm::Ring, seed, false);
        for (k, e) in ends.iter().enumerate() {
            for (j, i) in parts.range(k).enumerate() {
                let mut acc = inputs[(k + 1) % p][i];
                for step in 2..=p {
                    acc += inputs[(k + step) % p][i];
                }
                prop_assert_eq!(e.summed[j].to_bits(), acc.to_bits(), "p={} i={}", p, i);
            }
        }
    }
}

#[test]
fn mismatched_parts_are_refused_naming_the_sizes() {
    let t: Arc<dyn Transport> = Arc::new(ddl_comm::thread_group(1).remove(0));
    let s = Sharded::new(
        t,
        ShardAlgorithm::Ring,
        Topology::flat(1),
        CostModel::default(),
    )
    .expect("sharded");
    let err = s
        .all_gather(&mut [0.0; 4], &Parts::even(5, 1))
        .expect_err("5 elements of parts for a buffer of 4");
    assert!(err.to_string().contains("parts of 5 elements"), "{err}");
    let err = s
        .reduce_scatter(&mut [0.0; 4], &Parts::even(4, 2), Reduce::Sum)
        .expect_err("parts for 2 ranks");
    assert!(err.to_string().contains("over 2 ranks"), "{err}");
}

#[test]
fn auto_takes_the_faster_prediction_on_one_node_and_the_ring_across_nodes() {
    let model = CostModel::default();
    let one = Topology::flat(4);
    let two = Topology::new(2, 2);
    for op in [
        ddl_comm::ShardedOp::AllGather,
        ddl_comm::ShardedOp::ReduceScatter,
    ] {
        for bytes in [4 << 10, 1 << 24] {
            let [ring, shm] = [ShardAlgorithm::Ring, ShardAlgorithm::SHM]
                .map(|a| model.predict_sharded(op, &a, bytes, one));
            let faster = if shm < ring {
                ShardAlgorithm::SHM
            } else {
                ShardAlgorithm::Ring
            };
            assert_eq!(model.choose_sharded(op, bytes, one, true), faster);
            let auto = model.predict_sharded(op, &ShardAlgorithm::Auto, bytes, one);
            assert_eq!(auto, ring.min(shm));
        }
        assert_eq!(
            model.choose_sharded(op, 1 << 24, one, false),
            ShardAlgorithm::Ring
        );
        assert_eq!(
            model.choose_sharded(op, 1 << 24, two, true),
            ShardAlgorithm::Ring
        );
        let ring = model.predict_sharded(op, &ShardAlgorithm::Ring, 1 << 24, two);
        assert!(ring > 0.0 && ring.is_finite());
        assert!(model
            .predict_sharded(op, &ShardAlgorithm::SHM, 1 << 24, two)
            .is_infinite());
    }
    assert!(Sharded::new(
        Arc::new(ddl_comm::thread_group(1).remove(0)),
        ShardAlgorithm::SHM,
        Topology::new(1, 1),
        model
    )
    .is_ok());
}

#[test]
fn a_silent_rank_is_named_within_the_timeout() {
    let timeout = Duration::from_millis(300);
    for algo in [ShardAlgorithm::Ring, ShardAlgorithm::SHM] {
        let group = thread_group_with_timeout(3, timeout);
        // Ranks 0 and 1 stay alive (their transports too) until both have failed, rank 2 until
        // then as well: a rank that left would fail its neighbour for another reason.
        let failed = Arc::new(std::sync::Barrier::new(3));
        let handles: Vec<_> = group
            .into_iter()
            .enumerate()
            .map(|(r, t)| {
                let (algo, failed) = (algo.clone(), failed.clone());
                std::thread::spawn(move || {
                    let s =
                        Sharded::new(Arc::new(t), algo, Topology::flat(3), CostModel::default())
                            .expect("sharded");
                    let parts = Parts::even(30_000, 3);
                    let mut buf = vec![1.0f32; 30_000];
                    s.all_gather(&mut buf, &parts).expect("first call");
                    if r == 2 {
                        failed.wait();
                        return None;
                    }
                    let start = Instant::now();
                    let err = s.reduce_scatter(&mut buf, &parts, Reduce::Sum);
                    let elapsed = start.elapsed();
                    failed.wait();
                    Some((elapsed, err.expect_err("rank 2 is silent")))
                })
            })
            .collect();
        let mut named = 0;
        for (r, h) in handles.into_iter().enumerate() {
            let Some((elapsed, err)) = h.join().expect("thread") else {
                continue;
            };
            assert!(elapsed < timeout * 10, "{algo} rank {r} took {elapsed:?}");
            match err {
                CommError::Timeout { peer: Some(2), .. } => named += 1,
                CommError::Timeout { .. } => {}
                other => panic!("{algo} rank {r}: expected a timeout, got {other}"),
            }
        }
        assert!(named >= 1, "{algo}: no rank named the silent rank 2");
    }
}
