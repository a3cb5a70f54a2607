//! Writes the batches ddl-train's loader produces for one rank, so that other front ends (the
//! Python package's `ddl.Loader`) can be checked against them bit for bit.
//!
//! `loader_dump SHARDS OUT --split train|val --batch B --size S --workers W --seed N --epoch E
//! --node K --nodes P --rank-in-node R --ranks-in-node L --dtype float32|uint8` writes
//! `OUT/images.bin` (every batch's pixels in order, native-endian), `OUT/labels.bin` (int64) and
//! `OUT/batches.json` (the rows of each batch). The settings follow ddl-train with one replica
//! per rank: train is shuffled with the incomplete last step dropped; val is in order, the last
//! step padded by wrapping around and the padding left out, at resize ceil(8/7 S).

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Parser;
use ddl_loader::dataset::{Dataset, OpenOptions, Residency};
use ddl_loader::elastic;
use ddl_loader::manifest::Manifest;
use ddl_loader::pipeline::{
    Augment, Images, OnBadRecord, Output, Pipeline, PipelineConfig, TrainAugment,
};
use ddl_loader::placement::Placement;
use ddl_loader::sampler::{NodeRecords, Sampler, SamplerConfig, Tail};

#[derive(Parser)]
struct Args {
    /// Shard directory.
    shards: PathBuf,
    /// Output directory (created).
    out: PathBuf,
    #[arg(long, default_value = "train")]
    split: String,
    #[arg(long, default_value_t = 8)]
    batch: usize,
    #[arg(long, default_value_t = 32)]
    size: u32,
    #[arg(long, default_value_t = 1)]
    workers: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long, default_value_t = 0)]
    epoch: u64,
    #[arg(long, default_value_t = 0)]
    node: usize,
    #[arg(long, default_value_t = 1)]
    nodes: usize,
    #[arg(long, default_value_t = 0)]
    rank_in_node: usize,
    #[arg(long, default_value_t = 1)]
    ranks_in_node: usize,
    #[arg(long, default_value = "float32")]
    dtype: String,
}

fn main() -> Result<()> {
    let a = Args::parse();
    let train = a.split != "val";
    let residency = Residency {
        node: a.node,
        nodes: a.nodes,
    };
    let opts = OpenOptions::default();
    // Train: the node's records evened out over the nodes, as ddl-train serves them.
    let (ds, job) = if train {
        let manifest = Manifest::load(&a.shards)?;
        let info = manifest.split(&a.shards, &a.split)?;
        let shards: Vec<u64> = info.shards.iter().map(|s| s.records).collect();
        let placement = Placement::new(&shards, a.nodes, 0.0, a.seed)?;
        let held = placement.holdings(0);
        let ds = Dataset::open_holding(&a.shards, &a.split, residency, held.node(a.node), &opts)?;
        (ds, elastic::node_records(&held))
    } else {
        let ds = Dataset::open(&a.shards, &a.split, residency, &opts)?;
        let n = ds.len();
        (ds, NodeRecords::from(n))
    };
    let ds = Arc::new(ds);
    let sampler = Sampler::try_new(
        ds.len(),
        job,
        SamplerConfig {
            seed: a.seed,
            ranks_in_node: a.ranks_in_node,
            rank_in_node: a.rank_in_node,
            replicas: 1,
            batch_per_replica: a.batch,
            tail: if train { Tail::Drop } else { Tail::Pad },
            shuffle: train,
        },
    )?;
    let cfg = PipelineConfig {
        image_size: a.size,
        output: if a.dtype == "uint8" {
            Output::U8Nhwc
        } else {
            Output::F32Nchw
        },
        augment: if train {
            Augment::Train
        } else {
            Augment::Eval {
                resize: (a.size * 8).div_ceil(7),
            }
        },
        train: TrainAugment::default(),
        workers: a.workers,
        seed: a.seed,
        on_bad_record: if train {
            OnBadRecord::Replace
        } else {
            OnBadRecord::Skip
        },
        ..PipelineConfig::default()
    };
    std::fs::create_dir_all(&a.out).with_context(|| format!("create {}", a.out.display()))?;
    let mut images = std::fs::File::create(a.out.join("images.bin"))?;
    let mut labels = std::fs::File::create(a.out.join("labels.bin"))?;
    let mut rows = Vec::new();
    let pipeline = Pipeline::start(ds.clone(), sampler, cfg, a.epoch, 0)?;
    for batch in pipeline.replica(0) {
        let b = batch?;
        let n = if train {
            b.len()
        } else {
            let first = (b.step * a.ranks_in_node + a.rank_in_node) * a.batch;
            let real = ds.len().saturating_sub(first).min(a.batch);
            real - b.dropped_among_first(real)
        };
        if n == 0 {
            continue;
        }
        let per_image = b.shape()[1..].iter().product::<usize>();
        match &b.images {
            Images::F32(v) => {
                for x in &v[..n * per_image] {
                    images.write_all(&x.to_ne_bytes())?;
                }
            }
            Images::U8(v) => images.write_all(&v[..n * per_image])?,
        }
        for l in &b.labels[..n] {
            labels.write_all(&l.to_ne_bytes())?;
        }
        rows.push(n);
    }
    std::fs::write(
        a.out.join("batches.json"),
        serde_json::to_string(&serde_json::json!({ "rows": rows }))?,
    )?;
    Ok(())
}
