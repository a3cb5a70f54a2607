//! Throughput of the train pipeline on a packed dataset.
//!
//! ```text
//! cargo run --release -p ddl-loader --example loader_bench -- DIR SECONDS WORKERS BATCH \
//!     [--mode full|scaled|region|all] [--output f32|u8] [--size 224] [--split train] \
//!     [--generate N]
//! ```
//!
//! Runs the pipeline (one replica, RandomResizedCrop + flip, `--size` pixels) over the node's
//! records for about SECONDS per decode mode and prints images/s, plus a one-thread
//! full-decode baseline (libjpeg-turbo to RGB, no crop or resize) on the same records and the
//! peak RSS against the pipeline's memory bound. With `--generate N`, DIR is first filled with
//! N ImageNet-like JPEGs (sides 200-500, smooth random patterns plus noise, 4:2:0, quality 90)
//! packed into 4 shards, unless DIR already holds a manifest.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ddl_loader::dataset::{Dataset, OpenOptions, Residency};
use ddl_loader::decode::{plan, DecodeMode, JpegDecoder};
use ddl_loader::manifest::{ClassInfo, Manifest, ShardInfo, SplitInfo};
use ddl_loader::pipeline::{Augment, OnBadRecord, Output, Pipeline, PipelineConfig};
use ddl_loader::sampler::{Sampler, SamplerConfig, Tail, Xoshiro256};
use ddl_loader::shard::ShardWriter;

struct Args {
    dir: PathBuf,
    seconds: f64,
    workers: usize,
    batch: usize,
    modes: Vec<DecodeMode>,
    output: Output,
    size: u32,
    split: String,
    generate: Option<usize>,
}

fn usage() -> String {
    "usage: loader_bench DIR SECONDS WORKERS BATCH [--mode full|scaled|region|all] \
     [--output f32|u8] [--size 224] [--split train] [--generate N]"
        .to_string()
}

fn parse() -> Result<Args, String> {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let mut pos = Vec::new();
    let mut opts = BTreeMap::new();
    let mut it = raw.into_iter();
    while let Some(a) = it.next() {
        if let Some(name) = a.strip_prefix("--") {
            let v = it
                .next()
                .ok_or_else(|| format!("--{name} needs a value\n{}", usage()))?;
            opts.insert(name.to_string(), v);
        } else {
            pos.push(a);
        }
    }
    if pos.len() != 4 {
        return Err(usage());
    }
    let num = |s: &str, what: &str| {
        s.parse::<f64>()
            .map_err(|_| format!("{what}: not a number: {s}"))
    };
    let modes = match opts.get("mode").map(String::as_str).unwrap_or("all") {
        "full" => vec![DecodeMode::Full],
        "scaled" => vec![DecodeMode::Scaled],
        "region" => vec![DecodeMode::Region],
        "all" => vec![DecodeMode::Full, DecodeMode::Scaled, DecodeMode::Region],
        m => return Err(format!("unknown --mode {m}")),
    };
    let output = match opts.get("output").map(String::as_str).unwrap_or("f32") {
        "f32" => Output::F32Nchw,
        "u8" => Output::U8Nhwc,
        o => return Err(format!("unknown --output {o}")),
    };
    Ok(Args {
        dir: PathBuf::from(&pos[0]),
        seconds: num(&pos[1], "SECONDS")?,
        workers: num(&pos[2], "WORKERS")? as usize,
        batch: num(&pos[3], "BATCH")? as usize,
        modes,
        output,
        size: opts.get("size").map_or(Ok(224.0), |s| num(s, "--size"))? as u32,
        split: opts
            .get("split")
            .cloned()
            .unwrap_or_else(|| "train".to_string()),
        generate: opts
            .get("generate")
            .map(|s| num(s, "--generate"))
            .transpose()?
            .map(|n| n as usize),
    })
}

/// An ImageNet-like JPEG: smooth random colour fields plus pixel noise.
fn synthetic_jpeg(rng: &mut Xoshiro256, comp: &mut turbojpeg::Compressor) -> (Vec<u8>, u16, u16) {
    let w = 200 + rng.below(301) as usize;
    let h = 200 + rng.below(301) as usize;
    let mut waves = [[0f32; 4]; 9];
    for wv in &mut waves {
        for v in wv.iter_mut() {
            *v = (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        }
    }
    let mut rgb = vec![0u8; w * h * 3];
    for y in 0..h {
        for x in 0..w {
            for c in 0..3 {
                let mut v = 128f32;
                for k in 0..3 {
                    let [fx, fy, ph, amp] = waves[c * 3 + k];
                    v += 45.0
                        * amp
                        * ((x as f32 * fx * 0.08)
                            + (y as f32 * fy * 0.08)
                            + ph * std::f32::consts::TAU)
                            .sin();
                }
                let noise = (rng.next_u64() % 25) as f32 - 12.0;
                rgb[(y * w + x) * 3 + c] = (v + noise).clamp(0.0, 255.0) as u8;
            }
        }
    }
    let img = turbojpeg::Image {
        pixels: rgb.as_slice(),
        width: w,
        pitch: w * 3,
        height: h,
        format: turbojpeg::PixelFormat::RGB,
    };
    let bytes = comp.compress_to_vec(img).expect("compress");
    (bytes, h as u16, w as u16)
}

fn generate(dir: &Path, n: usize, split: &str) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut comp = turbojpeg::Compressor::new().map_err(|e| e.to_string())?;
    comp.set_quality(90).map_err(|e| e.to_string())?;
    comp.set_subsamp(turbojpeg::Subsamp::Sub2x2)
        .map_err(|e| e.to_string())?;
    let mut rng = Xoshiro256::from_seed(2024);
    let shards = 4usize;
    let per = n.div_ceil(shards);
    let mut infos = Vec::new();
    let mut total = 0u64;
    for s in 0..shards {
        let count = per.min(n - (s * per).min(n));
        let file = format!("{split}-{s:05}.ddl");
        let mut w = ShardWriter::create(&dir.join(&file)).map_err(|e| e.to_string())?;
        for k in 0..count {
            let (bytes, h, wd) = synthetic_jpeg(&mut rng, &mut comp);
            total += bytes.len() as u64;
            w.push(&bytes, ((s * per + k) % 10) as u32, h, wd)
                .map_err(|e| e.to_string())?;
        }
        let sum = w.finish().map_err(|e| e.to_string())?;
        infos.push(ShardInfo {
            file,
            records: sum.records,
            bytes: sum.bytes,
            crc32c: sum.crc32c,
            node: 0,
        });
    }
    let mut splits = BTreeMap::new();
    splits.insert(
        split.to_string(),
        SplitInfo {
            records: n as u64,
            shards: infos,
        },
    );
    Manifest {
        format_version: 1,
        classes: (0..10)
            .map(|i| ClassInfo {
                wnid: format!("n{i:08}"),
                label: i,
            })
            .collect(),
        splits,
        pack: serde_json::json!({"generator": "loader_bench", "quality": 90}),
        nodes: 1,
    }
    .save(dir)
    .map_err(|e| e.to_string())?;
    println!(
        "generated {n} JPEGs ({:.1} KiB average) in {}",
        total as f64 / n as f64 / 1024.0,
        dir.display()
    );
    Ok(())
}

/// Peak resident set size of this process in bytes (VmHWM).
fn peak_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Current resident set size of this process in bytes (VmRSS).
fn current_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// CPU seconds (user + system) this process has used so far, all threads (getrusage).
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// One thread decoding whole images to RGB, no crop or resize: libjpeg-turbo's limit.
/// Returns images/s and CPU milliseconds per image.
fn full_decode_rate(ds: &Dataset, seconds: f64) -> Result<(f64, f64), String> {
    let mut dec = JpegDecoder::new().map_err(|e| e.to_string())?;
    let cpu = cpu_seconds();
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < seconds {
        for i in 0..ds.len() {
            let rec = ds.record(i).map_err(|e| e.to_string())?;
            let h = dec.header(rec.bytes).map_err(|e| e.to_string())?;
            let p = plan(
                &h,
                [0.0, 0.0, h.width as f64, h.height as f64],
                (h.width, h.height),
                DecodeMode::Full,
            );
            dec.decode(rec.bytes, &p).map_err(|e| e.to_string())?;
            n += 1;
            if n % 64 == 0 && start.elapsed().as_secs_f64() >= seconds {
                break;
            }
        }
    }
    let cpu = cpu_seconds() - cpu;
    Ok((
        n as f64 / start.elapsed().as_secs_f64(),
        cpu * 1e3 / n as f64,
    ))
}

/// What one pipeline run measured.
struct Run {
    /// Images per second, wall clock.
    rate: f64,
    /// Process CPU milliseconds (getrusage, all threads) per image.
    cpu_ms: f64,
    /// Worker milliseconds per image (time inside the per-image work).
    worker_ms: f64,
    /// Thousands of pixels decoded per image.
    kpixels: f64,
}

fn run_mode(ds: &Arc<Dataset>, a: &Args, mode: DecodeMode) -> Result<Run, String> {
    let cfg = PipelineConfig {
        image_size: a.size,
        output: a.output,
        augment: Augment::Train,
        workers: a.workers,
        prefetch: 2,
        seed: 1,
        on_bad_record: OnBadRecord::Replace,
        ..PipelineConfig::default()
    };
    let deadline = Duration::from_secs_f64(a.seconds);
    let cpu = cpu_seconds();
    let start = Instant::now();
    let sampler = Sampler::try_new(
        ds.len(),
        ds.len(),
        SamplerConfig {
            seed: 7,
            ranks_in_node: 1,
            rank_in_node: 0,
            replicas: 1,
            batch_per_replica: a.batch,
            tail: Tail::Drop,
            shuffle: true,
        },
    )
    .map_err(|e| e.to_string())?;
    let mut p = Pipeline::start_with(Arc::clone(ds), sampler, cfg, 0, 0, mode)
        .map_err(|e| e.to_string())?;
    if p.batches_per_replica() == 0 {
        return Err(format!("fewer than {} records: no full batch", a.batch));
    }
    let mut images = 0u64;
    let mut epoch = 0;
    // Worker seconds, decoded pixels and images of the complete epochs (a run cut off by the
    // deadline has worker time in images it never counted).
    let (mut busy, mut pixels, mut counted) = (0f64, 0u64, 0u64);
    'outer: loop {
        for b in p.replica(0) {
            let b = b.map_err(|e| e.to_string())?;
            images += b.len() as u64;
            if start.elapsed() >= deadline {
                break 'outer;
            }
        }
        let st = p.stats();
        (busy, pixels, counted) = (
            busy + st.busy_seconds,
            pixels + st.decoded_pixels,
            counted + st.images,
        );
        epoch += 1;
        if std::env::var_os("DDL_BENCH_RSS").is_some() {
            eprintln!(
                "epoch {epoch}: rss {:?} MiB",
                current_rss().map(|r| r >> 20)
            );
        }
        p = p.next_epoch(epoch, 0).map_err(|e| e.to_string())?;
    }
    if counted == 0 {
        let st = p.stats();
        (busy, pixels, counted) = (st.busy_seconds, st.decoded_pixels, st.images.max(1));
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu;
    Ok(Run {
        rate: images as f64 / secs,
        cpu_ms: cpu * 1e3 / images.max(1) as f64,
        worker_ms: busy * 1e3 / counted as f64,
        kpixels: pixels as f64 / counted as f64 / 1e3,
    })
}

fn main() -> ExitCode {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if let Some(n) = a.generate {
        if !a.dir.join("manifest.json").exists() {
            if let Err(e) = generate(&a.dir, n, &a.split) {
                eprintln!("generate: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let opts = OpenOptions {
        populate: true,
        ..OpenOptions::default()
    };
    let ds = match Dataset::open(&a.dir, &a.split, Residency { node: 0, nodes: 1 }, &opts) {
        Ok(d) => Arc::new(d),
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "{} records, {:.1} MiB of shards; {} workers, batch {}, {}px, {:?}",
        ds.len(),
        ds.file_bytes() as f64 / (1 << 20) as f64,
        a.workers,
        a.batch,
        a.size,
        a.output
    );
    match full_decode_rate(&ds, a.seconds.min(5.0)) {
        Ok((r, cpu_ms)) => println!(
            "libjpeg-turbo full decode, 1 thread: {r:.0} images/s ({cpu_ms:.3} ms CPU per image)"
        ),
        Err(e) => eprintln!("full decode baseline: {e}"),
    }
    for &mode in &a.modes {
        match run_mode(&ds, &a, mode) {
            Ok(r) => println!(
                "pipeline {mode:?}: {:.0} images/s ({:.3} ms CPU per image, {:.3} ms worker time per image, {:.0} kpixel decoded per image)",
                r.rate, r.cpu_ms, r.worker_ms, r.kpixels
            ),
            Err(e) => {
                eprintln!("pipeline {mode:?}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let elem = match a.output {
        Output::F32Nchw => 4,
        Output::U8Nhwc => 1,
    };
    let batch_bytes = a.batch as u64 * 3 * a.size as u64 * a.size as u64 * elem;
    let bound = ds.file_bytes() + (2 + a.workers as u64) * batch_bytes + (64 << 20);
    if let Some(rss) = peak_rss() {
        println!(
            "peak RSS {:.1} MiB; bound shards + (prefetch + workers) x batch + 64 MiB = {:.1} MiB",
            rss as f64 / (1 << 20) as f64,
            bound as f64 / (1 << 20) as f64
        );
    }
    ExitCode::SUCCESS
}
