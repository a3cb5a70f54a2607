//! Shared helpers of the trainer's integration tests: a tiny generated dataset of real JPEGs
//! packed into ddl shards, and weight-dump comparison.

use std::path::Path;
use std::sync::Arc;

use ddl_comm::{thread_group, Topology, Transport};
use ddl_trainer::{train, RankInfo, TrainError, TrainSummary};

use ddl_testkit::{write_manifest, write_shards, Record};
use ddl_trainer::flag::Named;
use ddl_trainer::model::ModelKind;
use ddl_trainer::TrainConfig;

/// A JPEG of class `class`: a class-specific colour with a class-specific stripe direction,
/// jittered per image, so that the classes are easy but not trivial.
fn jpeg(class: usize, i: usize, size: u32) -> Vec<u8> {
    let mut state = (class as u64 * 7919 + i as u64 * 104729) ^ 0x9E37_79B9_7F4A_7C15;
    let mut rnd = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % 1000) as f32 / 1000.0
    };
    let hue = class as f32 / 10.0;
    let tau = std::f32::consts::TAU;
    let base = [
        128.0 + 100.0 * (tau * hue).cos(),
        128.0 + 100.0 * (tau * hue + tau / 3.0).cos(),
        128.0 + 100.0 * (tau * hue + 2.0 * tau / 3.0).cos(),
    ];
    let jitter = 0.8 + 0.4 * rnd();
    let period = 6.0 + (class % 5) as f32 * 3.0;
    let vertical = class % 2 == 0;
    let w = size + (rnd() * 16.0) as u32;
    let h = size;
    let rgb: Vec<u8> = (0..h)
        .flat_map(|y| (0..w).map(move |x| (x, y)))
        .flat_map(|(x, y)| {
            let t = if vertical { x } else { y } as f32;
            let stripe = if (t / period) as u32 % 2 == 0 {
                1.0
            } else {
                0.6
            };
            (0..3).map(move |c| (base[c] * jitter * stripe).clamp(0.0, 255.0) as u8)
        })
        .collect();
    ddl_testkit::encode_jpeg(
        &rgb,
        w as usize,
        h as usize,
        90,
        ddl_testkit::Subsamp::Sub2x2,
    )
}

/// Writes `dir` with `train_per_class` train and `val_per_class` val images of each of
/// `classes` classes, `train_shards` train and `val_shards` val shards, and a manifest.
pub fn make_dataset(
    dir: &Path,
    classes: usize,
    train_per_class: usize,
    val_per_class: usize,
    train_shards: usize,
    val_shards: usize,
    size: u32,
) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let mut splits = Vec::new();
    for (split, per_class, shards, offset) in [
        ("train", train_per_class, train_shards, 0usize),
        ("val", val_per_class, val_shards, 1_000_000),
    ] {
        if per_class == 0 {
            continue;
        }
        // Interleave classes so every shard holds all of them; record k goes to shard k % shards.
        let mut records: Vec<Vec<Record>> = vec![Vec::new(); shards];
        let items = (0..per_class).flat_map(|i| (0..classes).map(move |c| (c, i)));
        for (k, (c, i)) in items.enumerate() {
            records[k % shards].push(Record::jpeg(jpeg(c, i + offset, size), c as u32));
        }
        splits.push((split, write_shards(dir, split, &records, 1)));
    }
    write_manifest(dir, classes, splits, 1);
}

/// Writes `dir` with a train split only, its shards of `sizes` records in turn (global id k
/// of class `k % classes`): shards that need not divide evenly over the nodes.
pub fn make_shards(dir: &Path, classes: usize, sizes: &[usize], size: u32) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let mut k = 0;
    let shards: Vec<Vec<Record>> = sizes
        .iter()
        .map(|&n| {
            (0..n)
                .map(|_| {
                    k += 1;
                    let c = (k - 1) % classes;
                    Record::jpeg(jpeg(c, k, size), c as u32)
                })
                .collect()
        })
        .collect();
    write_manifest(
        dir,
        classes,
        vec![("train", write_shards(dir, "train", &shards, 1))],
        1,
    );
}

/// A quiet CPU configuration on `data` for tests.
pub fn config(data: &Path, model: &str, batch: usize, devices: &str) -> TrainConfig {
    TrainConfig {
        data: data.to_path_buf(),
        model: ModelKind::from_name(model).expect("a model name"),
        epochs: 1,
        batch,
        devices: devices.parse().expect("a device list"),
        image_size: 32,
        workers: 1,
        prefetch: 2,
        seed: 7,
        warmup_epochs: 0.0,
        base_lr: 0.4,
        eval: false,
        verbose: false,
        comm_timeout_s: 120,
        ..TrainConfig::default()
    }
}

/// Trains `cfg` on `ranks` ranks simulated by threads over the in-process transport (all on
/// one node) and returns every rank's result; only rank 0 writes metrics.
pub fn try_all(cfg: &TrainConfig, ranks: usize) -> Vec<ddl_trainer::Result<TrainSummary>> {
    try_nodes(cfg, 1, ranks)
}

/// [`try_all`] on `nodes` emulated nodes of `per_node` ranks each (node-contiguous ranks).
pub fn try_nodes(
    cfg: &TrainConfig,
    nodes: usize,
    per_node: usize,
) -> Vec<ddl_trainer::Result<TrainSummary>> {
    let ranks = nodes * per_node;
    let group = thread_group(ranks);
    std::thread::scope(|s| {
        let handles: Vec<_> = group
            .into_iter()
            .enumerate()
            .map(|(r, t)| {
                let mut cfg = cfg.clone();
                // Every rank is given the flags, as mpirun gives them; rank 0 writes the files
                // (the weights gathered from every rank under --head-parallel).
                if r != 0 {
                    cfg.metrics = None;
                }
                s.spawn(move || {
                    let transport: Arc<dyn Transport> = Arc::new(t);
                    let info = RankInfo {
                        node: r / per_node,
                        nodes,
                        rank_in_node: r % per_node,
                        ranks_in_node: per_node,
                        oversubscribed: false,
                    };
                    train(&cfg, transport, Topology::new(nodes, per_node), info)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}

/// The first error of `results` that a rank met for a reason of its own (not a peer gone).
pub fn first_error(results: &[ddl_trainer::Result<TrainSummary>]) -> Option<&TrainError> {
    results.iter().filter_map(|r| r.as_ref().err()).find(|e| {
        !matches!(
            e,
            TrainError::Comm(ddl_comm::CommError::Disconnected { .. })
        )
    })
}

/// [`try_all`], every rank's summary; panics with the first rank's own error.
pub fn run_all(cfg: &TrainConfig, ranks: usize) -> Vec<TrainSummary> {
    let results = try_all(cfg, ranks);
    if let Some(e) = first_error(&results) {
        panic!("training failed: {e}");
    }
    results
        .into_iter()
        .map(|r| r.expect("training failed"))
        .collect()
}

/// [`run_all`], returning rank 0's summary.
pub fn run_ranks(cfg: &TrainConfig, ranks: usize) -> TrainSummary {
    run_all(cfg, ranks).remove(0)
}
