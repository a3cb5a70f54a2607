//! Measuring each input stage alone on `T` threads, and the whole pipeline end to end.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use ddl_loader::dataset::{Dataset, OpenOptions};
use ddl_loader::decode::{plan, DecodeMode, JpegDecoder};
use ddl_loader::pipeline::{Pipeline, PipelineConfig};
use ddl_loader::sampler::{Sampler, SamplerConfig, Tail, Xoshiro256};
use ddl_loader::transform::{Normalizer, Output, Slot, Transformer, IMAGENET_MEAN, IMAGENET_STD};

use super::bad_records::BadLog;
use super::config::ProfConfig;
use super::os::{storage_read_bytes, thread_cpu_ns};
use super::report::{EndToEndRow, StageRow};
use super::stage::Stage;

/// What one thread did in one stage measurement.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Tally {
    pub(crate) images: u64,
    pub(crate) bytes: u64,
    /// For derived stages: time attributed to the stage, in nanoseconds.
    attributed_ns: u64,
}

/// Runs `work(thread, deadline)` for `stage` on `threads` scoped threads (named
/// `<stage> <t>/<threads>` in the trace) and returns their tallies and the wall time from
/// start until the last one finished.
fn parallel<F>(stage: Stage, threads: usize, seconds: f64, work: F) -> Result<(Vec<Tally>, f64)>
where
    F: Fn(usize, Instant) -> Result<Tally> + Sync,
{
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let results: Vec<Result<Tally>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let work = &work;
                s.spawn(move || {
                    ddl_trace::set_thread_name(format!("{stage} {t}/{threads}"));
                    work(t, deadline)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("stage thread panicked")))
            })
            .collect()
    });
    let wall = start.elapsed().as_secs_f64();
    let tallies = results.into_iter().collect::<Result<Vec<_>>>()?;
    Ok((tallies, wall))
}

pub(crate) fn row(stage: Stage, threads: usize, tallies: &[Tally], wall: f64) -> StageRow {
    let images: u64 = tallies.iter().map(|t| t.images).sum();
    let bytes: u64 = tallies.iter().map(|t| t.bytes).sum();
    let wall = wall.max(1e-9);
    StageRow {
        stage,
        threads,
        images,
        seconds: wall,
        images_per_s: images as f64 / wall,
        bytes_per_s: bytes as f64 / wall,
        bytes_basis: stage.bytes_basis().to_string(),
        method: "measured".to_string(),
        storage_bytes: None,
    }
}

/// A row from per-thread attributed times: each thread's rate is its items over its own
/// attributed time; the stage's rate is their sum.
fn derived_row(stage: Stage, threads: usize, tallies: &[Tally], method: &str) -> StageRow {
    let mut images_per_s = 0.0;
    let mut bytes_per_s = 0.0;
    let mut secs = 0.0;
    for t in tallies {
        let s = (t.attributed_ns as f64 * 1e-9).max(1e-9);
        images_per_s += t.images as f64 / s;
        bytes_per_s += t.bytes as f64 / s;
        secs += s;
    }
    StageRow {
        stage,
        threads,
        images: tallies.iter().map(|t| t.images).sum(),
        seconds: secs / tallies.len().max(1) as f64,
        images_per_s,
        bytes_per_s,
        bytes_basis: stage.bytes_basis().to_string(),
        method: method.to_string(),
        storage_bytes: None,
    }
}

/// One record copied into RAM for the CPU stages.
pub(crate) struct SampleImage {
    pub(crate) bytes: Vec<u8>,
    pub(crate) id: u64,
    /// Index of its shard file in `Prof::paths`.
    pub(crate) file: u32,
    /// Its index within that shard.
    pub(crate) record: usize,
}

/// Where one record lies in its shard file.
#[derive(Clone, Copy)]
pub(crate) struct ReadItem {
    pub(crate) file: u32,
    pub(crate) offset: u64,
    pub(crate) len: u32,
}

/// The items thread `t` of `threads` handles: `t, t + threads, ...`, wrapping around unless
/// `once` (then each item at most once).
fn strided(n: usize, t: usize, threads: usize, once: bool) -> impl Iterator<Item = usize> {
    let first = t % n.max(1);
    let mut k = 0usize;
    std::iter::from_fn(move || {
        let i = first + k * threads;
        if n == 0 || (once && i >= n) {
            return None;
        }
        k += 1;
        Some(i % n)
    })
}

/// A seeded permutation of `0..n` (Fisher-Yates with the loader's xoshiro256**).
pub(crate) fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut p: Vec<usize> = (0..n).collect();
    let mut rng = Xoshiro256::from_seed(seed ^ 0x5052_4F46);
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        p.swap(i, j);
    }
    p
}

// ---------------------------------------------------------------------------------------------
// The profiler

/// State shared by the stage measurements.
pub(crate) struct Prof<'a> {
    pub(crate) cfg: &'a ProfConfig,
    pub(crate) paths: Vec<PathBuf>,
    pub(crate) items: Vec<ReadItem>,
    pub(crate) order: Vec<usize>,
    pub(crate) sample: Vec<SampleImage>,
    pub(crate) resized: Vec<Vec<u8>>,
    pub(crate) bad: &'a BadLog,
}

pub(crate) fn open_dataset(cfg: &ProfConfig, populate: bool) -> Result<Arc<Dataset>> {
    let opts = OpenOptions {
        populate,
        ..OpenOptions::default()
    };
    let ds = Dataset::open(&cfg.dir, &cfg.split, cfg.residency, &opts).with_context(|| {
        format!(
            "open split {} of {} as node {} of {}",
            cfg.split,
            cfg.dir.display(),
            cfg.residency.node,
            cfg.residency.nodes
        )
    })?;
    Ok(Arc::new(ds))
}

impl Prof<'_> {
    pub(crate) fn read(&self, threads: usize) -> Result<StageRow> {
        let files = self
            .paths
            .iter()
            .map(|p| File::open(p).with_context(|| format!("open {}", p.display())))
            .collect::<Result<Vec<_>>>()?;
        let once = self.cfg.cold;
        let max_len = self.items.iter().map(|i| i.len).max().unwrap_or(0) as usize;
        let storage_before = storage_read_bytes();
        let (tallies, wall) = parallel(
            Stage::Read,
            threads,
            self.cfg.stage_seconds,
            |t, deadline| {
                let mut buf = vec![0u8; max_len];
                let mut tally = Tally::default();
                for k in strided(self.order.len(), t, threads, once) {
                    let it = self.items[self.order[k]];
                    let len = it.len as usize;
                    files[it.file as usize]
                        .read_exact_at(&mut buf[..len], it.offset)
                        .with_context(|| {
                            format!("read {}", self.paths[it.file as usize].display())
                        })?;
                    std::hint::black_box(&buf[..len]);
                    tally.images += 1;
                    tally.bytes += len as u64;
                    if Instant::now() >= deadline {
                        break;
                    }
                }
                Ok(tally)
            },
        )?;
        let mut r = row(Stage::Read, threads, &tallies, wall);
        r.storage_bytes = storage_before
            .zip(storage_read_bytes())
            .map(|(b, a)| a.saturating_sub(b));
        if once {
            r.method = "measured: cold, each record read at most once".to_string();
        }
        Ok(r)
    }

    /// The check stage runs on mapped pages in RAM: with `--cold` only on the sampled records,
    /// after an untimed pass that brings them in (a cold page fault is the read stage's cost).
    /// A bad record is noted and left out.
    pub(crate) fn check(&self, ds: &Dataset, threads: usize) -> Result<StageRow> {
        let set = if self.cfg.cold {
            let set = &self.order[..self.sample.len().min(self.order.len())];
            for &i in set {
                if let Ok(rec) = ds.record(i) {
                    std::hint::black_box(rec.label);
                }
            }
            set
        } else {
            &self.order[..]
        };
        let (tallies, wall) = parallel(
            Stage::Check,
            threads,
            self.cfg.stage_seconds,
            |t, deadline| {
                let mut tally = Tally::default();
                for k in strided(set.len(), t, threads, false) {
                    match ds.record(set[k]) {
                        Ok(rec) => {
                            std::hint::black_box(rec.label);
                            tally.images += 1;
                            tally.bytes += rec.bytes.len() as u64;
                        }
                        Err(e) => self.bad.met_error(e)?,
                    }
                    if Instant::now() >= deadline {
                        break;
                    }
                }
                Ok(tally)
            },
        )?;
        Ok(row(Stage::Check, threads, &tallies, wall))
    }

    /// Notes that sample image `img` cannot be decoded (the stage then leaves it out).
    fn bad_sample(&self, img: &SampleImage, e: impl std::fmt::Display) -> Result<()> {
        self.bad.met(
            &self.paths[img.file as usize],
            img.record,
            &format!("cannot decode: {e}"),
        )
    }

    pub(crate) fn decode(&self, stage: Stage, threads: usize) -> Result<StageRow> {
        let mode = match stage {
            Stage::DecodeFull => DecodeMode::Full,
            Stage::DecodeScaled => DecodeMode::Scaled,
            _ => DecodeMode::Region,
        };
        let size = self.cfg.image_size;
        let tcfg = self.cfg.transform(Output::U8Nhwc, mode);
        let (tallies, wall) = parallel(stage, threads, self.cfg.stage_seconds, |t, deadline| {
            let mut dec = JpegDecoder::new().map_err(|e| anyhow!("{e}"))?;
            let geometry = Transformer::new(tcfg).map_err(|e| anyhow!("{e}"))?;
            let mut tally = Tally::default();
            for k in strided(self.sample.len(), t, threads, false) {
                let img = &self.sample[k];
                let _s = ddl_trace::span_args(stage.name(), "decode", &[("thread", t as i64)]);
                let decoded = dec.header(&img.bytes).and_then(|h| {
                    let crop = if mode == DecodeMode::Full {
                        [0.0, 0.0, h.width as f64, h.height as f64]
                    } else {
                        geometry.geometry(h.width, h.height, 0, img.id).0
                    };
                    let out = if mode == DecodeMode::Full {
                        (h.width, h.height)
                    } else {
                        (size, size)
                    };
                    let p = plan(&h, crop, out, mode);
                    dec.decode(&img.bytes, &p).map(|px| px.len())
                });
                match decoded {
                    Ok(n) => {
                        std::hint::black_box(n);
                        tally.images += 1;
                        tally.bytes += img.bytes.len() as u64;
                    }
                    Err(e) => self.bad_sample(img, e)?,
                }
                if Instant::now() >= deadline {
                    break;
                }
            }
            Ok(tally)
        })?;
        Ok(row(stage, threads, &tallies, wall))
    }

    /// Crop + resize cannot be run alone through the loader's API (the transformer decodes
    /// too), so each image is decoded (`decode_region`) and then transformed to uint8, back to
    /// back, and the thread CPU time of the second minus the first is the resize's share.
    /// Each thread's wall time is split in that proportion, so the rate keeps the wall-clock
    /// meaning of the measured stages while the subtraction is immune to preemption.
    pub(crate) fn crop_resize(&self, threads: usize) -> Result<StageRow> {
        let size = self.cfg.image_size;
        let n = 3 * size as usize * size as usize;
        let tcfg = self.cfg.transform(Output::U8Nhwc, DecodeMode::Region);
        let (tallies, _) = parallel(
            Stage::CropResize,
            threads,
            self.cfg.stage_seconds,
            |t, deadline| {
                let mut dec = JpegDecoder::new().map_err(|e| anyhow!("{e}"))?;
                let mut tr = Transformer::new(tcfg).map_err(|e| anyhow!("{e}"))?;
                let mut out = vec![0u8; n];
                let (mut decode_cpu, mut apply_cpu) = (0u64, 0u64);
                let mut tally = Tally::default();
                let wall = Instant::now();
                for k in strided(self.sample.len(), t, threads, false) {
                    let img = &self.sample[k];
                    let _s = ddl_trace::span("crop_resize", "prof");
                    let c0 = thread_cpu_ns();
                    let decoded = dec.header(&img.bytes).and_then(|h| {
                        let crop = tr.geometry(h.width, h.height, 0, img.id).0;
                        let p = plan(&h, crop, (size, size), DecodeMode::Region);
                        dec.decode(&img.bytes, &p).map(|px| px.len())
                    });
                    let c1 = thread_cpu_ns();
                    let applied = decoded.and_then(|len| {
                        std::hint::black_box(len);
                        tr.apply(&img.bytes, 0, img.id, Slot::U8(&mut out))
                    });
                    let c2 = thread_cpu_ns();
                    match applied {
                        Ok(_) => {
                            decode_cpu += c1.saturating_sub(c0);
                            apply_cpu += c2.saturating_sub(c1);
                            tally.images += 1;
                            tally.bytes += n as u64;
                        }
                        Err(e) => self.bad_sample(img, e)?,
                    }
                    if Instant::now() >= deadline {
                        break;
                    }
                }
                let wall_ns = wall.elapsed().as_nanos() as f64;
                let total = (decode_cpu + apply_cpu).max(1) as f64;
                // Never below 1% of the transform: measurement noise must not give absurd rates.
                let resize = apply_cpu.saturating_sub(decode_cpu).max(apply_cpu / 100) as f64;
                tally.attributed_ns = ((wall_ns * resize / total) as u64).max(1);
                Ok(tally)
            },
        )?;
        Ok(derived_row(
            Stage::CropResize,
            threads,
            &tallies,
            "derived: thread CPU time of transform-to-uint8 minus decode_region on the same \
             images, as a share of each thread's wall time",
        ))
    }

    pub(crate) fn normalize(&self, threads: usize) -> Result<StageRow> {
        let s = self.cfg.image_size as usize;
        let n = 3 * s * s;
        let batch = self.cfg.batch;
        let norm = Normalizer::new(IMAGENET_MEAN, IMAGENET_STD);
        let (tallies, wall) = parallel(
            Stage::Normalize,
            threads,
            self.cfg.stage_seconds,
            |t, deadline| {
                let mut buf = vec![0f32; batch * n];
                let mut tally = Tally::default();
                let mut k = t;
                loop {
                    let src = &self.resized[k % self.resized.len()];
                    let slot = (tally.images as usize) % batch;
                    norm.write_chw(src, s, s, k % 2 == 1, &mut buf[slot * n..(slot + 1) * n]);
                    tally.images += 1;
                    tally.bytes += (n * 4) as u64;
                    k += threads;
                    if Instant::now() >= deadline {
                        break;
                    }
                }
                std::hint::black_box(&buf);
                Ok(tally)
            },
        )?;
        Ok(row(Stage::Normalize, threads, &tallies, wall))
    }

    pub(crate) fn queue(&self, threads: usize) -> Result<StageRow> {
        let s = self.cfg.image_size as usize;
        let batch = self.cfg.batch;
        let elems = batch * 3 * s * s;
        let depth = self.cfg.prefetch.max(1);
        let (full_tx, full_rx) = mpsc::sync_channel::<Vec<f32>>(depth);
        let (free_tx, free_rx) = mpsc::channel::<Vec<f32>>();
        for _ in 0..depth + threads {
            // Zeroed allocations stay untouched (and unbacked) except for one element.
            free_tx
                .send(vec![0f32; elems])
                .map_err(|_| anyhow!("queue free list"))?;
        }
        let free_rx = std::sync::Mutex::new(free_rx);
        let start = Instant::now();
        let deadline = start + Duration::from_secs_f64(self.cfg.stage_seconds);
        let received = AtomicU64::new(0);
        std::thread::scope(|sc| -> Result<()> {
            for t in 0..threads {
                let (full_tx, free_rx) = (full_tx.clone(), &free_rx);
                sc.spawn(move || {
                    ddl_trace::set_thread_name(format!("queue {t}/{threads}"));
                    let mut k = 0u64;
                    while Instant::now() < deadline {
                        let Ok(mut buf) = free_rx.lock().unwrap_or_else(|p| p.into_inner()).recv()
                        else {
                            return;
                        };
                        buf[0] = (t as u64 + k) as f32;
                        k += 1;
                        if full_tx.send(buf).is_err() {
                            return;
                        }
                    }
                });
            }
            drop(full_tx);
            for buf in full_rx.iter() {
                std::hint::black_box(buf[0]);
                received.fetch_add(1, Ordering::Relaxed);
                // Producers may already be gone: then the buffer is simply freed.
                let _ = free_tx.send(buf);
            }
            Ok(())
        })?;
        let wall = start.elapsed().as_secs_f64().max(1e-9);
        let batches = received.load(Ordering::Relaxed);
        let images = batches * batch as u64;
        Ok(StageRow {
            stage: Stage::Queue,
            threads,
            images,
            seconds: wall,
            images_per_s: images as f64 / wall,
            bytes_per_s: (images * 3 * s as u64 * s as u64 * 4) as f64 / wall,
            bytes_basis: Stage::Queue.bytes_basis().to_string(),
            method: format!(
                "measured: batch messages of {batch} images, depth {depth}, {threads} producers"
            ),
            storage_bytes: None,
        })
    }
}

/// What the end-to-end run counted.
#[derive(Default)]
struct Delivered {
    images: u64,
    batches: u64,
    /// Worker-seconds spent decoding.
    busy: f64,
    skipped: u64,
}

/// The pipeline configuration of an end-to-end run with `threads` workers.
fn pipeline_config(cfg: &ProfConfig, threads: usize) -> PipelineConfig {
    PipelineConfig {
        image_size: cfg.image_size,
        output: Output::F32Nchw,
        augment: cfg.augment(),
        workers: threads,
        prefetch: cfg.prefetch,
        seed: cfg.seed,
        on_bad_record: cfg.on_bad_record,
        ..PipelineConfig::default()
    }
}

/// Runs the real pipeline with `threads` workers for `seconds` (epochs restarted as needed);
/// the bad records it meets go to `bad`.
pub(crate) fn end_to_end(
    ds: &Arc<Dataset>,
    cfg: &ProfConfig,
    threads: usize,
    bad: &BadLog,
) -> Result<EndToEndRow> {
    let scfg = SamplerConfig {
        seed: cfg.seed,
        ranks_in_node: 1,
        rank_in_node: 0,
        replicas: 1,
        batch_per_replica: cfg.batch,
        tail: Tail::Drop,
        shuffle: true,
    };
    let sampler = Sampler::try_new(ds.len(), ds.len(), scfg)?;
    if sampler.steps_per_epoch() == 0 {
        bail!(
            "node {} has {} records, fewer than one batch of {}",
            cfg.residency.node,
            ds.len(),
            cfg.batch
        );
    }
    let pcfg = pipeline_config(cfg, threads);
    let _run = ddl_trace::span_args("end_to_end", "prof", &[("threads", threads as i64)]);
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(cfg.seconds);
    let mut got = Delivered::default();
    let mut epoch = 0u64;
    loop {
        let p = Pipeline::start(Arc::clone(ds), sampler.clone(), pcfg.clone(), epoch, 0)?;
        let done = consume(&p, cfg, threads, deadline, &mut got)?;
        let stats = p.stats();
        got.busy += stats.busy_seconds;
        got.skipped += stats.skipped;
        for r in &stats.bad_records {
            let prefix = format!("{}: record {}: ", r.file.display(), r.record);
            bad.met(
                &r.file,
                r.record,
                r.reason.strip_prefix(&prefix).unwrap_or(&r.reason),
            )?;
        }
        if done {
            break;
        }
        epoch += 1;
    }
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    Ok(EndToEndRow {
        threads,
        images: got.images,
        batches: got.batches,
        seconds: secs,
        images_per_s: got.images as f64 / secs,
        speedup: 1.0,
        efficiency: 1.0,
        worker_busy_frac: (got.busy / (secs * threads as f64)).min(1.0),
        skipped: got.skipped,
    })
}

/// Takes the batches of one epoch of `p` until the epoch ends (false) or `deadline` passes
/// (true), counting them in `got`.
fn consume(
    p: &Pipeline,
    cfg: &ProfConfig,
    threads: usize,
    deadline: Instant,
    got: &mut Delivered,
) -> Result<bool> {
    let mut it = p.replica(0);
    loop {
        let next = {
            let _w = ddl_trace::span("wait_batch", "prof");
            it.next()
        };
        let Some(b) = next else { return Ok(false) };
        let b = b.with_context(|| {
            format!(
                "end to end with {threads} threads (--on-bad-record fail); `ddl-pack \
                 --verify {}` lists every damaged record, --on-bad-record replace profiles \
                 around them",
                cfg.dir.display()
            )
        })?;
        got.images += b.len() as u64;
        got.batches += 1;
        drop(b);
        if Instant::now() >= deadline {
            return Ok(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_covers_and_wraps() {
        let a: Vec<usize> = strided(5, 1, 2, true).collect();
        assert_eq!(a, vec![1, 3]);
        let b: Vec<usize> = strided(5, 0, 2, false).take(5).collect();
        assert_eq!(b, vec![0, 2, 4, 1, 3]);
        assert_eq!(strided(0, 0, 2, false).count(), 0);
        let mut p = permutation(100, 7);
        assert_ne!(p, (0..100).collect::<Vec<_>>());
        p.sort_unstable();
        assert_eq!(p, (0..100).collect::<Vec<_>>());
    }
}
