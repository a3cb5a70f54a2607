//! An independent check of `ddl-prof`'s end-to-end figure: a plain loop that times the
//! loader's batch iterator for a fixed time.
//!
//! `cargo run --release -p ddl-tools --example loader_loop -- SHARDS_DIR [THREADS] [SECONDS]
//! [BATCH] [IMAGE_SIZE] [TRACE.json]` prints `images/s` for the train split of node 0 of 1,
//! with the pipeline's defaults otherwise (random-resized crop, float32 NCHW, prefetch 2,
//! seed 0). With a trace file, ddl-trace recording is on during the loop (to measure its
//! overhead) and the trace is written afterwards.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ddl_loader::dataset::{Dataset, OpenOptions, Residency};
use ddl_loader::pipeline::{Pipeline, PipelineConfig};
use ddl_loader::sampler::{Sampler, SamplerConfig, Tail};

fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: T) -> Result<T> {
    match args.get(i) {
        Some(s) => s
            .parse()
            .ok()
            .with_context(|| format!("argument {i}: {s:?}")),
        None => Ok(default),
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let dir = args.get(1).context(
        "usage: loader_loop SHARDS_DIR [THREADS] [SECONDS] [BATCH] [IMAGE_SIZE] [TRACE.json]",
    )?;
    let threads: usize = arg(&args, 2, 2)?;
    let seconds: f64 = arg(&args, 3, 10.0)?;
    let batch: usize = arg(&args, 4, 256)?;
    let size: u32 = arg(&args, 5, 224)?;
    let trace = args.get(6);
    if trace.is_some() {
        ddl_trace::enable();
    }
    let opts = OpenOptions {
        populate: true,
        ..OpenOptions::default()
    };
    let ds = Arc::new(Dataset::open(
        dir.as_ref(),
        "train",
        Residency { node: 0, nodes: 1 },
        &opts,
    )?);
    let scfg = SamplerConfig {
        seed: 0,
        ranks_in_node: 1,
        rank_in_node: 0,
        replicas: 1,
        batch_per_replica: batch,
        tail: Tail::Drop,
        shuffle: true,
    };
    let cfg = PipelineConfig {
        image_size: size,
        workers: threads,
        ..PipelineConfig::default()
    };
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let mut images = 0usize;
    let mut epoch = 0;
    while Instant::now() < deadline {
        let sampler = Sampler::try_new(ds.len(), ds.len(), scfg.clone())?;
        let pipeline = Pipeline::start(Arc::clone(&ds), sampler, cfg.clone(), epoch, 0)?;
        for batch in pipeline.replica(0) {
            images += batch?.len();
            if Instant::now() >= deadline {
                break;
            }
        }
        epoch += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "loader_loop: {threads} threads, {images} images in {secs:.2} s: {:.0} images/s",
        images as f64 / secs
    );
    if let Some(path) = trace {
        let n = ddl_trace::write(path.as_ref())?;
        println!("loader_loop: trace of {n} spans -> {path}");
    }
    Ok(())
}
