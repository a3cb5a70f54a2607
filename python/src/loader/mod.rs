//! `ddl._ddl.Loader`: one process's view of ddl's pipeline (the Python class `ddl.Loader`
//! adds the PyTorch conventions on top of it).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::time::{Duration, Instant};

use ddl_exchange::EpochExchange;
use ddl_loader::dataset::{Dataset, OpenOptions, Residency};
use ddl_loader::elastic::{self, Layout};
use ddl_loader::limits::{self, AugmentSettings, Buffers, Settings};
use ddl_loader::pipeline::{
    eval_resize, Augment, OnBadRecord, Pipeline, PipelineConfig, ReplicaBatches, TrainAugment,
};
use ddl_loader::placement::Placement;
use ddl_loader::progress::EpochProgress;
use ddl_loader::sampler::{NodeRecords, Sampler, SamplerConfig, Tail};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

mod args;
mod open;

use args::{
    augment_error, check_world, limit_error, load_manifest, parse_dtype, parse_on_bad_record,
    value_error,
};
use open::{open_exchange, open_node, Exchanging, Opened};

use crate::batch::{BatchArray, HeldBatch, Part};
use crate::errors::{exchange_error, loader_error, DdlError};

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

/// The rest of an epoch resumed on another layout (`load_state_dict`): this node's part of
/// the records the epoch had not served, and this rank's sampler over them.
struct Resumed {
    epoch: u64,
    /// What the epoch had served when the remainder began (in `state_dict` while it runs).
    before: EpochProgress,
    /// None when no full step is left: the epoch ends where it is.
    part: Option<(Arc<Dataset>, Sampler)>,
}

/// What the exchanges into the epochs served so far moved, for `stats()`.
#[derive(Clone, Copy, Default)]
struct ExchangeTotals {
    records_in: u64,
    records_out: u64,
    bytes_in: u64,
    bytes_out: u64,
    wait_s: f64,
    transfer_s: f64,
}

impl ExchangeTotals {
    fn add(&mut self, e: EpochExchange) {
        self.records_in += e.moved.records_in;
        self.records_out += e.moved.records_out;
        self.bytes_in += e.moved.bytes_in;
        self.bytes_out += e.moved.bytes_out;
        self.wait_s += e.wait_s;
        self.transfer_s += e.transfer_s;
    }
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
    /// The split's identity: its manifest's fingerprint, shards and records.
    identity: (u32, usize, u64),
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
    /// The exchange of train records between the nodes (`exchange` above 0 on several nodes).
    exchange: Mutex<Option<Exchanging>>,
    exchanged: Mutex<ExchangeTotals>,
    /// The remainder of a resumed epoch, while that epoch is the loader's.
    resumed: Mutex<Option<Resumed>>,
}

#[pymethods]
impl Loader {
    /// Opens this node's shards of `split` in `path` and prepares the sampler and pipeline.
    #[new]
    #[pyo3(signature = (path, *, split, batch_size, image_size, workers, seed, node, nodes,
        rank_in_node, ranks_in_node, drop_last, wrap, dtype, prefetch, on_bad_record, resize,
        resize_ratio, scale, ratio, flip_p, mean, std, populate, exchange=0.0))]
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
        exchange: f64,
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
        let info = &manifest.splits[&split];
        let identity = (
            manifest.fingerprint(&split),
            info.shards.len(),
            info.records,
        );
        // Train: every node holds as many records as the others, to one ([`Placement`]).
        let placement = match train {
            true => {
                let shards: Vec<u64> = info.shards.iter().map(|s| s.records).collect();
                let q = if nodes > 1 { exchange } else { 0.0 };
                let p = Placement::new(&shards, nodes, q, seed);
                Some(p.map_err(|e| value_error("exchange", e))?)
            }
            false => None,
        };
        let per_node: Vec<u64> = match &placement {
            Some(p) => p.counts().iter().map(|&c| c as u64).collect(),
            None => Dataset::records_per_node(&manifest, &split, nodes),
        };
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
        let job = match train {
            true => NodeRecords {
                fewest: per_node.iter().copied().min().unwrap_or(0) as usize,
                most: per_node.iter().copied().max().unwrap_or(0) as usize,
            },
            false => NodeRecords::from(node_records),
        };
        if train && drop_last {
            limits::check_full_step(batch_size, ranks_in_node, 1, job.fewest).map_err(|e| {
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
            let layout = train.then_some(Layout {
                nodes,
                ranks_in_node,
                replicas: 1,
                batch_per_replica: batch_size,
                tail: sampling.tail,
                seed,
                exchange: if nodes > 1 { exchange } else { 0.0 },
            });
            let residency = Residency { node, nodes };
            // Without an exchange, the records that even the nodes out are read from `path`;
            // with one, they arrive into epoch 0.
            let holding = placement
                .as_ref()
                .filter(|p| !p.exchanges() && p.evened() > 0)
                .map(|p| p.holdings(0).node(node).to_vec());
            let records = (node_records, job);
            let (dataset, sampler) = open_node(
                py,
                (&path, &split),
                residency,
                &opts,
                holding,
                records,
                sampling,
            )?;
            Some(Opened {
                dataset,
                sampler,
                pipeline,
                layout,
                path: path.clone(),
                split: split.clone(),
                opts,
            })
        };
        let exchange = match &opened {
            Some(o) if train && exchange > 0.0 && nodes > 1 => {
                let place = (node, nodes, rank_in_node, ranks_in_node);
                Some(open_exchange(py, o, exchange, seed, place)?)
            }
            _ => None,
        };
        Ok(Loader {
            opened,
            classes,
            identity,
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
            exchange: Mutex::new(exchange),
            exchanged: Mutex::new(ExchangeTotals::default()),
            resumed: Mutex::new(None),
        })
    }

    /// Batches of `epoch` for this process (val: the same on every rank of the job, some of
    /// them empty on a node without records; a resumed epoch: its remainder's).
    fn steps_per_epoch(&self, epoch: u64) -> usize {
        if self.opened.is_none() {
            return self.val_steps;
        }
        self.with_sampler(epoch, |s| s.map_or(0, Sampler::steps_per_epoch))
    }

    /// Images this process gets in `epoch`: every step's batch for train, this rank's share of
    /// every record exactly once for val.
    fn samples_per_epoch(&self, epoch: u64) -> usize {
        self.with_sampler(epoch, |s| s.map_or(0, |s| s.samples_per_epoch(0)))
    }

    /// This process's share of `epoch`'s records before batching (`len()` of a
    /// `DataLoader`'s `DistributedSampler`; val: its records, each once).
    fn sampler_len(&self, epoch: u64) -> usize {
        self.with_sampler(epoch, |s| s.map_or(0, Sampler::share_per_epoch))
    }

    /// Continues `epoch` from the `state_dict` of a loader whose job had `nodes` nodes of
    /// `ranks_in_node` ranks exchanging `exchange`, with `drop_last` / `wrap`, stopped at its
    /// step `step` (of the remainder dealt from the served set `before`, `(records, words)`,
    /// when given). On this loader's layout with no `before`: an exact resume at `step`. On it
    /// with `before`: that remainder again, at `step`. On another layout (train only): what
    /// the old job served is recomputed and the rest dealt over this job's nodes, a remainder
    /// served from its step 0. Returns the step to start at.
    #[pyo3(signature = (epoch, step, *, nodes, ranks_in_node, exchange, drop_last, wrap, before))]
    #[allow(clippy::too_many_arguments)]
    fn resume(
        &self,
        py: Python<'_>,
        epoch: u64,
        step: usize,
        nodes: usize,
        ranks_in_node: usize,
        exchange: f64,
        drop_last: bool,
        wrap: bool,
        before: Option<(u64, Vec<u32>)>,
    ) -> PyResult<usize> {
        self.check_usable()?;
        // Refused while another thread iterates, before anything changes (as `stop`).
        self.lock_slot().check(None)?;
        let bad = |why: String| value_error("load_state_dict", why);
        let mine = self.opened.as_ref().and_then(|o| o.layout.as_ref());
        let old = mine.map(|l| Layout {
            nodes,
            ranks_in_node,
            tail: match (drop_last, wrap) {
                (true, _) => Tail::Drop,
                (false, false) => Tail::Short,
                (false, true) => Tail::Pad,
            },
            exchange: if nodes > 1 { exchange } else { 0.0 },
            ..l.clone()
        });
        let before = before
            .map(|(records, words)| EpochProgress::from_words(epoch, records, words))
            .transpose()
            .map_err(|e| bad(format!("progress: {e}")))?;
        let (Some(o), Some(mine), Some(old)) = (&self.opened, mine, old) else {
            // Val (or a node without records): only an exact resume.
            if before.is_some() {
                return Err(bad("a val loader's state has no progress".into()));
            }
            return self.resume_here(epoch, step);
        };
        let shards = self.shard_records(o)?;
        if let Some(b) = &before {
            if b.records != shards.iter().sum::<u64>() {
                return Err(bad(format!(
                    "its progress covers {} records, split {:?} has {}",
                    b.records,
                    o.split,
                    shards.iter().sum::<u64>()
                )));
            }
        }
        let (progress, start) = match before {
            None if old == *mine => return self.resume_here(epoch, step),
            Some(b) if old == *mine => (b, step),
            None => {
                let p = py
                    .detach(|| elastic::served(&shards, &old, epoch, step))
                    .map_err(|e| bad(e.to_string()))?;
                if p.served() == 0 {
                    return self.resume_here(epoch, 0); // nothing served: the epoch anew
                }
                (p, 0)
            }
            Some(b) => {
                let p = py
                    .detach(|| elastic::served_after(&b, &old, step))
                    .map_err(|e| bad(e.to_string()))?;
                (p, 0)
            }
        };
        let resumed = self.remainder(py, o, progress)?;
        let steps = resumed
            .part
            .as_ref()
            .map_or(0, |(_, s)| s.steps_per_epoch());
        if start > steps {
            return Err(bad(format!(
                "step {start} is beyond the {steps} steps of the epoch's remainder"
            )));
        }
        *self.lock_resumed() = Some(resumed);
        Ok(start)
    }

    /// What `epoch` had served when its remainder began, as `(records, words)`: None unless
    /// `epoch` is resumed on a remainder (for `state_dict`).
    fn progress(&self, epoch: u64) -> Option<(u64, Vec<u32>)> {
        let resumed = self.lock_resumed();
        let r = resumed.as_ref().filter(|r| r.epoch == epoch)?;
        Some((r.before.records, r.before.words().to_vec()))
    }

    /// Leaves the record exchange (waiting for a transfer in flight): before ddl.dist shuts
    /// down at the interpreter's exit. Later epochs serve the node's own records.
    fn end_exchange(&self, py: Python<'_>) {
        if self.unusable_after_fork.load(Ordering::SeqCst) {
            return; // the parent's exchange, leaked in this child
        }
        let taken = self
            .exchange
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        py.detach(move || drop(taken));
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

    /// The split's identity, `(fingerprint, shards, records)`: the crc32c of the manifest's
    /// classes and of the split's shards, their number, the split's records.
    #[getter]
    fn data(&self) -> (u32, usize, u64) {
        self.identity
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
        let steps = self.steps_per_epoch(epoch);
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
        let records = match self.epoch_records(py, o, epoch) {
            Ok(Some(records)) => records,
            Ok(None) => {
                // A remainder without steps: nothing to serve.
                py.detach(move || drop(previous));
                return Ok(ticket);
            }
            Err(e) => {
                self.lock_slot().owner = None;
                py.detach(move || drop(previous));
                return Err(e);
            }
        };
        let cfg = self.sizing.config(&o.pipeline, image_size);
        let started = self.start_run(py, records, previous, cfg, (epoch, start_step));
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
    /// forever; the record exchange is left the same way (the child serves its node's own
    /// records). A lock a parent thread held at the fork stays held in the child: then the
    /// loader refuses every further use with an error instead of blocking.
    fn forget_after_fork(&self) {
        /// Whether a parent thread held the lock at the fork (a poisoned lock is free).
        fn held<T>(m: &Mutex<T>) -> bool {
            matches!(m.try_lock(), Err(TryLockError::WouldBlock))
        }
        if held(&self.timing) || held(&self.bad_seen) || held(&self.slot) || held(&self.exchange) {
            // The run stays in the locked slot, and `Drop` leaks it (and the exchange).
            self.unusable_after_fork.store(true, Ordering::SeqCst);
            return;
        }
        let mut slot = self.lock_slot();
        std::mem::forget(slot.run.take());
        slot.owner = None;
        // The parent's exchange (its transfer thread, its place in the job) is not the
        // child's: the child serves its node's own records.
        let mut exchange = self.exchange.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::forget(exchange.take());
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
        let x = *self.exchanged.lock().unwrap_or_else(|p| p.into_inner());
        d.set_item("exchange_records_in", x.records_in)?;
        d.set_item("exchange_records_out", x.records_out)?;
        d.set_item("exchange_bytes_in", x.bytes_in)?;
        d.set_item("exchange_bytes_out", x.bytes_out)?;
        d.set_item("exchange_wait_s", x.wait_s)?;
        d.set_item("exchange_transfer_s", x.transfer_s)?;
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
            let exchange = self.exchange.get_mut().unwrap_or_else(|p| p.into_inner());
            std::mem::forget(exchange.take());
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

    fn lock_resumed(&self) -> std::sync::MutexGuard<'_, Option<Resumed>> {
        self.resumed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `f` of the sampler of `epoch`: its remainder's when it is resumed (None when no step
    /// is left), else the node's.
    fn with_sampler<T>(&self, epoch: u64, f: impl FnOnce(Option<&Sampler>) -> T) -> T {
        let resumed = self.lock_resumed();
        match resumed.as_ref().filter(|r| r.epoch == epoch) {
            Some(r) => f(r.part.as_ref().map(|(_, s)| s)),
            None => f(self.opened.as_ref().map(|o| &o.sampler)),
        }
    }

    /// The records and sampler `epoch` is served from: its remainder's when it is resumed
    /// (None when no step is left), else this node's records in that epoch (the exchange's,
    /// collective, when records move between the nodes). A remainder of another epoch is
    /// over: it is dropped.
    fn epoch_records(
        &self,
        py: Python<'_>,
        o: &Opened,
        epoch: u64,
    ) -> PyResult<Option<(Arc<Dataset>, Sampler)>> {
        {
            let mut resumed = self.lock_resumed();
            match resumed.as_ref() {
                Some(r) if r.epoch == epoch => return Ok(r.part.clone()),
                Some(_) => *resumed = None,
                None => {}
            }
        }
        let mut exchange = self.exchange.lock().unwrap_or_else(|p| p.into_inner());
        let Some(x) = exchange.as_mut() else {
            // Out of the exchange (a forked child, or ended): the node's own shards, whose
            // count may differ from what the exchange evened it out to.
            let (n, cfg) = (o.dataset.len(), o.sampler.config().clone());
            let sampler = match n == o.sampler.node_records() {
                true => o.sampler.clone(),
                false => Sampler::try_new(n, n, cfg).map_err(loader_error)?,
            };
            return Ok(Some((Arc::clone(&o.dataset), sampler)));
        };
        let dataset = py
            .detach(|| x.exchange.epoch(epoch))
            .map_err(exchange_error)?;
        if x.counted != Some(epoch) {
            x.counted = Some(epoch);
            if let Some(last) = x.exchange.last() {
                self.exchanged
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .add(last);
            }
        }
        Ok(Some((dataset, o.sampler.clone())))
    }

    /// An exact resume of `epoch` at `step` on this layout (no remainder): checks the step.
    fn resume_here(&self, epoch: u64, step: usize) -> PyResult<usize> {
        *self.lock_resumed() = None;
        let steps = self.steps_per_epoch(epoch);
        if step > steps {
            return Err(value_error(
                "load_state_dict: step",
                format!("{step} is beyond the epoch's {steps} steps"),
            ));
        }
        Ok(step)
    }

    /// The record counts of the split's shards, in split order.
    fn shard_records(&self, o: &Opened) -> PyResult<Vec<u64>> {
        let m = o.dataset.manifest();
        let info = m.split(&o.path, &o.split).map_err(loader_error)?;
        Ok(info.shards.iter().map(|s| s.records).collect())
    }

    /// The remainder of `progress`'s epoch for this rank: the records not served yet dealt
    /// over this job's nodes, this node's part read from every shard (without the GIL).
    fn remainder(
        &self,
        py: Python<'_>,
        o: &Opened,
        mut progress: EpochProgress,
    ) -> PyResult<Resumed> {
        let residency = o.dataset.residency();
        let cfg = o.sampler.config().clone();
        let part = py
            .detach(|| elastic::remainder(&o.path, &o.split, &progress, residency, cfg, &o.opts))
            .map_err(loader_error)?;
        progress.resumed = true;
        Ok(Resumed {
            epoch: progress.epoch,
            before: progress,
            part: part.map(|r| (Arc::new(r.dataset), r.sampler)),
        })
    }

    /// The run of `epoch` from `start_step` over `(dataset, sampler)` with `cfg`:
    /// `previous`'s pipeline moved on, or a new one. Joins and starts threads with the GIL
    /// released.
    fn start_run(
        &self,
        py: Python<'_>,
        (dataset, sampler): (Arc<Dataset>, Sampler),
        previous: Option<Run>,
        cfg: PipelineConfig,
        (epoch, start_step): (u64, usize),
    ) -> PyResult<Run> {
        // A shard rewritten or truncated since it was mapped is an exception here, at the
        // epoch's start, rather than a SIGBUS in the middle of it.
        dataset.check_unchanged().map_err(loader_error)?;
        let (pipeline, extra) = py
            .detach(|| match previous {
                Some(r) => r
                    .pipeline
                    .next_epoch_over(dataset, sampler, cfg, epoch, start_step)
                    .map(|p| (p, r.extra_buffers)),
                None => Pipeline::start(dataset, sampler, cfg, epoch, start_step).map(|p| (p, 0)),
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
