//! `ddl._ddl.Loader`: one process's view of ddl's pipeline (the Python class `ddl.Loader`
//! adds the PyTorch conventions on top of it).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::time::{Duration, Instant};

use ddl_loader::dataset::{Dataset, OpenOptions, Residency};
use ddl_loader::limits::{
    self, AugmentError, AugmentSetting, AugmentSettings, Buffers, LimitError, Setting, Settings,
};
use ddl_loader::manifest::Manifest;
use ddl_loader::pipeline::{
    eval_resize, Augment, OnBadRecord, Output, Pipeline, PipelineConfig, ReplicaBatches,
    TrainAugment,
};
use ddl_loader::sampler::{Sampler, SamplerConfig, Tail};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::batch::{BatchArray, HeldBatch, Part};
use crate::errors::{loader_error, DdlError};

/// The running epoch and the iteration reading it. Held only for moments, never while
/// waiting for a batch or joining threads, and never while taking the GIL: `stats()` may take
/// it from any thread at any time, and no thread waits on it for long.
#[derive(Default)]
struct Slot {
    /// The running epoch: None before `start`, and while `start` or `next` works on it with
    /// the GIL released.
    run: Option<Run>,
    /// The iteration in progress (from `start` to `release`).
    owner: Option<Owner>,
    /// Tickets handed out so far.
    tickets: u64,
}

/// An iteration in progress: its ticket and the thread running it.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Owner {
    ticket: u64,
    thread: std::thread::ThreadId,
}

impl Slot {
    /// Fails unless `ticket` (None: any iteration of this thread) may work on the run: a
    /// loader serves one iteration at a time, as a generator does.
    fn check(&self, ticket: Option<u64>) -> PyResult<()> {
        let me = std::thread::current().id();
        match self.owner {
            Some(o) if o.thread != me => Err(PyRuntimeError::new_err(
                "ddl.Loader: another thread is iterating this loader; a loader serves one \
                 iteration at a time (give each thread its own ddl.Loader)",
            )),
            Some(o) if ticket.is_some_and(|t| t != o.ticket) => Err(PyRuntimeError::new_err(
                "ddl.Loader: this iterator was superseded by a newer iteration of the same \
                 loader (iter() restarts the loader; keep one iterator per loader)",
            )),
            None if ticket.is_some() => Err(PyRuntimeError::new_err(
                "ddl.Loader: this iterator has ended (the loader was closed, restored by \
                 load_state_dict or forked since)",
            )),
            _ => Ok(()),
        }
    }
}

/// The running epoch: the pipeline and this process's stream of its batches.
struct Run {
    pipeline: Pipeline,
    batches: ReplicaBatches,
    /// Extra buffers given to the pool for batches the caller keeps alive.
    extra_buffers: usize,
    /// Bad records of this run already copied to `Loader::bad_seen`.
    bad_reported: usize,
}

/// Counters for `stats()`.
#[derive(Clone, Copy, Default)]
struct Timing {
    images: u64,
    batches: u64,
    wait: Duration,
    first: Option<Instant>,
}

/// What `Loader` needs once its node's shards are open.
struct Opened {
    dataset: Arc<Dataset>,
    sampler: Sampler,
    pipeline: PipelineConfig,
}

/// What an epoch's image size changes, and what a new size is checked against.
#[derive(Clone, Copy)]
struct Sizing {
    /// The settings the loader was made with (their image size the first one).
    settings: Settings,
    buffers: Buffers,
    /// Val: the shorter side before the center crop, or 0 for `resize_ratio` x the size.
    resize: u32,
    resize_ratio: f64,
}

impl Sizing {
    /// Checks `size` as `image_size` would be checked: its limits and a val resize it must
    /// fit in, and with `memory` the memory its batches take (when it is set, not at every
    /// epoch's start: memory that the training took since must not stop a running loader).
    fn check(&self, size: u32, memory: bool) -> PyResult<()> {
        let settings = Settings {
            image_size: size,
            ..self.settings
        };
        limits::check(&settings).map_err(limit_error)?;
        if !memory {
            return Ok(());
        }
        limits::check_memory(&settings, self.buffers, limits::available_memory())
            .map_err(limit_error)
    }

    /// The pipeline configuration of an epoch at `size`: `base` with the size and, for val,
    /// the resize that goes with it.
    fn config(&self, base: &PipelineConfig, size: u32) -> PipelineConfig {
        let augment = match base.augment {
            Augment::Train => Augment::Train,
            Augment::Eval { .. } => Augment::Eval {
                resize: if self.resize > 0 {
                    self.resize
                } else {
                    eval_resize(size, self.resize_ratio)
                },
            },
        };
        PipelineConfig {
            image_size: size,
            augment,
            ..base.clone()
        }
    }
}

/// One process's loader over one split (see `ddl.Loader` for the documented API).
#[pyclass(module = "ddl._ddl")]
pub struct Loader {
    /// None when this node holds no records of the split (a small val split over many nodes).
    opened: Option<Opened>,
    classes: Vec<String>,
    /// Records of this node.
    node_records: usize,
    /// Val: the steps of every rank of the job (a node without records takes them empty).
    val_steps: usize,
    sizing: Sizing,
    slot: Mutex<Slot>,
    held: Arc<AtomicUsize>,
    timing: Mutex<Timing>,
    bad_seen: Mutex<Vec<(String, usize, String)>>,
    /// Set in a forked child whose copy of the slot was locked by a parent thread at the fork.
    unusable_after_fork: AtomicBool,
}

fn value_error(arg: &str, why: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!("{arg}: {why}"))
}

/// A refusal of the augmentation's checks as the ValueError of its argument.
fn augment_error(e: AugmentError) -> PyErr {
    let name = match e.setting {
        AugmentSetting::Scale => "scale",
        AugmentSetting::Ratio => "ratio",
        AugmentSetting::Flip => "flip_p",
        AugmentSetting::EvalResizeRatio => "resize_ratio",
        AugmentSetting::Mean => "mean",
        AugmentSetting::Std => "std",
    };
    value_error(name, e)
}

/// A refusal of the loader's limits (shared with ddl-train and ddl-prof) as the ValueError of
/// the arguments that would lift it.
fn limit_error(e: LimitError) -> PyErr {
    let names = e.named(|s| match s {
        Setting::Batch => "batch_size",
        Setting::ImageSize => "image_size",
        Setting::Workers => "workers",
        Setting::Prefetch => "prefetch",
        Setting::EvalResize => "resize",
    });
    value_error(&names, e)
}

/// Checks this process's place in the job: `node` of `nodes`, `rank_in_node` of
/// `ranks_in_node`.
fn check_world(
    node: usize,
    nodes: usize,
    rank_in_node: usize,
    ranks_in_node: usize,
) -> PyResult<()> {
    if nodes * ranks_in_node == 0 {
        return Err(value_error("world size", "must be positive, got 0"));
    }
    if node >= nodes || rank_in_node >= ranks_in_node {
        return Err(value_error(
            "rank",
            format!(
                "node {node} of {nodes}, local rank {rank_in_node} of {ranks_in_node}: out of range"
            ),
        ));
    }
    Ok(())
}

/// The batch layout of the `dtype` argument.
fn parse_dtype(dtype: &str) -> PyResult<Output> {
    match dtype {
        "float32" => Ok(Output::F32Nchw),
        "uint8" => Ok(Output::U8Nhwc),
        other => Err(value_error(
            "dtype",
            format!("{other:?} is not \"float32\" or \"uint8\""),
        )),
    }
}

/// The rule of the `on_bad_record` argument.
fn parse_on_bad_record(on_bad_record: &str) -> PyResult<OnBadRecord> {
    match on_bad_record {
        "skip" => Ok(OnBadRecord::Skip),
        "replace" => Ok(OnBadRecord::Replace),
        "fail" => Ok(OnBadRecord::Fail),
        other => Err(value_error(
            "on_bad_record",
            format!("{other:?} is not \"skip\", \"replace\" or \"fail\""),
        )),
    }
}

/// The manifest in `path`, which must have `split`, with a shard for each of `nodes` when it
/// trains.
fn load_manifest(path: &Path, split: &str, nodes: usize, train: bool) -> PyResult<Manifest> {
    let manifest = Manifest::load(path).map_err(loader_error)?;
    if !manifest.splits.contains_key(split) {
        let have: Vec<&str> = manifest.splits.keys().map(String::as_str).collect();
        return Err(value_error(
            "split",
            format!(
                "{}: no split {split:?} (the manifest has {})",
                path.display(),
                have.join(", ")
            ),
        ));
    }
    let shards = manifest.splits[split].shards.len();
    if nodes > shards && train {
        return Err(value_error(
            "world size",
            format!(
                "{nodes} nodes but split {split:?} of {} has {shards} shards: every node needs one",
                path.display()
            ),
        ));
    }
    Ok(manifest)
}

/// Opens this node's shards of `split` (without the GIL) and its sampler over `min_node`
/// records per node.
fn open_node(
    py: Python<'_>,
    path: &Path,
    split: &str,
    residency: Residency,
    opts: &OpenOptions,
    min_node: usize,
    sampling: SamplerConfig,
) -> PyResult<(Arc<Dataset>, Sampler)> {
    let dataset = py
        .detach(|| Dataset::open(path, split, residency, opts))
        .map_err(loader_error)?;
    let sampler = Sampler::try_new(dataset.len(), min_node, sampling).map_err(loader_error)?;
    Ok((Arc::new(dataset), sampler))
}

#[pymethods]
impl Loader {
    /// Opens this node's shards of `split` in `path` and prepares the sampler and pipeline.
    #[new]
    #[pyo3(signature = (path, *, split, batch_size, image_size, workers, seed, node, nodes,
        rank_in_node, ranks_in_node, drop_last, wrap, dtype, prefetch, on_bad_record, resize,
        resize_ratio, scale, ratio, flip_p, mean, std, populate))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        split: String,
        batch_size: usize,
        image_size: u32,
        workers: usize,
        seed: u64,
        node: usize,
        nodes: usize,
        rank_in_node: usize,
        ranks_in_node: usize,
        drop_last: bool,
        wrap: bool,
        dtype: &str,
        prefetch: usize,
        on_bad_record: &str,
        resize: u32,
        resize_ratio: f64,
        scale: (f64, f64),
        ratio: (f64, f64),
        flip_p: f64,
        mean: [f32; 3],
        std: [f32; 3],
        populate: bool,
    ) -> PyResult<Loader> {
        let train_augment = TrainAugment {
            scale,
            ratio,
            flip: flip_p,
        };
        limits::check_augment(&AugmentSettings {
            train: train_augment,
            eval_resize_ratio: resize_ratio,
            mean,
            std,
        })
        .map_err(augment_error)?;
        let settings = Settings {
            batch: batch_size,
            image_size,
            workers,
            prefetch,
            eval_resize: resize,
        };
        limits::check(&settings).map_err(limit_error)?;
        check_world(node, nodes, rank_in_node, ranks_in_node)?;
        let output = parse_dtype(dtype)?;
        let buffers = Buffers {
            replicas: 1,
            ranks_on_node: ranks_in_node,
            output,
        };
        limits::check_memory(&settings, buffers, limits::available_memory())
            .map_err(limit_error)?;
        let on_bad = parse_on_bad_record(on_bad_record)?;
        // "val" gets the eval transform and order; any other split trains.
        let train = split != "val";
        let manifest = load_manifest(&path, &split, nodes, train)?;
        let classes = manifest.classes.iter().map(|c| c.wnid.clone()).collect();
        let per_node = Dataset::records_per_node(&manifest, &split, nodes);
        let node_records = per_node[node] as usize;
        // Val: every rank of the job takes the steps of the node with the most records.
        let val_steps = if train {
            0
        } else {
            per_node
                .iter()
                .map(|&n| (n as usize).div_ceil(ranks_in_node * batch_size))
                .max()
                .unwrap_or(0)
        };
        if train && drop_last {
            let smallest = per_node.iter().copied().min().unwrap_or(0) as usize;
            limits::check_full_step(batch_size, ranks_in_node, 1, smallest).map_err(|e| {
                value_error(
                    "batch_size",
                    format!(
                        "{e} of split {split:?} (the last incomplete batch is dropped; \
                         drop_last=False keeps it)"
                    ),
                )
            })?;
        }
        let augment = if train {
            Augment::Train
        } else {
            Augment::Eval {
                resize: if resize > 0 {
                    resize
                } else {
                    eval_resize(image_size, resize_ratio)
                },
            }
        };
        let pipeline = PipelineConfig {
            image_size,
            output,
            augment,
            train: train_augment,
            workers,
            prefetch,
            seed,
            // A bad val record is left out, never scored through a stand-in (as ddl-train).
            on_bad_record: match (train, on_bad) {
                (false, OnBadRecord::Replace) => OnBadRecord::Skip,
                (_, rule) => rule,
            },
            mean,
            std,
        };
        // A shard truncated in the middle of an epoch still ends the process with SIGBUS
        // (nothing can be read in its place), but first names the shard on stderr.
        ddl_loader::fault::report_sigbus()
            .map_err(|e| DdlError::new_err(format!("installing the SIGBUS report: {e}")))?;
        let opened = if node_records == 0 {
            None
        } else {
            let min_node = if train {
                per_node.iter().copied().min().unwrap_or(0) as usize
            } else {
                node_records
            };
            let sampling = SamplerConfig {
                seed,
                ranks_in_node,
                rank_in_node,
                replicas: 1,
                batch_per_replica: batch_size,
                tail: match (train, drop_last, wrap) {
                    (false, _, _) => Tail::Even { steps: val_steps },
                    (true, true, _) => Tail::Drop,
                    (true, false, false) => Tail::Short,
                    (true, false, true) => Tail::Pad,
                },
                shuffle: train,
            };
            let opts = OpenOptions {
                populate,
                ..OpenOptions::default()
            };
            let residency = Residency { node, nodes };
            let (dataset, sampler) =
                open_node(py, &path, &split, residency, &opts, min_node, sampling)?;
            Some(Opened {
                dataset,
                sampler,
                pipeline,
            })
        };
        Ok(Loader {
            opened,
            classes,
            node_records,
            val_steps,
            sizing: Sizing {
                settings,
                buffers,
                resize,
                resize_ratio,
            },
            slot: Mutex::new(Slot::default()),
            held: Arc::new(AtomicUsize::new(0)),
            timing: Mutex::new(Timing::default()),
            bad_seen: Mutex::new(Vec::new()),
            unusable_after_fork: AtomicBool::new(false),
        })
    }

    /// Batches per epoch for this process (val: the same on every rank of the job, some of
    /// them empty on a node without records).
    fn steps_per_epoch(&self) -> usize {
        self.opened
            .as_ref()
            .map_or(self.val_steps, |o| o.sampler.steps_per_epoch())
    }

    /// Images this process gets per epoch: every step's batch for train, this rank's share of
    /// every record exactly once for val.
    fn samples_per_epoch(&self) -> usize {
        self.opened
            .as_ref()
            .map_or(0, |o| o.sampler.samples_per_epoch(0))
    }

    /// This process's share of the epoch's records before batching (`len()` of a
    /// `DataLoader`'s `DistributedSampler`; val: its records, each once).
    fn sampler_len(&self) -> usize {
        self.opened
            .as_ref()
            .map_or(0, |o| o.sampler.share_per_epoch())
    }

    /// Checks `size` as a new image size (the limits of `image_size`, the memory its batches
    /// take, a val `resize` it must fit in).
    fn check_image_size(&self, size: u32) -> PyResult<()> {
        self.sizing.check(size, true)
    }

    /// The class wnids in label order.
    #[getter]
    fn classes(&self) -> Vec<String> {
        self.classes.clone()
    }

    /// Records of the split on this node.
    #[getter]
    fn node_records(&self) -> usize {
        self.node_records
    }

    /// Starts (or restarts) iteration at `(epoch, start_step)` with images of `image_size`,
    /// stopping the previous run of this thread; returns the iteration's ticket for `next` and
    /// `release`.
    fn start(
        &self,
        py: Python<'_>,
        epoch: u64,
        start_step: usize,
        image_size: u32,
    ) -> PyResult<u64> {
        self.check_usable()?;
        self.sizing.check(image_size, false)?;
        let steps = self.steps_per_epoch();
        if start_step > steps {
            return Err(value_error(
                "start step",
                format!("{start_step} is beyond the epoch's {steps} steps"),
            ));
        }
        let (ticket, previous) = {
            let mut slot = self.lock_slot();
            slot.check(None)?;
            slot.tickets += 1;
            let ticket = slot.tickets;
            slot.owner = Some(Owner {
                ticket,
                thread: std::thread::current().id(),
            });
            (ticket, slot.run.take())
        };
        let Some(o) = &self.opened else {
            return Ok(ticket);
        };
        let cfg = self.sizing.config(&o.pipeline, image_size);
        let started = self.start_run(py, o, previous, cfg, (epoch, start_step));
        let mut slot = self.lock_slot();
        match started {
            Ok(run) => {
                slot.run = Some(run);
                Ok(ticket)
            }
            Err(e) => {
                slot.owner = None;
                Err(e)
            }
        }
    }

    /// The next batch of iteration `ticket` as `(images, labels, indices, step)` arrays, or
    /// None at the epoch's end. Blocks with the GIL released.
    fn next(
        &self,
        py: Python<'_>,
        ticket: u64,
    ) -> PyResult<Option<(BatchArray, BatchArray, BatchArray, usize)>> {
        self.check_usable()?;
        let mut run = {
            let mut slot = self.lock_slot();
            slot.check(Some(ticket))?;
            match slot.run.take() {
                Some(run) => run,
                None => return Ok(None),
            }
        };
        // The pool holds one batch per consumer; give it one more buffer for every further
        // batch the caller still keeps alive, so that keeping batches never stalls the pipeline.
        let kept = self.held.load(Ordering::SeqCst).saturating_sub(1);
        if kept > run.extra_buffers {
            run.pipeline.add_buffers(kept - run.extra_buffers);
            run.extra_buffers = kept;
        }
        let t0 = Instant::now();
        let item = py.detach(|| run.batches.next());
        let waited = t0.elapsed();
        self.note_bad_records(&mut run);
        self.lock_slot().run = Some(run);
        let Some(batch) = item.transpose().map_err(loader_error)? else {
            return Ok(None);
        };
        let step = batch.step;
        let rows = batch.len();
        {
            let mut timing = self.timing.lock().unwrap_or_else(|p| p.into_inner());
            timing.first.get_or_insert(t0);
            timing.wait += waited;
            timing.images += rows as u64;
            timing.batches += 1;
        }
        let held = HeldBatch::new(batch, rows, Arc::clone(&self.held));
        Ok(Some((
            BatchArray::new(Arc::clone(&held), Part::Images),
            BatchArray::new(Arc::clone(&held), Part::Labels),
            BatchArray::new(held, Part::Indices),
            step,
        )))
    }

    /// Ends iteration `ticket` (its generator finished or was dropped): another thread may
    /// iterate now. The pipeline stays for the next epoch. A superseded ticket is ignored.
    fn release(&self, ticket: u64) {
        if self.unusable_after_fork.load(Ordering::SeqCst) {
            return; // an iteration of the parent ending in the child: nothing to release
        }
        let mut slot = self.lock_slot();
        if slot.owner.is_some_and(|o| o.ticket == ticket) {
            slot.owner = None;
        }
    }

    /// Stops the running epoch (its threads are joined; batches already lent stay valid).
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        self.check_usable()?;
        let run = {
            let mut slot = self.lock_slot();
            slot.check(None)?;
            slot.owner = None;
            slot.run.take()
        };
        py.detach(move || drop(run));
        Ok(())
    }

    /// In a child process just forked (`os.register_at_fork`): forgets the parent's running
    /// epoch, whose threads do not exist here, so that the next `start` starts new ones. Its
    /// state is leaked, not dropped: dropping it would join the absent threads and block
    /// forever. A lock a parent thread held at the fork stays held in the child: then the
    /// loader refuses every further use with an error instead of blocking.
    fn forget_after_fork(&self) {
        /// Whether a parent thread held the lock at the fork (a poisoned lock is free).
        fn held<T>(m: &Mutex<T>) -> bool {
            matches!(m.try_lock(), Err(TryLockError::WouldBlock))
        }
        if held(&self.timing) || held(&self.bad_seen) || held(&self.slot) {
            // The run stays in the locked slot, and `Drop` leaks it.
            self.unusable_after_fork.store(true, Ordering::SeqCst);
            return;
        }
        let mut slot = self.lock_slot();
        std::mem::forget(slot.run.take());
        slot.owner = None;
    }

    /// Batches lent to Python and still alive.
    fn batches_alive(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    /// Throughput and waiting since the first batch, and the bad records met. Safe from any
    /// thread at any time: while `next` waits for a batch it holds the run, and the bad
    /// records it meets are counted when the batch arrives.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.check_usable()?;
        if let Some(run) = self.lock_slot().run.as_mut() {
            self.note_bad_records(run);
        }
        // Copied out: no lock is held while Python objects are made.
        let t = *self.timing.lock().unwrap_or_else(|p| p.into_inner());
        let elapsed = t.first.map_or(0.0, |f| f.elapsed().as_secs_f64());
        let wait = t.wait.as_secs_f64();
        let bad = self
            .bad_seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let d = PyDict::new(py);
        d.set_item("images", t.images)?;
        d.set_item("batches", t.batches)?;
        d.set_item("seconds", elapsed)?;
        d.set_item(
            "images_per_s",
            if elapsed > 0.0 {
                t.images as f64 / elapsed
            } else {
                0.0
            },
        )?;
        d.set_item("wait_s", wait)?;
        d.set_item(
            "wait_fraction",
            if elapsed > 0.0 { wait / elapsed } else { 0.0 },
        )?;
        d.set_item("bad_records", bad)?;
        Ok(d)
    }
}

impl Drop for Loader {
    /// In a forked child whose slot stayed locked, the parent's run is leaked, not dropped
    /// (dropping it would join threads that do not exist here).
    fn drop(&mut self) {
        if self.unusable_after_fork.load(Ordering::SeqCst) {
            let slot = self.slot.get_mut().unwrap_or_else(|p| p.into_inner());
            std::mem::forget(slot.run.take());
        }
    }
}

impl Loader {
    /// Fails in a forked child in which the loader's state was locked at the fork.
    fn check_usable(&self) -> PyResult<()> {
        if self.unusable_after_fork.load(Ordering::SeqCst) {
            return Err(PyRuntimeError::new_err(
                "ddl.Loader: this process was forked while another thread of the parent was \
                 using the loader, which left its state locked here: make a new ddl.Loader in \
                 the child",
            ));
        }
        Ok(())
    }

    fn lock_slot(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The run of `epoch` from `start_step` with `cfg`: `previous`'s pipeline moved on, or a
    /// new one. Joins and starts threads with the GIL released.
    fn start_run(
        &self,
        py: Python<'_>,
        o: &Opened,
        previous: Option<Run>,
        cfg: PipelineConfig,
        (epoch, start_step): (u64, usize),
    ) -> PyResult<Run> {
        // A shard rewritten or truncated since it was mapped is an exception here, at the
        // epoch's start, rather than a SIGBUS in the middle of it.
        o.dataset.check_unchanged().map_err(loader_error)?;
        let (pipeline, extra) = py
            .detach(|| match previous {
                Some(r) => r
                    .pipeline
                    .next_epoch_with(cfg, epoch, start_step)
                    .map(|p| (p, r.extra_buffers)),
                None => Pipeline::start(
                    Arc::clone(&o.dataset),
                    o.sampler.clone(),
                    cfg,
                    epoch,
                    start_step,
                )
                .map(|p| (p, 0)),
            })
            .map_err(loader_error)?;
        let batches = pipeline.replica(0);
        Ok(Run {
            pipeline,
            batches,
            extra_buffers: extra,
            bad_reported: 0,
        })
    }

    /// Appends the run's bad records not yet seen to `bad_seen`.
    fn note_bad_records(&self, run: &mut Run) {
        let mut seen = self.bad_seen.lock().unwrap_or_else(|p| p.into_inner());
        let new = run.pipeline.bad_records_since(run.bad_reported);
        run.bad_reported += new.len();
        seen.extend(
            new.into_iter()
                .map(|b| (b.file.display().to_string(), b.record, b.reason)),
        );
    }
}
