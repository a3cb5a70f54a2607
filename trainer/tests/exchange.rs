//! `exchange` and exact elastic resume, with nodes emulated by ranks (threads of this
//! process) under `residency` rank, audited through `trace_records`, on shards that divide
//! evenly over the nodes and on shards that do not: every epoch serves each record at most
//! once over the job and all of them but fewer than one global step's, each node exactly
//! records the placement gives it, the records that arrived at the nodes are those the plan
//! counts, the same seed gives the same trace, and an epoch stopped on one layout and finished
//! on another serves every record at most once (all of them but the last incomplete step's).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use ddl_loader::exchange_cost::exchange_cost;
use ddl_loader::placement::Placement;
use ddl_loader::trace_records::{read, TraceLine};
use ddl_trainer::config::ResidencyMode;
use ddl_trainer::TrainConfig;

use crate::common;

/// 96 records in 6 shards of 16: 48 per node on 2 nodes, 32 on 3.
const EVEN: [usize; 6] = [16; 6];
/// 53 records that do not divide evenly: 32 and 21 at home on 2 nodes (27 and 26 held),
/// 25, 17 and 11 on 3 (18, 18 and 17 held).
const UNEVEN: [usize; 5] = [13, 9, 11, 12, 8];
const BATCH: usize = 4;

fn setup(dir: &Path, sizes: &[usize]) -> std::path::PathBuf {
    let data = dir.join(format!("data-{}", sizes.len()));
    common::make_shards(&data, 4, sizes, 32);
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

fn placement(sizes: &[usize], nodes: usize, q: f64, cfg: &TrainConfig) -> Placement {
    let shards: Vec<u64> = sizes.iter().map(|&n| n as u64).collect();
    Placement::new(&shards, nodes, q, cfg.seed).unwrap()
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

/// Checks one epoch's ids over the job: none twice, and fewer than `global_step` of the
/// split's `records` never served.
fn once_but_a_step(ids: &[u64], records: usize, global_step: usize, at: &str) {
    let distinct: BTreeSet<u64> = ids.iter().copied().collect();
    assert_eq!(distinct.len(), ids.len(), "{at}: a record served twice");
    let left = records - distinct.len();
    assert!(
        left < global_step,
        "{at}: {left} of {records} records never served"
    );
}

#[test]
fn every_epoch_serves_each_record_once_each_node_what_the_placement_gives_it() {
    let tmp = ddl_testkit::scratch("exchange-accounting");
    for (sizes, nodes, q) in [
        (&EVEN[..], 2usize, 0.5),
        (&EVEN[..], 3, 1.0),
        (&UNEVEN[..], 2, 0.0),
        (&UNEVEN[..], 2, 0.25),
        (&UNEVEN[..], 3, 0.5),
        (&UNEVEN[..], 3, 0.0),
    ] {
        let data = setup(tmp.path(), sizes);
        let records: usize = sizes.iter().sum();
        let run = tmp.path().join(format!("run-{}-{nodes}-{q}", sizes.len()));
        let cfg = config(&data, &run, q, 3, "cpu:1");
        let summaries = common::run_all(&cfg, nodes);
        let served = by_epoch_and_rank(&lines(&run, nodes));
        let p = placement(sizes, nodes, q, &cfg);
        for epoch in 0..3u64 {
            let at = format!("{records} records, {nodes} nodes, Q {q}, epoch {epoch}");
            let held = p.holdings(epoch);
            let all: Vec<u64> = (0..nodes)
                .flat_map(|r| served[&(epoch, r)].clone())
                .collect();
            once_but_a_step(&all, records, nodes * BATCH, &at);
            for node in 0..nodes {
                let mine: BTreeSet<u32> = held.node(node).iter().copied().collect();
                assert!(
                    served[&(epoch, node)]
                        .iter()
                        .all(|&id| mine.contains(&(id as u32))),
                    "{at}: node {node} served records the placement does not give it"
                );
            }
            // What arrived at the nodes, counted as it arrived, is what the plan counts:
            // into epoch 0 the records that even the nodes out.
            let moved = summaries[0].epochs[epoch as usize]
                .exchange
                .map_or(0, |x| x.records);
            let planned = match epoch {
                0 if q > 0.0 => p.evened() as u64,
                0 => 0,
                e => exchange_cost(&p, e, 0.0).records(),
            };
            assert_eq!(moved, planned, "{at}: records received");
            assert!(
                epoch == 0 || (moved > 0) == (q > 0.0),
                "{at}: {moved} moved"
            );
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

#[test]
fn nodes_of_two_ranks_share_what_their_leader_receives() {
    let tmp = ddl_testkit::scratch("exchange-node-residency");
    let data = setup(tmp.path(), &UNEVEN);
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
    let p = placement(&UNEVEN, 2, 0.5, &cfg);
    let node = |e: u64, n: usize| -> Vec<u64> {
        served[&(e, 2 * n)]
            .iter()
            .chain(&served[&(e, 2 * n + 1)])
            .copied()
            .collect()
    };
    for epoch in 0..3 {
        let all: Vec<u64> = (0..2).flat_map(|n| node(epoch, n)).collect();
        once_but_a_step(&all, 53, 2 * 2 * BATCH, &format!("epoch {epoch}"));
        for n in 0..2 {
            let mine = p.holdings(epoch);
            assert!(node(epoch, n)
                .iter()
                .all(|&id| mine.node(n).contains(&(id as u32))));
        }
    }
    let first = p.holdings(0);
    let moved = node(2, 0)
        .into_iter()
        .filter(|&id| !first.node(0).contains(&(id as u32)));
    assert!(
        moved.count() > 0,
        "node 0 serves records of epoch 0's other node in epoch 2"
    );
    let received = results[0].as_ref().unwrap().epochs[2]
        .exchange
        .map_or(0, |x| x.records);
    assert_eq!(received, exchange_cost(&p, 2, 0.0).records());
}

/// Stops a run of `from` nodes x `from_devices` mid-epoch 1 on shards of `sizes` and resumes
/// it on `to` nodes x `to_devices`; each epoch's ids over both runs: none twice, and all but
/// fewer than the last incomplete step's worth of the layout that ends it.
fn stop_and_resume(
    sizes: &[usize],
    q: f64,
    (from, from_devices): (usize, &str),
    (to, to_devices): (usize, &str),
) {
    let tmp = ddl_testkit::scratch("exchange-elastic");
    let data = setup(tmp.path(), sizes);
    let records: usize = sizes.iter().sum();
    let first = tmp.path().join("first");
    let mut cfg = config(&data, &first, q, 3, from_devices);
    let replicas = |d: &str| d.trim_start_matches("cpu:").parse::<usize>().unwrap();
    let fewest = *placement(sizes, from, q, &cfg)
        .counts()
        .iter()
        .min()
        .unwrap();
    let steps = (fewest / (BATCH * replicas(from_devices))) as u64;
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
    let per_step = |nodes: usize, devices: &str| nodes * BATCH * replicas(devices);
    for epoch in 0..3 {
        let ids: Vec<u64> = lines(&first, from)
            .into_iter()
            .chain(lines(&second, to))
            .filter(|l| l.epoch == epoch)
            .flat_map(|l| l.ids)
            .collect();
        let step = match epoch {
            0 => per_step(from, from_devices),
            _ => per_step(to, to_devices),
        };
        once_but_a_step(
            &ids,
            records,
            step,
            &format!("epoch {epoch}, {from} -> {to} nodes"),
        );
    }
}

#[test]
fn an_epoch_stopped_on_three_nodes_ends_on_two_serving_each_record_once() {
    stop_and_resume(&EVEN, 0.5, (3, "cpu:1"), (2, "cpu:1"));
}

#[test]
fn an_epoch_stopped_on_two_nodes_ends_on_three_serving_each_record_once() {
    stop_and_resume(&UNEVEN, 0.0, (2, "cpu:1"), (3, "cpu:1"));
}

#[test]
fn an_epoch_stopped_with_two_replicas_ends_with_one_serving_each_record_once() {
    stop_and_resume(&UNEVEN, 0.25, (2, "cpu:2"), (2, "cpu:1"));
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
