//! `exchange` and exact elastic resume, with nodes emulated by ranks (threads of this
//! process) under `residency` rank, audited through `trace_records`: every epoch serves each
//! record once over the job, a node's records change by about `Q (P - 1) / P` between epochs,
//! the same seed gives the same trace, and an epoch stopped on one layout and finished on
//! another serves every record at most once (all of them but the last incomplete step's).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use ddl_loader::exchange_cost::exchange_cost;
use ddl_loader::placement::Placement;
use ddl_loader::trace_records::{read, TraceLine};
use ddl_trainer::config::ResidencyMode;
use ddl_trainer::TrainConfig;

use crate::common;

/// Train records: 4 classes x 24, in 6 shards of 16: 48 per node on 2 nodes, 32 on 3.
const RECORDS: usize = 96;
const BATCH: usize = 4;

fn setup(dir: &Path) -> std::path::PathBuf {
    let data = dir.join("data");
    common::make_dataset(&data, 4, RECORDS / 4, 0, 6, 0, 32);
    data
}

/// A run of `epochs` epochs exchanging `q`, its trace at `run/trace.jsonl`.
fn config(data: &Path, run: &Path, q: f64, epochs: u32, devices: &str) -> TrainConfig {
    let mut cfg = common::config(data, "convnet_nobn", BATCH, devices);
    cfg.residency = ResidencyMode::Rank;
    cfg.epochs = epochs;
    cfg.exchange = q;
    cfg.stage = Some(run.join("stage"));
    cfg.trace_records = Some(run.join("trace.jsonl"));
    cfg.checkpoint_dir = Some(run.join("ck"));
    cfg
}

/// Every line of the `ranks` ranks' traces under `run`.
fn lines(run: &Path, ranks: usize) -> Vec<TraceLine> {
    let file = |r: usize| match ranks {
        1 => run.join("trace.jsonl"),
        _ => run.join(format!("trace.jsonl.{r}")),
    };
    (0..ranks).flat_map(|r| read(&file(r)).unwrap()).collect()
}

/// The ids each epoch served, per rank.
fn by_epoch_and_rank(lines: &[TraceLine]) -> BTreeMap<(u64, usize), Vec<u64>> {
    let mut out: BTreeMap<(u64, usize), Vec<u64>> = BTreeMap::new();
    for l in lines {
        out.entry((l.epoch, l.rank)).or_default().extend(&l.ids);
    }
    out
}

#[test]
fn every_epoch_serves_each_record_once_and_nodes_change_by_about_q() {
    let tmp = ddl_testkit::scratch("exchange-accounting");
    let data = setup(tmp.path());
    for nodes in [2usize, 3] {
        for q in [0.0, 0.25, 0.5, 1.0] {
            let run = tmp.path().join(format!("run-{nodes}-{q}"));
            let cfg = config(&data, &run, q, 3, "cpu:1");
            let summaries = common::run_all(&cfg, nodes);
            let served = by_epoch_and_rank(&lines(&run, nodes));
            for epoch in 0..3 {
                let mut all: Vec<u64> = (0..nodes)
                    .flat_map(|r| served[&(epoch, r)].clone())
                    .collect();
                all.sort_unstable();
                assert_eq!(
                    all,
                    (0..RECORDS as u64).collect::<Vec<_>>(),
                    "{nodes} nodes, Q {q}, epoch {epoch}"
                );
            }
            let share = (RECORDS / nodes) as f64;
            for epoch in 0..2 {
                for rank in 0..nodes {
                    let a: BTreeSet<u64> = served[&(epoch, rank)].iter().copied().collect();
                    let b: BTreeSet<u64> = served[&(epoch + 1, rank)].iter().copied().collect();
                    let changed = a.difference(&b).count() as f64 / share;
                    let expected = q * (nodes - 1) as f64 / nodes as f64;
                    assert!(
                        (changed - expected).abs() <= 0.2,
                        "{nodes} nodes, Q {q}, node {rank}, epoch {epoch}: {changed:.2} changed, about {expected:.2} expected"
                    );
                    if q == 0.0 {
                        assert_eq!(a, b, "Q 0 keeps every node's records");
                    }
                }
            }
            // The plan (ddl-plan, ddl-bench sim) predicts what moved, record for record.
            let placement = Placement::new(&[16; 6], nodes, q, cfg.seed).unwrap();
            for epoch in 1..3 {
                let moved = summaries[0].epochs[epoch].exchange.map_or(0, |x| x.records);
                let planned = exchange_cost(&placement, epoch as u64, 0.0).records();
                assert_eq!(moved, planned, "{nodes} nodes, Q {q}, into epoch {epoch}");
                assert_eq!(moved > 0, q > 0.0, "{nodes} nodes, Q {q}: {moved} moved");
            }
            if q == 0.5 && nodes == 2 {
                let again = tmp.path().join("again");
                common::run_all(&config(&data, &again, q, 3, "cpu:1"), nodes);
                assert_eq!(
                    lines(&again, nodes),
                    lines(&run, nodes),
                    "same seed, same trace"
                );
            }
        }
    }
}

#[test]
fn nodes_of_two_ranks_share_what_their_leader_receives() {
    let tmp = ddl_testkit::scratch("exchange-node-residency");
    let data = setup(tmp.path());
    let run = tmp.path().join("run");
    let mut cfg = config(&data, &run, 0.5, 3, "cpu:1");
    cfg.residency = ResidencyMode::Node;
    cfg.lock = true;
    let results = common::try_nodes(&cfg, 2, 2);
    for (rank, r) in results.iter().enumerate() {
        if let Err(e) = r {
            eprintln!("rank {rank}: {e}");
        }
    }
    if let Some(e) = common::first_error(&results) {
        panic!("training failed: {e}");
    }
    let served = by_epoch_and_rank(&lines(&run, 4));
    for epoch in 0..3 {
        let mut all: Vec<u64> = (0..4).flat_map(|r| served[&(epoch, r)].clone()).collect();
        all.sort_unstable();
        assert_eq!(
            all,
            (0..RECORDS as u64).collect::<Vec<_>>(),
            "epoch {epoch}"
        );
    }
    let node0 = |e: u64| -> BTreeSet<u64> {
        served[&(e, 0)]
            .iter()
            .chain(&served[&(e, 1)])
            .copied()
            .collect()
    };
    assert_ne!(node0(0), node0(2), "node 0's records changed");
}

/// Stops a run of `from` nodes x `from_devices` mid-epoch 1 and resumes it on `to` nodes x
/// `to_devices`; epoch 1's ids over both runs: none twice, and all but fewer than the last
/// incomplete step's worth on the new layout.
fn stop_and_resume(q: f64, (from, from_devices): (usize, &str), (to, to_devices): (usize, &str)) {
    let tmp = ddl_testkit::scratch("exchange-elastic");
    let data = setup(tmp.path());
    let first = tmp.path().join("first");
    let mut cfg = config(&data, &first, q, 3, from_devices);
    let replicas = |d: &str| d.trim_start_matches("cpu:").parse::<usize>().unwrap();
    let steps = (RECORDS / from / (BATCH * replicas(from_devices))) as u64;
    cfg.max_steps = Some(steps + steps / 2);
    common::run_all(&cfg, from);
    let second = tmp.path().join("second");
    std::fs::create_dir_all(&second).unwrap();
    let mut cfg = config(&data, &second, q, 3, to_devices);
    cfg.checkpoint_dir = Some(first.join("ck"));
    cfg.resume = true;
    cfg.allow_new_layout = true;
    let resumed = common::run_all(&cfg, to);
    assert!(resumed[0].resumed_from.is_some(), "the second run resumed");
    let mut epoch1: Vec<u64> = lines(&first, from)
        .into_iter()
        .chain(lines(&second, to))
        .filter(|l| l.epoch == 1)
        .flat_map(|l| l.ids)
        .collect();
    epoch1.sort_unstable();
    let distinct: BTreeSet<u64> = epoch1.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        epoch1.len(),
        "a record served twice in epoch 1"
    );
    let per_step = to * BATCH * replicas(to_devices);
    let missing = RECORDS - distinct.len();
    assert!(
        missing < per_step,
        "{missing} records of epoch 1 never served ({from} -> {to} nodes)"
    );
    for epoch in [0u64, 2] {
        let mut all: Vec<u64> = lines(&first, from)
            .into_iter()
            .chain(lines(&second, to))
            .filter(|l| l.epoch == epoch)
            .flat_map(|l| l.ids)
            .collect();
        all.sort_unstable();
        assert_eq!(
            all,
            (0..RECORDS as u64).collect::<Vec<_>>(),
            "epoch {epoch}"
        );
    }
}

#[test]
fn an_epoch_stopped_on_three_nodes_ends_on_two_serving_each_record_once() {
    stop_and_resume(0.5, (3, "cpu:1"), (2, "cpu:1"));
}

#[test]
fn an_epoch_stopped_on_two_nodes_ends_on_three_serving_each_record_once() {
    stop_and_resume(0.0, (2, "cpu:1"), (3, "cpu:1"));
}

#[test]
fn an_epoch_stopped_with_two_replicas_ends_with_one_serving_each_record_once() {
    stop_and_resume(0.25, (2, "cpu:2"), (2, "cpu:1"));
}

#[test]
fn a_fraction_outside_zero_to_one_is_refused_and_one_node_is_a_note() {
    let tmp = ddl_testkit::scratch("exchange-flags");
    let data = tmp.path().join("data");
    common::make_dataset(&data, 2, 4, 0, 2, 1, 32);
    let mut cfg = common::config(&data, "resnet_small", 4, "cpu:1");
    for q in [-0.5, 1.5, f64::NAN] {
        cfg.exchange = q;
        let results = common::try_all(&cfg, 1);
        let e = common::first_error(&results).expect("refused").to_string();
        assert!(e.contains("--exchange"), "{q}: {e}");
    }
    cfg.exchange = 0.25;
    let one = common::run_ranks(&cfg, 1);
    assert!(
        one.epochs[0].exchange.is_none(),
        "one node exchanges nothing"
    );
}
