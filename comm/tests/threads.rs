//! Allreduce algorithms and the thread transport, checked against sequential sums.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ddl_comm::{
    thread_group, thread_group_with_timeout, Algorithm, Allreducer, CommError, Multicolor,
    Multiring, Op, Shm, Topology, Transport,
};
use half::{bf16, f16};
use proptest::prelude::*;

use crate::common;
use common::{algorithms, input, on_ranks};

/// Topology with 2 ranks per node where possible, so multiring has two dimensions.
fn topology(p: usize) -> Topology {
    if p % 2 == 0 && p > 2 {
        Topology::new(p / 2, 2)
    } else {
        Topology::flat(p)
    }
}

fn run_allreduce(
    p: usize,
    len: usize,
    algo: Algorithm,
    seed: u64,
    integers: bool,
    average: bool,
) -> Vec<Vec<f32>> {
    // shm runs on one node only: its ranks form one.
    let topo = match algo {
        Algorithm::Shm { .. } => Topology::flat(p),
        _ => topology(p),
    };
    on_ranks(p, move |r, t| {
        let ar = Allreducer::new(t, algo.clone(), topo).expect("allreducer");
        // `auto` tries the candidates on its first calls of a size: in other summation orders.
        while ar.tuning(4 * len) {
            let mut trial = input(r, len, seed, integers);
            ar.allreduce_f32(&mut trial, average).expect("tuning call");
        }
        let mut buf = input(r, len, seed, integers);
        ar.allreduce_f32(&mut buf, average).expect("allreduce");
        // A second call on the same allreducer reuses its scratch buffers.
        let mut again = input(r, len, seed, integers);
        ar.allreduce_f32(&mut again, average)
            .expect("second allreduce");
        assert_eq!(bits(&buf), bits(&again), "rank {r}: repeated call differs");
        buf
    })
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn check_identical(results: &[Vec<f32>], what: &str) {
    for (r, res) in results.iter().enumerate() {
        assert_eq!(
            bits(res),
            bits(&results[0]),
            "{what}: rank {r} differs from rank 0"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    /// Integer-valued inputs sum exactly in any order: every algorithm must equal the
    /// sequential sum bitwise, on every rank.
    #[test]
    fn exact_sums_all_algorithms(p in 1usize..=33, len_kind in 0usize..6, seed in any::<u64>()) {
        let len = match len_kind {
            0 => 0,
            1 => 1,
            2 => p.saturating_sub(1),
            3 => 2 * p + 1,
            4 => 97,
            _ => 1000 + (seed % 300) as usize,
        };
        let expected: Vec<f32> = (0..len)
            .map(|i| (0..p).map(|r| input(r, len, seed, true)[i]).sum())
            .collect();
        for algo in algorithms(p) {
            let res = run_allreduce(p, len, algo.clone(), seed, true, false);
            check_identical(&res, &algo.to_string());
            prop_assert_eq!(bits(&res[0]), bits(&expected), "{} p={} len={}", algo, p, len);
        }
    }

    /// Real-valued inputs: all ranks bitwise identical, close to the f64 sum; ring equals the
    /// sum in its documented order bitwise.
    #[test]
    fn real_sums_identical_and_close(p in 1usize..=33, len in 0usize..200, seed in any::<u64>(), average in any::<bool>()) {
        let inputs: Vec<Vec<f32>> = (0..p).map(|r| input(r, len, seed, false)).collect();
        for algo in algorithms(p) {
            let res = run_allreduce(p, len, algo.clone(), seed, false, average);
            check_identical(&res, &algo.to_string());
            for i in 0..len {
                let mut exact: f64 = inputs.iter().map(|v| v[i] as f64).sum();
                if average {
                    exact /= p as f64;
                }
                let tol = 1e-5 * (p as f64) * 2.0;
                prop_assert!((res[0][i] as f64 - exact).abs() <= tol,
                    "{} p={} i={}: {} vs {}", algo, p, i, res[0][i], exact);
            }
            if algo == Algorithm::Ring && !average {
                // Part k of the ring is summed starting at rank k+1: x[k+1] + x[k+2] + ... + x[k].
                for k in 0..p {
                    let base = len / p;
                    let extra = len % p;
                    let start = k * base + k.min(extra);
                    let end = start + base + usize::from(k < extra);
                    for i in start..end {
                        let mut acc = inputs[(k + 1) % p][i];
                        for j in 2..=p {
                            acc += inputs[(k + j) % p][i];
                        }
                        prop_assert_eq!(res[0][i].to_bits(), acc.to_bits(), "ring order p={} i={}", p, i);
                    }
                }
            }
        }
    }
}

#[test]
fn sixty_four_ranks_every_algorithm() {
    let p = 64;
    let len = 4099;
    let expected: Vec<f32> = (0..len)
        .map(|i| (0..p).map(|r| input(r, len, 7, true)[i]).sum())
        .collect();
    for algo in algorithms(p).into_iter().chain([
        Algorithm::Multiring(Multiring {
            dims: vec![4, 4, 4],
            segments: 0,
        }),
        Algorithm::Multiring(Multiring {
            dims: vec![4, 4, 4],
            segments: 7,
        }),
    ]) {
        let res = run_allreduce(p, len, algo.clone(), 7, true, false);
        check_identical(&res, &algo.to_string());
        assert_eq!(bits(&res[0]), bits(&expected), "{algo}");
    }
}

#[test]
fn half_precision_reduced_in_f32() {
    let p = 5;
    let len = 301;
    let res = on_ranks(p, move |r, t| {
        let ar = Allreducer::new(t, Algorithm::Rhd, Topology::flat(p)).expect("allreducer");
        let src = input(r, len, 3, false);
        let mut h: Vec<f16> = src.iter().map(|&v| f16::from_f32(v)).collect();
        let mut b: Vec<bf16> = src.iter().map(|&v| bf16::from_f32(v)).collect();
        ar.allreduce_f16(&mut h, true).expect("f16");
        ar.allreduce_bf16(&mut b, false).expect("bf16");
        (h, b)
    });
    for i in 0..len {
        let hsum: f64 = (0..p)
            .map(|r| f16::from_f32(input(r, len, 3, false)[i]).to_f64())
            .sum::<f64>()
            / p as f64;
        let bsum: f64 = (0..p)
            .map(|r| bf16::from_f32(input(r, len, 3, false)[i]).to_f64())
            .sum();
        // One rounding of the f32 result: within half an ulp of the target format (plus f32 noise).
        assert!(
            (res[0].0[i].to_f64() - hsum).abs() <= hsum.abs() * 1e-3 + 1e-4,
            "f16 {i}"
        );
        assert!(
            (res[0].1[i].to_f64() - bsum).abs() <= bsum.abs() * 8e-3 + 1e-3,
            "bf16 {i}"
        );
        for (r, other) in res.iter().enumerate() {
            assert_eq!(other.0[i].to_bits(), res[0].0[i].to_bits(), "f16 rank {r}");
            assert_eq!(other.1[i].to_bits(), res[0].1[i].to_bits(), "bf16 rank {r}");
        }
    }
}

#[test]
fn half_precision_beyond_one_widening_block_is_exact() {
    // 600,001 elements: more than two of the blocks (256 Ki elements) in which the message
    // algorithms widen f16 / bf16, with a ragged last one. Integers up to 1000 at 3 ranks sum
    // exactly in f16 (< 2048) and bf16 (bf16 holds integers up to 256 exactly: scaled to fit).
    let p = 3;
    let len = 600_001;
    for algo in [Algorithm::Ring, Algorithm::Rhd] {
        let res = on_ranks(p, {
            let algo = algo.clone();
            move |r, t| {
                let ar = Allreducer::new(t, algo.clone(), Topology::flat(p)).expect("allreducer");
                let src = input(r, len, 11, true);
                let mut h: Vec<f16> = src.iter().map(|&v| f16::from_f32(v / 2.0)).collect();
                let mut b: Vec<bf16> = src.iter().map(|&v| bf16::from_f32(v / 16.0)).collect();
                ar.allreduce_f16(&mut h, false).expect("f16");
                ar.allreduce_bf16(&mut b, false).expect("bf16");
                (h, b)
            }
        });
        let inputs: Vec<Vec<f32>> = (0..p).map(|r| input(r, len, 11, true)).collect();
        for i in 0..len {
            let h: f32 = inputs
                .iter()
                .map(|x| f16::from_f32(x[i] / 2.0).to_f32())
                .sum();
            let b: f32 = inputs
                .iter()
                .map(|x| bf16::from_f32(x[i] / 16.0).to_f32())
                .sum();
            for (r, (hs, bs)) in res.iter().enumerate() {
                assert_eq!(hs[i], f16::from_f32(h), "{algo} f16 rank {r} element {i}");
                assert_eq!(bs[i], bf16::from_f32(b), "{algo} bf16 rank {r} element {i}");
            }
        }
    }
}

/// What one rank passes to a call of the mismatch test.
#[derive(Clone, Copy, Debug)]
enum Call {
    F32(usize),
    F16(usize),
}

/// Runs one allreduce per rank, rank r passing `calls[r]` (ranks share one node when `algo`
/// is `shm`), and returns each rank's result, whether its buffer came back untouched and how
/// long it took.
fn run_calls(algo: &Algorithm, calls: &[Call]) -> Vec<(ddl_comm::Result<()>, bool, Duration)> {
    let p = calls.len();
    let topo = match algo {
        Algorithm::Shm { .. } => Topology::flat(p),
        _ => topology(p),
    };
    let group = thread_group_with_timeout(p, Duration::from_secs(20));
    let handles: Vec<_> = group
        .into_iter()
        .zip(calls.to_vec())
        .map(|(t, call)| {
            let algo = algo.clone();
            std::thread::spawn(move || {
                let rank = t.rank();
                let ar = Allreducer::new(Arc::new(t), algo, topo).expect("allreducer");
                let start = Instant::now();
                let (result, untouched) = match call {
                    Call::F32(n) => {
                        let src = input(rank, n, 9, true);
                        let mut buf = src.clone();
                        (ar.allreduce_f32(&mut buf, false), bits(&buf) == bits(&src))
                    }
                    Call::F16(n) => {
                        let src: Vec<f16> = input(rank, n, 9, true)
                            .into_iter()
                            .map(f16::from_f32)
                            .collect();
                        let mut buf = src.clone();
                        (ar.allreduce_f16(&mut buf, false), buf == src)
                    }
                };
                (result, untouched, start.elapsed())
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank thread"))
        .collect()
}

#[test]
fn mismatched_calls_fail_on_every_rank_before_touching_data() {
    use Call::{F16, F32};
    let cases: Vec<(Vec<Call>, Vec<&str>)> = vec![
        (
            vec![F32(10), F32(1000)],
            vec!["rank 0 passed 10 f32", "rank 1 passed 1000 f32"],
        ),
        (
            vec![F32(300), F16(300)],
            vec!["rank 0 passed 300 f32", "rank 1 passed 300 f16"],
        ),
        (
            vec![F32(0), F32(7)],
            vec!["rank 0 passed 0 f32", "rank 1 passed 7 f32"],
        ),
        // At two ranks the first message of the smaller call rides with the check, that of
        // the larger one would not fit.
        (
            vec![F32(1000), F32(300_000)],
            vec!["rank 0 passed 1000 f32", "rank 1 passed 300000 f32"],
        ),
        (
            vec![F32(1000), F32(1000), F32(300_000), F32(1000)],
            vec![
                "ranks 0, 1 and 3 passed 1000 f32",
                "rank 2 passed 300000 f32",
            ],
        ),
        (
            vec![F32(2), F32(5000), F32(5000)],
            vec!["rank 0 passed 2 f32", "ranks 1 and 2 passed 5000 f32"],
        ),
    ];
    for (calls, names) in &cases {
        for algo in algorithms(calls.len()) {
            for (rank, (result, untouched, elapsed)) in run_calls(&algo, calls).iter().enumerate() {
                let what = format!("{algo}, {calls:?}, rank {rank}");
                let err = result.as_ref().expect_err(&what);
                assert!(matches!(err, CommError::Mismatch { .. }), "{what}: {err}");
                let msg = err.to_string();
                for name in names {
                    assert!(msg.contains(name), "{what}: {msg}");
                }
                assert!(*untouched, "{what}: the buffer changed");
                // Every rank fails at the check, none after waiting out the timeout.
                assert!(*elapsed < Duration::from_secs(10), "{what}: {elapsed:?}");
            }
        }
    }
}

#[test]
fn recv_times_out_naming_op_and_peer() {
    let timeout = Duration::from_millis(300);
    let mut group = thread_group_with_timeout(2, timeout);
    let silent = group.pop().expect("rank 1");
    let waiting = group.pop().expect("rank 0");
    let start = Instant::now();
    let mut buf = [0u8; 8];
    let err = waiting.recv(1, 5, &mut buf).expect_err("nobody sends");
    let elapsed = start.elapsed();
    assert!(
        elapsed >= timeout && elapsed < timeout * 10,
        "took {elapsed:?}"
    );
    match &err {
        CommError::Timeout { op, peer, rank, .. } => {
            assert_eq!(*op, "recv");
            assert_eq!(*peer, Some(1));
            assert_eq!(*rank, 0);
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("recv") && msg.contains("peer 1"), "{msg}");
    drop(silent);
}

#[test]
fn allreduce_with_a_dead_peer_fails_within_the_timeout() {
    let timeout = Duration::from_millis(200);
    let mut group = thread_group_with_timeout(3, timeout);
    let _stuck = group.pop().expect("rank 2 never joins");
    let handles: Vec<_> = group
        .into_iter()
        .map(|t| {
            std::thread::spawn(move || {
                let ar = Allreducer::new(Arc::new(t), Algorithm::Ring, Topology::flat(3))
                    .expect("allreducer");
                let mut buf = vec![1.0f32; 30];
                let start = Instant::now();
                let err = ar
                    .allreduce_f32(&mut buf, false)
                    .expect_err("rank 2 is silent");
                (start.elapsed(), err)
            })
        })
        .collect();
    for (rank, h) in handles.into_iter().enumerate() {
        let (elapsed, err) = h.join().expect("thread");
        assert!(elapsed < timeout * 10, "took {elapsed:?}");
        if rank == 0 {
            // Rank 0 waits on its ring predecessor, the silent rank 2.
            assert!(
                matches!(err, CommError::Timeout { peer: Some(2), .. }),
                "expected a timeout naming peer 2, got {err}"
            );
        } else {
            // Rank 1 waits on rank 0, which either times out too or has already given up.
            assert!(
                matches!(
                    err,
                    CommError::Timeout { .. } | CommError::Disconnected { peer: 0, .. }
                ),
                "got {err}"
            );
        }
        assert!(err.to_string().contains("peer"), "{err}");
    }
}

#[test]
fn disconnected_peer_is_reported() {
    let mut group = thread_group(2);
    drop(group.pop());
    let t = group.pop().expect("rank 0");
    let err = t.recv(1, 0, &mut [0u8; 4]).expect_err("peer dropped");
    assert!(
        matches!(err, CommError::Disconnected { peer: 1, .. }),
        "{err}"
    );
}

#[test]
fn exchange_split_and_barrier() {
    let p = 6;
    let res = on_ranks(p, move |r, t| {
        // Everyone sends its rank to everyone in one batch.
        let out = [r as u8; 3];
        let mut inbox = vec![[0u8; 3]; p];
        {
            let mut ops: Vec<Op<'_>> = (0..p)
                .map(|d| Op::Send {
                    to: d,
                    tag: 9,
                    data: &out[..],
                })
                .collect();
            ops.extend(inbox.iter_mut().enumerate().map(|(s, b)| Op::Recv {
                from: s,
                tag: 9,
                buf: &mut b[..],
            }));
            t.exchange(&mut ops).expect("exchange");
        }
        for (s, b) in inbox.iter().enumerate() {
            assert_eq!(b, &[s as u8; 3]);
        }
        // Split by parity, ordered by descending rank.
        let sub = t.split(r % 2, p - r).expect("split");
        assert_eq!(sub.size(), 3);
        sub.barrier().expect("sub barrier");
        t.barrier().expect("barrier");
        let ar = Allreducer::new(Arc::from(sub), Algorithm::Ring, Topology::flat(3)).expect("ar");
        let mut v = vec![r as f32];
        ar.allreduce_f32(&mut v, false).expect("sub allreduce");
        (ar.transport().rank(), v[0])
    });
    for (r, (sub_rank, sum)) in res.iter().enumerate() {
        // Ranks of one parity in descending order: the largest rank is 0.
        let same: Vec<usize> = (0..p).filter(|x| x % 2 == r % 2).rev().collect();
        assert_eq!(
            *sub_rank,
            same.iter().position(|&x| x == r).expect("member")
        );
        assert_eq!(*sum, same.iter().sum::<usize>() as f32);
    }
}

#[test]
fn sendrecv_and_size_mismatch() {
    let res = on_ranks(2, |r, t| {
        let mut got = [0u8; 4];
        t.sendrecv(1 - r, 3, &[r as u8; 4], 1 - r, 3, &mut got)
            .expect("sendrecv");
        let short = t
            .send(1 - r, 4, &[1, 2])
            .and_then(|_| t.recv(1 - r, 4, &mut [0u8; 3]));
        (got, short)
    });
    assert_eq!(res[0].0, [1; 4]);
    assert_eq!(res[1].0, [0; 4]);
    for (_, short) in &res {
        assert!(matches!(
            short,
            Err(CommError::SizeMismatch {
                expected: 3,
                got: 2,
                ..
            })
        ));
    }
}

#[test]
fn invalid_configurations_are_rejected() {
    let t: Arc<dyn Transport> = Arc::new(thread_group(1).pop().expect("one"));
    let err = Allreducer::new(t.clone(), Algorithm::Mpi, Topology::flat(1)).expect_err("no mpi");
    assert!(matches!(err, CommError::Unsupported(_)));
    let err = Allreducer::new(
        t.clone(),
        Algorithm::Multiring(Multiring {
            dims: vec![2, 2],
            segments: 0,
        }),
        Topology::flat(1),
    )
    .expect_err("dims");
    assert!(matches!(err, CommError::InvalidArgument(_)));
    let err = Allreducer::new(
        t.clone(),
        Algorithm::Shm(Shm { chunk_bytes: 64 }),
        Topology::flat(1),
    )
    .expect_err("chunk");
    assert!(err.to_string().contains("shm"), "{err}");
    let err = Allreducer::new(t, Algorithm::Ring, Topology::new(2, 2)).expect_err("topology");
    assert!(matches!(err, CommError::InvalidArgument(_)));
}

#[test]
fn algorithm_names_parse_and_print() {
    for name in Algorithm::names() {
        let a: Algorithm = name.parse().expect("parses");
        assert_eq!(a.name(), name);
    }
    assert_eq!(
        "multiring:4x8x8".parse::<Algorithm>().expect("dims"),
        Algorithm::Multiring(Multiring {
            dims: vec![4, 8, 8],
            segments: 0,
        })
    );
    for (text, dims, segments) in [
        ("multiring:4x2:8", vec![4, 2], 8),
        ("multiring::8", vec![], 8),
    ] {
        let a = Algorithm::Multiring(Multiring { dims, segments });
        assert_eq!(text.parse::<Algorithm>().expect("segments"), a);
        assert_eq!(a.to_string(), text);
    }
    assert!("multiring:4x2:0".parse::<Algorithm>().is_err());
    assert_eq!(
        "multicolor:2:4096".parse::<Algorithm>().expect("colors"),
        Algorithm::Multicolor(Multicolor {
            colors: 2,
            chunk_bytes: 4096
        })
    );
    let a = Algorithm::Multicolor(Multicolor {
        colors: 2,
        chunk_bytes: 4096,
    });
    assert_eq!(a.to_string().parse::<Algorithm>().expect("round trip"), a);
    assert_eq!("shm".parse::<Algorithm>().expect("shm"), Algorithm::SHM);
    assert_eq!(Algorithm::SHM.to_string(), "shm");
    let a = Algorithm::Shm(Shm { chunk_bytes: 4096 });
    assert_eq!(a.to_string(), "shm:4096");
    assert_eq!(a.to_string().parse::<Algorithm>().expect("round trip"), a);
    assert!("shm:0".parse::<Algorithm>().is_err());
    assert!("tree".parse::<Algorithm>().is_err());
    assert!("multiring:4x0".parse::<Algorithm>().is_err());
}
