//! Cost model: formulas, choice, presets and JSON round trip.

use ddl_comm::{Algorithm, CostModel, MeasuredCurve, Multicolor, Multiring, Shm, Tier, Topology};

fn tier(alpha: f64, beta: f64, gamma: f64) -> Tier {
    Tier::new("t", alpha, beta, gamma)
}

/// Node-local links 10x faster than the node links.
fn two_tier() -> CostModel {
    CostModel {
        intra: tier(1e-6, 1e-9, 1e-10),
        inter: tier(1e-5, 1e-8, 1e-10),
        source: "test".into(),
        copy: 0.0,
        shm_sync: 0.0,
        measured: Vec::new(),
        other: serde_json::Map::new(),
    }
}

#[test]
fn beta_curve_interpolates_in_log_size_and_clamps() {
    let mut t = tier(1e-6, 1e-9, 0.0);
    assert_eq!(t.beta_at(123), 1e-9);
    t.beta_curve = vec![(1 << 20, 1e-10), (4 << 20, 3e-10), (16 << 20, 1e-9)];
    // Measured with rings of 4 ranks: a step load of L bytes reads the curve at 4 L.
    t.curve_ranks = 4;
    assert_eq!(t.beta_load((4 << 20) as f64), 1e-9);
    assert_eq!(t.beta_at(1 << 10), 1e-10);
    assert_eq!(t.beta_at(1 << 20), 1e-10);
    assert!((t.beta_at(2 << 20) - 2e-10).abs() < 1e-18);
    assert!((t.beta_at(4 << 20) - 3e-10).abs() < 1e-18);
    assert!((t.beta_at(8 << 20) - 6.5e-10).abs() < 1e-18);
    assert_eq!(t.beta_at(1 << 30), 1e-9);
    // A 4-rank ring uses the beta of its buffer size.
    let m = CostModel {
        intra: t.clone(),
        inter: t,
        source: "test".into(),
        copy: 0.0,
        shm_sync: 0.0,
        measured: Vec::new(),
        other: serde_json::Map::new(),
    };
    let n = 16 << 20;
    let expect = 2.0 * 3.0 * (1e-6 + n as f64 / 4.0 * 1e-9);
    let got = m.predict(&Algorithm::Ring, n, Topology::flat(4));
    assert!((got - expect).abs() < 1e-12, "{got} vs {expect}");
    // A curve survives the JSON round trip.
    let text = serde_json::to_string(&m).expect("json");
    assert_eq!(serde_json::from_str::<CostModel>(&text).expect("parse"), m);
}

#[test]
fn ring_prediction_matches_the_alpha_beta_gamma_formula() {
    let m = two_tier();
    let n = 1 << 20;
    let p = 8.0;
    let t = m.predict(&Algorithm::Ring, n, Topology::flat(8));
    let expect = 2.0 * (p - 1.0) * (1e-6 + n as f64 / p * 1e-9) + (p - 1.0) * n as f64 / p * 1e-10;
    assert!((t - expect).abs() < 1e-12, "{t} vs {expect}");
    // Crossing nodes makes every step pay the slower tier.
    assert!(m.predict(&Algorithm::Ring, n, Topology::new(2, 4)) > t);
    // One rank or no data costs nothing.
    assert_eq!(m.predict(&Algorithm::Rhd, n, Topology::flat(1)), 0.0);
    assert_eq!(m.predict(&Algorithm::Ring, 0, Topology::flat(4)), 0.0);
}

#[test]
fn predictions_grow_with_size_and_auto_picks_the_minimum() {
    let m = CostModel::minsky();
    let topo = Topology::new(64, 4);
    let algos = [
        Algorithm::Ring,
        Algorithm::Rhd,
        Algorithm::Multicolor(Multicolor {
            colors: 4,
            chunk_bytes: 1 << 18,
        }),
        Algorithm::Multiring(Multiring {
            dims: vec![],
            segments: 0,
        }),
    ];
    for a in &algos {
        let mut last = 0.0;
        for bytes in [4 << 10, 1 << 20, 16 << 20, 100 << 20] {
            let t = m.predict(a, bytes, topo);
            assert!(t > last, "{a} {bytes}");
            last = t;
        }
    }
    for bytes in [4 << 10, 100 << 20] {
        let best = m.choose(bytes, topo);
        let tb = m.predict(&best, bytes, topo);
        for a in &algos {
            assert!(tb <= m.predict(a, bytes, topo) + 1e-15);
        }
        assert_eq!(m.predict(&Algorithm::Auto, bytes, topo), tb);
    }
    // Latency-bound small messages: recursive halving/doubling beats the 2(p-1)-step ring.
    assert!(m.predict(&Algorithm::Rhd, 4 << 10, topo) < m.predict(&Algorithm::Ring, 4 << 10, topo));
}

#[test]
fn model_json_round_trip_and_presets() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("model.json");
    let m = CostModel::minsky();
    m.save(&path).expect("save");
    assert_eq!(CostModel::load(&path).expect("load"), m);
    std::fs::write(&path, "{not json").expect("write");
    let err = CostModel::load(&path).expect_err("bad json");
    assert!(err.to_string().contains("model.json"), "{err}");
    assert_eq!(
        CostModel::preset("minsky").expect("preset"),
        CostModel::minsky()
    );
    assert!(CostModel::preset("dgx").is_err());
}

#[test]
fn topology_dims_fastest_tier_first() {
    assert_eq!(Topology::new(8, 4).dims(), vec![4, 8]);
    assert_eq!(Topology::new(8, 1).dims(), vec![8]);
    assert_eq!(Topology::flat(1).dims(), vec![1]);
    assert_eq!(Topology::new(3, 2).node_of(5), 2);
}

#[test]
fn pipelined_multiring_overlaps_the_tiers() {
    // Two nodes of four ranks, a slow link: the unsegmented multi-ring pays the node-local
    // reduce-scatter and allgather on top of the link time; in segments they overlap it.
    let m = two_tier();
    let topo = Topology::new(2, 4);
    let n = 64 << 20;
    let one = Algorithm::Multiring(Multiring {
        dims: vec![],
        segments: 1,
    });
    let eight = Algorithm::Multiring(Multiring {
        dims: vec![],
        segments: 8,
    });
    let (t1, t8) = (m.predict(&one, n, topo), m.predict(&eight, n, topo));
    assert!(t8 < t1, "{t8} vs {t1}");
    // Every byte crosses each node link once each way at best: n / 2 per link and phase.
    let link = 2.0 * (n as f64 / 2.0) * 1e-8;
    assert!(t8 > link && t8 < 1.1 * link, "{t8} vs {link}");
    // The flat ring over node-contiguous ranks pushes 2(p-1)/p n through a link: 1.75x.
    let ring = m.predict(&Algorithm::Ring, n, topo);
    assert!(ring / t8 > 1.5, "{ring} vs {t8}");
}

#[test]
fn mpi_follows_open_mpi_decision_rules() {
    use ddl_comm::cost::{open_mpi_choice, OpenMpiAllreduce::*};
    assert_eq!(open_mpi_choice(2, 1 << 20), Ring);
    assert_eq!(open_mpi_choice(2, 1 << 10), RecursiveDoubling);
    assert_eq!(open_mpi_choice(4, 4 << 10), RecursiveDoubling);
    assert_eq!(open_mpi_choice(8, 16 << 20), Ring);
    assert_eq!(open_mpi_choice(64, 64 << 10), RecursiveDoubling);
    // In place, MPI_Allreduce is the ring itself: no copy of the buffer around it.
    let mut m = CostModel::minsky();
    m.copy = 1e-10;
    let topo = Topology::flat(8);
    let n = 16 << 20;
    let ring = m.predict(&Algorithm::Ring, n, topo);
    let mpi = m.predict(&Algorithm::Mpi, n, topo);
    assert!((mpi - ring).abs() < 1e-12, "{mpi} vs {ring}");
    // Small messages: recursive doubling, log2(8) = 3 rounds instead of the ring's 14.
    assert!(m.predict(&Algorithm::Mpi, 4096, topo) < m.predict(&Algorithm::Ring, 4096, topo));
}

#[test]
fn shm_runs_on_one_node_only_and_is_read_from_its_curve() {
    let mut m = two_tier();
    let one = Topology::flat(4);
    let two = Topology::new(2, 2);
    assert_eq!(m.predict(&Algorithm::SHM, 1 << 20, two), f64::INFINITY);
    assert_ne!(m.choose(1 << 20, two), Algorithm::SHM);
    // Without a curve: one synchronisation per chunk plus the copies and the additions.
    m.copy = 1e-10;
    m.shm_sync = 1e-6;
    let n = 4 << 20;
    let Algorithm::Shm(Shm { chunk_bytes }) = Algorithm::SHM else {
        unreachable!("Algorithm::SHM is shm")
    };
    let chunks = (n / chunk_bytes) as f64;
    let expect = chunks * 1e-6 + 0.75 * n as f64 * (2.0 * 1e-10 + 1e-10);
    let got = m.predict(&Algorithm::SHM, n, one);
    assert!((got - expect).abs() < 1e-12, "{got} vs {expect}");
    // With a curve measured in this layout, its points; auto takes shm where it is fastest,
    // and not where shared memory was found missing.
    m.measured
        .push(curve("shm", 1, 4, vec![(4096, 1e-6), (1 << 20, 5e-5)]));
    assert_eq!(m.predict(&Algorithm::SHM, 4096, one), 1e-6);
    assert_eq!(m.choose(4096, one), Algorithm::SHM);
    let without_shm = ddl_comm::auto_candidates(one, false, true);
    assert!(!without_shm.contains(&Algorithm::SHM));
    assert_ne!(m.choose_among(4096, one, &without_shm), Algorithm::SHM);
    // Another chunk size is not what the curve measured: the formula again.
    let other = Algorithm::Shm(Shm { chunk_bytes: 4096 });
    assert_ne!(m.predict(&other, 4096, one), 1e-6);
}

/// A measured curve of `algorithm` in the layout `nodes` x `ranks_per_node`.
fn curve(
    algorithm: &str,
    nodes: usize,
    ranks_per_node: usize,
    points: Vec<(usize, f64)>,
) -> MeasuredCurve {
    MeasuredCurve {
        algorithm: algorithm.into(),
        nodes,
        ranks_per_node,
        points,
    }
}

#[test]
fn a_measured_curve_is_the_prediction_in_its_layout() {
    let mut m = two_tier();
    let topo = Topology::new(2, 4);
    let formula = m.clone();
    m.measured.push(curve(
        "mpi",
        2,
        4,
        vec![(4 << 10, 1e-4), (1 << 20, 1e-3), (16 << 20, 4e-2)],
    ));
    let mpi = |bytes: usize| m.predict(&Algorithm::Mpi, bytes, topo);
    // At the measured sizes: the measured times.
    assert!((mpi(4 << 10) - 1e-4).abs() < 1e-15);
    assert!((mpi(16 << 20) - 4e-2).abs() < 1e-15);
    // Below the smallest point: its latency; above the largest: its time per byte.
    assert!((mpi(8) - 1e-4).abs() < 1e-15);
    assert!((mpi(64 << 20) - 16e-2).abs() < 1e-12);
    // Between points: log(time) linear in log(size), 4 MiB is halfway from 1 to 16 MiB.
    let mid = (1e-3f64 * 4e-2).sqrt();
    assert!(
        (mpi(4 << 20) - mid).abs() < 1e-12,
        "{} vs {mid}",
        mpi(4 << 20)
    );
    assert!(mpi(1 << 20) < mpi(2 << 20) && mpi(2 << 20) < mpi(4 << 20));
    assert_ne!(
        mpi(16 << 20),
        formula.predict(&Algorithm::Mpi, 16 << 20, topo)
    );
    // Another layout (the simulator's) and the other algorithms: the formulas.
    let other = Topology::new(4, 2);
    assert_eq!(
        m.predict(&Algorithm::Mpi, 16 << 20, other),
        formula.predict(&Algorithm::Mpi, 16 << 20, other)
    );
    assert_eq!(
        m.predict(&Algorithm::Rhd, 16 << 20, topo),
        formula.predict(&Algorithm::Rhd, 16 << 20, topo)
    );
    // A curve serves its algorithm with exactly its parameters, named as the algorithm prints.
    let default_colors = Algorithm::Multicolor(Multicolor {
        colors: 4,
        chunk_bytes: 1 << 20,
    });
    let two_colors = Algorithm::Multicolor(Multicolor {
        colors: 2,
        chunk_bytes: 1 << 20,
    });
    m.measured.push(curve(
        &default_colors.to_string(),
        2,
        4,
        vec![(4 << 10, 7e-5)],
    ));
    assert_eq!(m.predict(&default_colors, 4 << 10, topo), 7e-5);
    assert_eq!(
        m.predict(&two_colors, 4 << 10, topo),
        formula.predict(&two_colors, 4 << 10, topo)
    );
    // The curves survive the JSON round trip; a model without any writes no field.
    let text = serde_json::to_string(&m).expect("json");
    assert_eq!(serde_json::from_str::<CostModel>(&text).expect("parse"), m);
    let plain = serde_json::to_string(&formula).expect("json");
    assert!(!plain.contains("measured"), "{plain}");
}

#[test]
fn auto_picks_the_fastest_measured_algorithm_over_the_formulas() {
    // The emulated 2 x 4 cluster's miss: the formulas made rhd the fastest at 1 MiB, where it
    // took 17.5 ms and mpi 14.4. With every candidate measured, auto follows the measurements
    // at and between the measured sizes: the hierarchical algorithm up to 1 MiB, multiring
    // at the top.
    let mut m = two_tier();
    let topo = Topology::new(2, 4);
    let sizes = [4 << 10, 64 << 10, 1 << 20, 16 << 20];
    let times = [
        ("ring", [601e-6, 993e-6, 15.9e-3, 258e-3]),
        ("rhd", [240e-6, 558e-6, 17.5e-3, 168e-3]),
        ("multiring", [294e-6, 573e-6, 18.2e-3, 155e-3]),
        ("multicolor:4:1048576", [161e-6, 600e-6, 19e-3, 165e-3]),
        ("mpi", [155e-6, 561e-6, 14.4e-3, 236e-3]),
        ("hierarchical:rhd", [115e-6, 550e-6, 9.4e-3, 170e-3]),
    ];
    let candidates = ddl_comm::auto_candidates(topo, true, true);
    let names: Vec<String> = candidates.iter().map(|a| a.to_string()).collect();
    let expected = [
        "ring",
        "rhd",
        "multiring",
        "multicolor:4:1048576",
        "hierarchical:rhd",
        "mpi",
    ];
    assert_eq!(names, expected, "no shm across nodes");
    for (name, t) in times {
        m.measured
            .push(curve(name, 2, 4, sizes.iter().copied().zip(t).collect()));
    }
    let choose = |bytes: usize| m.choose_among(bytes, topo, &candidates).to_string();
    assert_eq!(choose(4 << 10), "hierarchical:rhd");
    assert_eq!(choose(64 << 10), "hierarchical:rhd");
    assert_eq!(choose(1 << 20), "hierarchical:rhd");
    assert_eq!(choose(16 << 20), "multiring");
    // Between 1 and 16 MiB the curves cross: hierarchical first, multiring at the top.
    assert_eq!(choose(2 << 20), "hierarchical:rhd");
    assert_eq!(choose(12 << 20), "multiring");
    // Where the nodes' ranks were found not to share memory, hierarchical is no candidate.
    let apart = ddl_comm::auto_candidates(topo, false, true);
    assert_eq!(m.choose_among(4 << 10, topo, &apart).to_string(), "mpi");
    assert_eq!(m.choose_among(1 << 20, topo, &apart).to_string(), "mpi");
    // Without MPI's own allreduce (the thread transport) mpi is no candidate.
    let no_mpi = ddl_comm::auto_candidates(topo, true, false);
    let no_mpi_names: Vec<String> = no_mpi.iter().map(|a| a.to_string()).collect();
    assert_eq!(no_mpi_names, expected[..5]);
    assert_eq!(
        m.choose_among(4 << 10, topo, &no_mpi).to_string(),
        "hierarchical:rhd"
    );
    let apart_no_mpi = ddl_comm::auto_candidates(topo, false, false);
    assert_eq!(
        m.choose_among(4 << 10, topo, &apart_no_mpi).to_string(),
        "multicolor:4:1048576"
    );
    assert_eq!(
        m.choose_among(1 << 20, topo, &apart_no_mpi).to_string(),
        "ring"
    );
}

#[test]
fn shared_memory_chunks_pay_the_per_byte_cost_of_their_whole_buffer() {
    // In-cache below 1 MiB, memory-bound at 16 MiB: multicolor's 1 MiB chunks of a 16 MiB
    // buffer walk the whole buffer, so they cost the 16 MiB per-byte time, as with one beta.
    let mut curved = tier(1e-6, 1e-10, 1e-11);
    curved.beta_curve = vec![(1 << 20, 1e-10), (16 << 20, 1e-9)];
    curved.curve_ranks = 2;
    let flat = tier(1e-6, 1e-9, 1e-11);
    let model = |t: Tier| CostModel {
        intra: t.clone(),
        inter: t,
        source: "test".into(),
        copy: 0.0,
        shm_sync: 0.0,
        measured: Vec::new(),
        other: serde_json::Map::new(),
    };
    let (curved, flat) = (model(curved), model(flat));
    let topo = Topology::flat(2);
    let multicolor = Algorithm::Multicolor(Multicolor {
        colors: 4,
        chunk_bytes: 1 << 20,
    });
    let n = 16 << 20;
    let (a, b) = (
        curved.predict(&multicolor, n, topo),
        flat.predict(&multicolor, n, topo),
    );
    assert!((a - b).abs() < 1e-12, "{a} vs {b}");
    // A 1 MiB buffer stays in the caches: the small-size point.
    let small = curved.predict(&multicolor, 1 << 20, topo);
    assert!(
        small < flat.predict(&multicolor, 1 << 20, topo) / 5.0,
        "{small}"
    );
}
