//! The hierarchical allreduce on in-process groups laid out as several nodes: exact and
//! bitwise-identical sums in both of its modes (one leader per node for small buffers, one
//! part per rank above), half types rounded once, one node and one rank per node, and what
//! it refuses.

use ddl_comm::{bf16, f16, Across, Algorithm, Allreducer, CommError, Hierarchical, Topology};

use crate::common;
use crate::common::exact;
use common::on_ranks;
use exact::{check_exact_sums, input};

/// Integers in -1000..=1000 that vary independently between ranks (a hash of rank, index and
/// salt), so that node sums reach the ends of the range.
fn scattered(rank: usize, len: usize, salt: usize) -> Vec<f32> {
    (0..len)
        .map(|i| {
            let mut x = ((rank as u64) << 40) ^ ((salt as u64) << 32) ^ i as u64;
            x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            x ^= x >> 31;
            x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x ^= x >> 29;
            (x % 2001) as f32 - 1000.0
        })
        .collect()
}

/// Lengths (f32) around the modes' edges: one leader per node up to 1 MiB (262,144 f32) and
/// one chunk, one part per rank above, in one chunk of the default 4 MiB or several, and in
/// many short ones.
const LENGTHS: [usize; 7] = [1, 7, 4096, 262_144, 262_145, 300_001, 1_100_003];

fn algorithms() -> [Algorithm; 3] {
    [
        Algorithm::hierarchical(Across::Ring),
        Algorithm::Hierarchical(Hierarchical {
            across: Across::Rhd,
            chunk_bytes: 4096,
        }),
        // One line per rank and chunk: a leader's buffer beyond one result slot goes in parts.
        Algorithm::Hierarchical(Hierarchical {
            across: Across::Rhd,
            chunk_bytes: 128,
        }),
    ]
}

/// The longest buffer worth summing with `algo` here: chunks of a line cost a synchronisation
/// per 32 f32, so they stop at 262,145, the first length of one part per rank.
fn max_len(algo: &Algorithm) -> usize {
    match algo {
        Algorithm::Hierarchical(Hierarchical {
            chunk_bytes: 128, ..
        }) => 262_145,
        _ => usize::MAX,
    }
}

#[test]
fn sums_are_exact_and_identical_on_every_rank() {
    for topo in [
        Topology::new(2, 2),
        Topology::new(3, 2),
        Topology::new(2, 3),
    ] {
        for algo in algorithms() {
            let lengths: Vec<usize> = LENGTHS
                .into_iter()
                .filter(|&len| len <= max_len(&algo))
                .collect();
            check_exact_sums(&algo, topo, &lengths);
        }
    }
}

#[test]
fn half_types_are_summed_in_f32_and_rounded_once() {
    // Integer data: the f32 sums are exact, so rounding once gives what rhd (which widens the
    // whole buffer and rounds at the end) gives, bitwise. Rounding the node sums (of 3 ranks:
    // up to 750 in steps of 0.25, beyond f16's 11 bits) before they cross between the nodes
    // would not.
    let topo = Topology::new(2, 3);
    let results = on_ranks(topo.ranks(), move |r, t| {
        let hier = Allreducer::new(
            t.clone(),
            Algorithm::Hierarchical(Hierarchical {
                across: Across::Ring,
                chunk_bytes: 2048,
            }),
            topo,
        )
        .expect("hierarchical");
        let rhd = Allreducer::new(t, Algorithm::Rhd, topo).expect("rhd");
        let mut out = Vec::new();
        for (salt, len) in [3usize, 5000, 40_011].into_iter().enumerate() {
            for average in [false, true] {
                let src = scattered(r, len, salt);
                let mut a: Vec<f16> = src.iter().map(|&v| f16::from_f32(v / 4.0)).collect();
                let mut b = a.clone();
                hier.allreduce_f16(&mut a, average)
                    .expect("hierarchical f16");
                rhd.allreduce_f16(&mut b, average).expect("rhd f16");
                let mut c: Vec<bf16> = src.iter().map(|&v| bf16::from_f32(v / 4.0)).collect();
                let mut d = c.clone();
                hier.allreduce_bf16(&mut c, average)
                    .expect("hierarchical bf16");
                rhd.allreduce_bf16(&mut d, average).expect("rhd bf16");
                let h = |v: &[f16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                let b16 = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                out.push((h(&a), h(&b), b16(&c), b16(&d)));
            }
        }
        out
    });
    for (r, res) in results.iter().enumerate() {
        for (k, (a, b, c, d)) in res.iter().enumerate() {
            assert_eq!(a, b, "rank {r} case {k}: f16 hierarchical vs rhd");
            assert_eq!(c, d, "rank {r} case {k}: bf16 hierarchical vs rhd");
            assert_eq!(a, &results[0][k].0, "rank {r} case {k}: f16 vs rank 0");
        }
    }
}

#[test]
fn one_node_and_one_rank_per_node_work_too() {
    // A script that asks for `hierarchical` runs on one machine and on a cluster alike: on one
    // node it is shm, with one rank per node the algorithm between the nodes alone.
    for topo in [Topology::flat(4), Topology::new(4, 1)] {
        let results = on_ranks(4, move |r, t| {
            let ar =
                Allreducer::new(t, Algorithm::hierarchical(Across::Rhd), topo).expect("allreducer");
            let mut buf = input(r, 25_003, 1);
            ar.allreduce_f32(&mut buf, true).expect("mean");
            buf
        });
        let mean: Vec<f32> = (0..25_003)
            .map(|i| (0..4).map(|r| input(r, 25_003, 1)[i]).sum::<f32>() / 4.0)
            .collect();
        for (r, res) in results.iter().enumerate() {
            assert!(res == &mean, "{topo:?} rank {r}");
        }
    }
}

#[test]
fn what_it_cannot_run_is_refused_by_name() {
    let t: std::sync::Arc<dyn ddl_comm::Transport> =
        std::sync::Arc::new(ddl_comm::thread_group(1).pop().expect("one"));
    let topo = Topology::flat(1);
    let err = Allreducer::new(t.clone(), Algorithm::hierarchical(Across::Mpi), topo)
        .expect_err("no MPI here");
    assert!(matches!(err, CommError::Unsupported(_)), "{err}");
    assert!(err.to_string().contains("hierarchical:rhd"), "{err}");
    let tiny = Algorithm::Hierarchical(Hierarchical {
        across: Across::Rhd,
        chunk_bytes: 64,
    });
    let err = Allreducer::new(t, tiny, topo).expect_err("chunk below a line");
    assert!(matches!(err, CommError::InvalidArgument(_)), "{err}");
    assert!(err.to_string().contains("chunks of 128 bytes"), "{err}");
}

#[test]
fn names_parse_and_print() {
    for (text, across, chunk_bytes, printed) in [
        ("hierarchical", Across::Rhd, 4 << 20, "hierarchical:rhd"),
        ("hierarchical:mpi", Across::Mpi, 4 << 20, "hierarchical:mpi"),
        (
            "hierarchical:ring",
            Across::Ring,
            4 << 20,
            "hierarchical:ring",
        ),
        (
            "hierarchical:rhd:4096",
            Across::Rhd,
            4096,
            "hierarchical:rhd:4096",
        ),
    ] {
        let a = Algorithm::Hierarchical(Hierarchical {
            across,
            chunk_bytes,
        });
        assert_eq!(text.parse::<Algorithm>().expect(text), a);
        assert_eq!(a.to_string(), printed);
        assert_eq!(printed.parse::<Algorithm>().expect(printed), a);
    }
    let err = "hierarchical:multicolor"
        .parse::<Algorithm>()
        .expect_err("not between nodes");
    assert!(err.to_string().contains("ring, rhd or mpi"), "{err}");
    assert!("hierarchical:rhd:0".parse::<Algorithm>().is_err());
}
