//! The decode/augment pipeline: node-resident records in, ready batches out, one queue per
//! local replica.
//!
//! A dispatcher thread walks the epoch's `(step, replica)` jobs in order. For each one it takes
//! a free batch buffer (all buffers are allocated at start and recycled: dropping a [`Batch`]
//! returns its buffers), and spawns the job on a rayon pool of `workers` threads, where every
//! image of the batch is decoded and transformed straight into its slot of the buffer by
//! whichever worker picks it up, with that worker's own [`Transformer`] (decoder, resizer and
//! scratch buffers reused for every image). A sequencer thread puts finished batches back in
//! job order and sends each to its replica's bounded queue (depth `prefetch`).
//!
//! Everything a batch contains depends only on `(seed, epoch, step, replica)` and the data:
//! the records come from the [`Sampler`], each image's crop and flip from a counter-based
//! hash of `(seed, epoch, record global id)`, and bad records are handled by a rule that only
//! looks at the records' bytes (see [`OnBadRecord`]). Thread timing never changes a batch.
//!
//! Memory: `replicas * (prefetch + 1) + min(workers, 2)` batch buffers (the queued ones, one
//! held by each consumer, one or two being filled) plus one output image and one decoded
//! region per worker, on top of the mapped shards. A consumer that keeps more than one batch
//! of its replica alive eats into this budget and, past it, stalls the pipeline unless it
//! gives the pool more buffers ([`Pipeline::add_buffers`]).
//!
//! Dropping the [`Pipeline`] stops it promptly: workers abandon the batch they are on after
//! at most one image each, and the dispatcher and sequencer threads are joined.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crossbeam_channel::{bounded, unbounded, Receiver, Sender};

use crate::dataset::Dataset;
use crate::decode::DecodeError;
pub use crate::decode::DecodeMode;
use crate::error::{LoaderError, Result};
use crate::sampler::Sampler;
pub use crate::transform::{
    eval_resize, Augment, Output, TrainAugment, EVAL_RESIZE_RATIO, IMAGENET_MEAN, IMAGENET_STD,
};
use crate::transform::{TransformConfig, Transformer};

mod batch;
mod config;
mod shared;
mod threads;
use batch::Buffers;
pub use batch::{BadRecord, Batch, Images};
pub use config::{OnBadRecord, PipelineConfig, MAX_BAD_RECORDS_KEPT, MAX_SUBSTITUTES};
pub use shared::PipelineStats;
use shared::{Counters, Done, Shared};
use threads::{dispatch, sequence};

/// A running epoch of the pipeline; see the module documentation.
///
/// # Examples
///
/// One epoch of a node's training shards, decoded and augmented by two threads into batches of
/// 4 images of 32 x 32 for one replica (here: shards `ddl-testkit` writes directly):
///
/// ```
/// use std::sync::Arc;
/// use ddl_loader::dataset::{Dataset, OpenOptions, Residency};
/// use ddl_loader::pipeline::{Pipeline, PipelineConfig};
/// use ddl_loader::sampler::{Sampler, SamplerConfig, Tail};
/// use ddl_testkit::{jpeg, write_manifest, write_shards, Record};
///
/// let tmp = tempfile::tempdir()?;
/// let records = (0..8).map(|i| Record::jpeg(jpeg(48, 40, i), (i % 2) as u32)).collect();
/// let train = write_shards(tmp.path(), "train", &[records], 1);
/// write_manifest(tmp.path(), 2, vec![("train", train)], 1);
///
/// let one_node = Residency { node: 0, nodes: 1 };
/// let data = Arc::new(Dataset::open(tmp.path(), "train", one_node, &OpenOptions::default())?);
/// let sampler = Sampler::new(data.len(), data.len(), SamplerConfig {
///     seed: 0,
///     ranks_in_node: 1,
///     rank_in_node: 0,
///     replicas: 1,
///     batch_per_replica: 4,
///     tail: Tail::Drop,
///     shuffle: true,
/// });
/// let cfg = PipelineConfig { image_size: 32, workers: 2, ..PipelineConfig::default() };
/// let epoch = Pipeline::start(data, sampler, cfg, 0, 0)?;
/// let mut labels = Vec::new();
/// for batch in epoch.replica(0) {
///     let batch = batch?;
///     assert_eq!(batch.shape(), [4, 3, 32, 32]);
///     labels.extend_from_slice(&batch.labels);
/// }
/// labels.sort_unstable();
/// assert_eq!(labels, [0, 0, 0, 0, 1, 1, 1, 1]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Pipeline {
    shared: Arc<Shared>,
    receivers: Vec<Receiver<Result<Batch>>>,
    expected: usize,
    stop_tx: Option<Sender<()>>,
    threads: Vec<JoinHandle<()>>,
    pool: Arc<rayon::ThreadPool>,
    /// The batch buffers: free ones wait here, dropped batches come back here.
    free: (Sender<Buffers>, Receiver<Buffers>),
    mode: DecodeMode,
}

/// What one epoch's run can take over from the previous one.
struct Reuse {
    pool: Arc<rayon::ThreadPool>,
    free: (Sender<Buffers>, Receiver<Buffers>),
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("epoch", &self.shared.epoch)
            .field("cfg", &self.shared.cfg)
            .field("batches_per_replica", &self.expected)
            .finish()
    }
}

impl Pipeline {
    /// Starts one epoch from `start_step` with the default (region) decoding.
    pub fn start(
        dataset: Arc<Dataset>,
        sampler: Sampler,
        cfg: PipelineConfig,
        epoch: u64,
        start_step: usize,
    ) -> Result<Pipeline> {
        Pipeline::start_with(dataset, sampler, cfg, epoch, start_step, DecodeMode::Region)
    }

    /// Starts one epoch from `start_step` decoding with `mode` (for measuring the decoders).
    ///
    /// Fails on an invalid configuration: zero workers, prefetch or image size, an eval resize
    /// below the image size, a non-positive std, a sampler built for a different record count
    /// than the dataset's, or `start_step` beyond the epoch.
    pub fn start_with(
        dataset: Arc<Dataset>,
        sampler: Sampler,
        cfg: PipelineConfig,
        epoch: u64,
        start_step: usize,
        mode: DecodeMode,
    ) -> Result<Pipeline> {
        Pipeline::launch(dataset, sampler, cfg, epoch, start_step, mode, None)
    }

    /// Stops this epoch's run and starts `epoch` from `start_step` with the same dataset,
    /// sampler, configuration, worker threads and batch buffers (no reallocation, so memory
    /// stays flat across epochs). Batches of the old epoch still held elsewhere return their
    /// buffers to the new run when dropped.
    pub fn next_epoch(self, epoch: u64, start_step: usize) -> Result<Pipeline> {
        let cfg = self.shared.cfg.clone();
        self.next_epoch_with(cfg, epoch, start_step)
    }

    /// [`Pipeline::next_epoch`] with another transform: `cfg` may change the image size and
    /// the augmentation (progressive resizing changes the size at an epoch boundary), not the
    /// workers or the output type, which the reused threads and buffers were made for. The
    /// buffers grow to a larger size on first use.
    pub fn next_epoch_with(
        self,
        cfg: PipelineConfig,
        epoch: u64,
        start_step: usize,
    ) -> Result<Pipeline> {
        let (dataset, sampler) = (
            Arc::clone(&self.shared.dataset),
            self.shared.sampler.clone(),
        );
        self.next_epoch_over(dataset, sampler, cfg, epoch, start_step)
    }

    /// [`Pipeline::next_epoch_with`] over other records: `dataset` and `sampler` replace this
    /// run's (a record exchange gives a node other records every epoch, a resumed epoch's
    /// remainder its own), with the same threads and batch buffers.
    pub fn next_epoch_over(
        mut self,
        dataset: Arc<Dataset>,
        sampler: Sampler,
        cfg: PipelineConfig,
        epoch: u64,
        start_step: usize,
    ) -> Result<Pipeline> {
        let old = &self.shared.cfg;
        if cfg.workers != old.workers || cfg.output != old.output {
            return Err(LoaderError::InvalidConfig(format!(
                "pipeline: the next epoch changes workers ({} -> {}) or the output type \
                 ({:?} -> {:?}): start a new pipeline",
                old.workers, cfg.workers, old.output, cfg.output
            )));
        }
        let replicas = self.shared.sampler.config().replicas;
        if sampler.config().replicas != replicas {
            return Err(LoaderError::InvalidConfig(format!(
                "pipeline: the next epoch changes the replicas ({replicas} -> {}), which the \
                 batch buffers were counted for: start a new pipeline",
                sampler.config().replicas
            )));
        }
        self.shutdown();
        let reuse = Reuse {
            pool: Arc::clone(&self.pool),
            free: self.free.clone(),
        };
        Pipeline::launch(
            dataset,
            sampler,
            cfg,
            epoch,
            start_step,
            self.mode,
            Some(reuse),
        )
    }

    fn launch(
        dataset: Arc<Dataset>,
        sampler: Sampler,
        cfg: PipelineConfig,
        epoch: u64,
        start_step: usize,
        mode: DecodeMode,
        reuse: Option<Reuse>,
    ) -> Result<Pipeline> {
        let invalid = |why: String| Err(LoaderError::InvalidConfig(format!("pipeline: {why}")));
        if cfg.workers == 0 || cfg.prefetch == 0 {
            return invalid(format!(
                "workers ({}) and prefetch ({}) must be positive",
                cfg.workers, cfg.prefetch
            ));
        }
        if sampler.node_records() != dataset.len() {
            return invalid(format!(
                "sampler built for {} records, the dataset has {}",
                sampler.node_records(),
                dataset.len()
            ));
        }
        let steps = sampler.steps_per_epoch();
        if start_step > steps {
            return invalid(format!(
                "start step {start_step} beyond the epoch's {steps} steps"
            ));
        }
        let tcfg = TransformConfig {
            size: cfg.image_size,
            augment: cfg.augment,
            output: cfg.output,
            mean: cfg.mean,
            std: cfg.std,
            seed: cfg.seed,
            train: cfg.train,
            decode: mode,
        };
        let workers = (0..cfg.workers)
            .map(|_| Transformer::new(tcfg).map(Mutex::new))
            .collect::<std::result::Result<Vec<_>, DecodeError>>()
            .map_err(|e| LoaderError::InvalidConfig(format!("pipeline: {e}")))?;
        let image_len = workers[0]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .image_len();
        let replicas = sampler.config().replicas;
        let batch = sampler.config().batch_per_replica;
        let (pool, free) = match reuse {
            Some(r) => (r.pool, r.free),
            None => {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(cfg.workers)
                    .thread_name(|i| format!("ddl-decode-{i}"))
                    .build()
                    .map_err(|e| {
                        LoaderError::InvalidConfig(format!("pipeline: thread pool: {e}"))
                    })?;
                let free = unbounded::<Buffers>();
                for _ in 0..crate::limits::batch_buffers(replicas, cfg.prefetch, cfg.workers) {
                    let _ = free.0.send(Buffers::new(cfg.output, batch, image_len));
                }
                (Arc::new(pool), free)
            }
        };
        let (free_tx, free_rx) = (free.0.clone(), free.1.clone());
        let mut senders = Vec::with_capacity(replicas);
        let mut receivers = Vec::with_capacity(replicas);
        for _ in 0..replicas {
            let (tx, rx) = bounded::<Result<Batch>>(cfg.prefetch);
            senders.push(tx);
            receivers.push(rx);
        }
        let (stop_tx, stop_rx) = bounded::<()>(0);
        let (done_tx, done_rx) = unbounded::<Done>();
        let shared = Arc::new(Shared {
            dataset,
            sampler,
            cfg,
            epoch,
            image_len,
            stop: AtomicBool::new(false),
            workers,
            counters: Counters::default(),
        });

        let dispatcher = {
            let shared = Arc::clone(&shared);
            let pool = Arc::clone(&pool);
            let stop_rx = stop_rx.clone();
            std::thread::Builder::new()
                .name("ddl-dispatch".into())
                .spawn(move || {
                    dispatch(
                        shared, pool, start_step, steps, free_rx, free_tx, done_tx, stop_rx,
                    )
                })
                .map_err(|e| {
                    LoaderError::InvalidConfig(format!("pipeline: spawn dispatcher: {e}"))
                })?
        };
        let sequencer = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("ddl-sequence".into())
                .spawn(move || sequence(shared, done_rx, senders, stop_rx))
                .map_err(|e| {
                    LoaderError::InvalidConfig(format!("pipeline: spawn sequencer: {e}"))
                })?
        };
        Ok(Pipeline {
            shared,
            receivers,
            expected: steps - start_step,
            stop_tx: Some(stop_tx),
            threads: vec![dispatcher, sequencer],
            pool,
            free,
            mode,
        })
    }

    /// Number of local replicas.
    pub fn replicas(&self) -> usize {
        self.receivers.len()
    }

    /// Batches each replica receives in this run (steps from the start step to the epoch end).
    pub fn batches_per_replica(&self) -> usize {
        self.expected
    }

    /// The batches of replica `r`, in step order. Call once per replica: iterators obtained
    /// twice for the same replica share (split) its stream. Replicas must be consumed in
    /// lockstep (as a data-parallel step does); a replica left unconsumed eventually stalls the
    /// others once its queue is full.
    ///
    /// # Panics
    ///
    /// When `r >= replicas()` (a caller bug).
    pub fn replica(&self, r: usize) -> ReplicaBatches {
        ReplicaBatches {
            rx: self.receivers[r].clone(),
            replica: r,
            delivered: 0,
            expected: self.expected,
            finished: false,
        }
    }

    /// Adds `n` batch buffers to the pool, for a consumer that keeps `n` more batches alive
    /// than the one per replica the pool is sized for (see the module documentation). They
    /// stay in the pool, also for later epochs started with [`Pipeline::next_epoch`].
    pub fn add_buffers(&self, n: usize) {
        let batch = self.shared.sampler.config().batch_per_replica;
        for _ in 0..n {
            let _ = self.free.0.send(Buffers::new(
                self.shared.cfg.output,
                batch,
                self.shared.image_len,
            ));
        }
    }

    /// The bad records met so far after the first `seen` of them (of the first
    /// [`MAX_BAD_RECORDS_KEPT`]), in the order they were met: poll it to report them as they come.
    pub fn bad_records_since(&self, seen: usize) -> Vec<BadRecord> {
        let bad = self
            .shared
            .counters
            .bad
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        bad.get(seen..).unwrap_or_default().to_vec()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> PipelineStats {
        let c = &self.shared.counters;
        PipelineStats {
            batches: c.batches.load(Ordering::Relaxed),
            images: c.images.load(Ordering::Relaxed),
            skipped: c.skipped.load(Ordering::Relaxed),
            bad_records: c.bad.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            busy_seconds: c.busy_ns.load(Ordering::Relaxed) as f64 * 1e-9,
            decoded_pixels: c.decoded_pixels.load(Ordering::Relaxed),
        }
    }
}

impl Pipeline {
    /// Stops the workers and joins the dispatcher and sequencer threads.
    fn shutdown(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        drop(self.stop_tx.take());
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Iterator over one replica's batches; yields `Err(PipelineStopped)` once if the pipeline
/// stops before the epoch ends.
#[derive(Debug)]
pub struct ReplicaBatches {
    rx: Receiver<Result<Batch>>,
    replica: usize,
    delivered: usize,
    expected: usize,
    finished: bool,
}

impl Iterator for ReplicaBatches {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        if self.finished || self.delivered >= self.expected {
            return None;
        }
        match self.rx.recv() {
            Ok(item) => {
                self.delivered += 1;
                Some(item)
            }
            Err(_) => {
                self.finished = true;
                Some(Err(LoaderError::PipelineStopped {
                    replica: self.replica,
                    delivered: self.delivered,
                    expected: self.expected,
                }))
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.expected - self.delivered.min(self.expected);
        (0, Some(left + 1))
    }
}
