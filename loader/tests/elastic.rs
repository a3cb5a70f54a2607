//! Exact elastic resume against brute force: the served set recomputed from a layout equals
//! the global ids the real pipelines of every rank delivered, and a remainder opened on a new
//! layout serves exactly the rest.

use std::path::Path;
use std::sync::Arc;

use crate::common;

use common::{solid_record, write_dataset, TestRecord};
use ddl_loader::dataset::{Dataset, OpenOptions, Residency};
use ddl_loader::elastic::{node_records, remainder, served, served_after, Layout};
use ddl_loader::manifest::Manifest;
use ddl_loader::pipeline::{Pipeline, PipelineConfig};
use ddl_loader::placement::Placement;
use ddl_loader::progress::EpochProgress;
use ddl_loader::sampler::{Sampler, Tail};
use ddl_testkit::scratch;

fn layout(nodes: usize, ranks: usize, batch: usize, tail: Tail, exchange: f64) -> Layout {
    Layout {
        nodes,
        ranks_in_node: ranks,
        replicas: 1,
        batch_per_replica: batch,
        tail,
        seed: 21,
        exchange,
    }
}

/// The global ids a pipeline over `dataset` and `sampler` delivers in `steps` steps of `epoch`.
fn delivered(dataset: Arc<Dataset>, sampler: Sampler, epoch: u64, steps: usize) -> Vec<u64> {
    let cfg = PipelineConfig {
        image_size: 16,
        workers: 1,
        prefetch: 1,
        ..PipelineConfig::default()
    };
    let pipeline = Pipeline::start(dataset, sampler, cfg, epoch, 0).unwrap();
    let mut ids = Vec::new();
    for batch in pipeline.replica(0).take(steps) {
        ids.extend_from_slice(&batch.unwrap().indices);
    }
    ids
}

/// What every rank of `l` delivers in `steps` steps of `epoch`, each node serving what the
/// placement gives it (its shards evened out over the nodes, or the exchange's records),
/// read from every shard.
fn brute(dir: &Path, l: &Layout, epoch: u64, steps: usize) -> Vec<u64> {
    let m = Manifest::load(dir).unwrap();
    let shards: Vec<u64> = m.splits["train"].shards.iter().map(|s| s.records).collect();
    let holdings = Placement::new(&shards, l.nodes, l.exchange, l.seed)
        .unwrap()
        .holdings(epoch);
    let all = Residency { node: 0, nodes: 1 };
    let opts = OpenOptions::default();
    let every = Dataset::open(dir, "train", all, &opts).unwrap();
    let mut ids = Vec::new();
    for node in 0..l.nodes {
        let dataset = Arc::new(every.holding(holdings.node(node), None).unwrap());
        for r in 0..l.ranks_in_node {
            let job = node_records(&holdings);
            let sampler = Sampler::new(dataset.len(), job, l.sampler_config(r));
            ids.extend(delivered(dataset.clone(), sampler, epoch, steps));
        }
    }
    ids
}

fn write(dir: &Path) -> u64 {
    let records: Vec<TestRecord> = (0..47).map(solid_record).collect();
    write_dataset(dir, "train", &records, 5, 1);
    47
}

#[test]
fn the_recomputed_served_set_is_what_the_pipelines_delivered() {
    let dir = scratch("elastic-served");
    write(dir.path());
    let m = Manifest::load(dir.path()).unwrap();
    let shards: Vec<u64> = m.splits["train"].shards.iter().map(|s| s.records).collect();
    for l in [
        layout(2, 1, 4, Tail::Drop, 0.0),
        layout(2, 2, 2, Tail::Short, 0.5),
        layout(3, 1, 3, Tail::Pad, 1.0),
    ] {
        for (epoch, steps) in [(0, 1), (2, 2)] {
            let got = served(&shards, &l, epoch, steps).unwrap();
            let want = brute(dir.path(), &l, epoch, steps);
            assert!(want.iter().all(|&id| got.is_served(id)), "{l:?}");
            let mut distinct = want.clone();
            distinct.sort_unstable();
            distinct.dedup();
            assert_eq!(got.served(), distinct.len() as u64, "{l:?} epoch {epoch}");
        }
    }
}

#[test]
fn a_remainder_on_another_layout_serves_each_record_left_once() {
    let dir = scratch("elastic-remainder");
    let records = write(dir.path());
    let m = Manifest::load(dir.path()).unwrap();
    let shards: Vec<u64> = m.splits["train"].shards.iter().map(|s| s.records).collect();
    let old = layout(2, 2, 2, Tail::Drop, 0.5);
    let before = served(&shards, &old, 1, 2).unwrap();
    let new = layout(3, 1, 3, Tail::Drop, 0.0);
    let (mut all, mut steps) = (Vec::new(), None);
    let mut per_rank = Vec::new();
    for node in 0..new.nodes {
        let r = remainder(
            dir.path(),
            "train",
            &before,
            Residency {
                node,
                nodes: new.nodes,
            },
            new.sampler_config(0),
            &OpenOptions::default(),
        )
        .unwrap()
        .expect("steps are left");
        let n = r.sampler.steps_per_epoch();
        assert_eq!(
            *steps.get_or_insert(n),
            n,
            "every node takes the same steps"
        );
        let ids = delivered(Arc::new(r.dataset), r.sampler, 1, n);
        per_rank.push(ids.clone());
        all.extend(ids);
    }
    let served_now = all.len() as u64;
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len() as u64, served_now, "a record served twice");
    assert!(all.iter().all(|&id| !before.is_served(id)));
    let left = records - before.served() - served_now;
    assert!(
        left < (new.nodes * new.batch_per_replica) as u64,
        "{left} left out"
    );
    // The remainder stopped after one step, recomputed, adds exactly its first batches.
    let after = served_after(&before, &new, 1).unwrap();
    let first: Vec<u64> = per_rank.iter().flat_map(|ids| ids[..3].to_vec()).collect();
    assert_eq!(after.served(), before.served() + 3 * new.nodes as u64);
    assert!(first.iter().all(|&id| after.is_served(id)));
    // Nothing left to serve: no remainder.
    let mut done = EpochProgress::new(1, records);
    done.mark_rest();
    let none = remainder(
        dir.path(),
        "train",
        &done,
        Residency { node: 0, nodes: 2 },
        new.sampler_config(0),
        &OpenOptions::default(),
    )
    .unwrap();
    assert!(none.is_none());
}

#[test]
fn a_pipeline_moves_on_to_other_records_with_its_threads() {
    let dir = scratch("elastic-next-epoch-over");
    write(dir.path());
    let opts = OpenOptions::default();
    let home = Dataset::open(dir.path(), "train", Residency { node: 0, nodes: 2 }, &opts).unwrap();
    let l = layout(1, 1, 4, Tail::Short, 0.0);
    let sampler = Sampler::new(home.len(), home.len(), l.sampler_config(0));
    let cfg = PipelineConfig {
        image_size: 16,
        workers: 1,
        prefetch: 1,
        ..PipelineConfig::default()
    };
    let pipeline = Pipeline::start(Arc::new(home), sampler, cfg.clone(), 0, 0).unwrap();
    assert!(pipeline.replica(0).next().unwrap().is_ok());
    let odd: Vec<u32> = (0..47).filter(|i| i % 2 == 1).collect();
    let all = Dataset::open(dir.path(), "train", Residency { node: 0, nodes: 1 }, &opts).unwrap();
    let view = Arc::new(all.holding(&odd, None).unwrap());
    let sampler = Sampler::new(view.len(), view.len(), l.sampler_config(0));
    let moved = pipeline
        .next_epoch_over(view.clone(), sampler, cfg.clone(), 1, 0)
        .unwrap();
    let mut ids: Vec<u64> = moved
        .replica(0)
        .flat_map(|b| b.unwrap().indices.clone())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, odd.iter().map(|&i| u64::from(i)).collect::<Vec<u64>>());
    let two = Layout { replicas: 2, ..l };
    let sampler = Sampler::new(view.len(), view.len(), two.sampler_config(0));
    let e = moved
        .next_epoch_over(view, sampler, cfg, 2, 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("replicas"), "{e}");
}
