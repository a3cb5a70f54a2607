//! The data-parallel table: one OS thread and one model replica per local device.
//!
//! Each replica keeps its weights, gradients and momentum in three flat f32 buffers laid out
//! in *reverse* parameter order and cut into buckets ([`Layout`]); every parameter and its
//! `.grad` are views of them, so backward writes the gradients straight into the buffer the
//! buckets are reduced from. Every step each replica thread pulls its own batch, runs forward
//! and backward and, bucket by bucket, the replicas sum their gradients along a fixed binomial
//! tree over the threads (replica r adds the sum of r + 2^l at level l). With several ranks,
//! replica 0 copies the node sum to the bucket's host buffer (pinned for GPUs, on a side
//! stream) and hands it to the rank's communication thread (the caller of [`Table::step`]),
//! which allreduces it across ranks; with one rank nothing leaves the device. Each replica
//! then takes the reduced sum, scales it by 1 / (global replica count) and updates the bucket
//! (a few operations on its ranges of the three buffers) as soon as it is reduced. Every
//! replica applies the same averaged gradient to the same weights, so replicas stay bitwise
//! identical; BatchNorm running statistics stay per replica.
//!
//! On a GPU the replica thread never waits for the device within a step: copies run on a
//! side stream, batches arrive one step ahead (see `feed`), and the streams are ordered by
//! events ([`crate::device`]); on the CPU the same code runs with every event complete.
//!
//! How much of this overlaps is [`Overlap`] (`overlap`):
//!
//! - `off`: the whole gradient is one bucket, summed, copied and allreduced after backward.
//! - `pipeline`: buckets of about `bucket_mb`; after backward, the communication thread
//!   allreduces bucket k while the replicas sum and copy bucket k+1.
//! - `backward`: the allreduce also overlaps backward. tch has no autograd hooks, so the
//!   replica runs the model as a chain of stages ([`crate::model::Network`]: stem, each
//!   residual block, head), cutting the graph between stages (the input of stage s is the
//!   detached output of stage s-1, marked as requiring grad). Backward runs the loss through
//!   the last stage, then for each earlier stage s backpropagates from `out_s` seeded with
//!   the gradient that arrived at stage s+1's input, so gradients flow into the same
//!   operations as in one backward call. Buckets never span a stage boundary, and as soon as
//!   the backward of a stage is done every bucket whose parameters all lie in stages already
//!   done is summed and handed over, and allreduced while the replica runs the backward of
//!   the earlier stages. The gradient arriving at a stage boundary is summed from the same
//!   two consumers (residual and main path, or one) as in a single backward call, and
//!   two-term sums commute, so on CPU the gradients, and hence the weights, are bitwise those
//!   of `off` and `pipeline` (a test checks it).
//!
//! The tree and the bucket order are fixed, so a run is deterministic on CPU in every mode.
//!
//! Under `head_parallel` the classifier head is not in the buckets: every replica of the job
//! holds a slice of its classes, and a step exchanges the features of the global batch and the
//! softmax's sums instead of the head's gradient ([`head`]); the communication thread runs
//! those exchanges across the ranks as it runs the buckets' allreduce.
//!
//! [`Overlap`]: crate::config::Overlap

pub(crate) mod buckets;
mod comm;
mod config;
mod feed;
mod flat;
mod head;
mod loss_scale;
mod messages;
mod replica;
mod schedule;
mod serve;
mod shared;
mod stats;
mod tensor_io;

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{unbounded, Receiver, Sender};
use ddl_comm::cores::{lower_thread_priority, COMPUTE_NICE};
use tch::nn;
use tch::{Device, Kind, Tensor};

use crate::compiled::{self, Entry, StepSpec};
use crate::config::Precision;
use crate::config::Setting;
use crate::console::eprint_line;
use crate::device::DeviceCtx;
use crate::error::{Result, TrainError};
use crate::model::{self};
use crate::optim::Sgd;

use feed::Feed;
use flat::Flat;
use head::exchange::Exchange;
use head::HeadSlice;
use loss_scale::LossScaler;
use messages::{Cmd, HostBucket, Msg, StepCmd};
use replica::Replica;
use schedule::Schedule;
use shared::Shared;
use tensor_io::{from_host, tensor_to_vec, Normalizer};

pub use buckets::{Bucket, Layout, ParamInfo, ALIGN};
pub use comm::{BatchIter, Comm, ValidCount};
pub use config::TableConfig;
pub use head::HeadSplit;
pub use stats::{EvalSums, ReplicaState, StepStats};

/// The replicas of one rank and the machinery that keeps them in step.
pub struct Table {
    cfg: Arc<TableConfig>,
    layout: Arc<Layout>,
    shared: Arc<Shared>,
    cmds: Vec<Sender<Cmd>>,
    msgs: Receiver<Msg>,
    handles: Vec<JoinHandle<()>>,
    seq: u64,
    loss_scale: LossScaler,
    /// The `priority` schedule (none under `fifo`).
    schedule: Option<Schedule>,
}

impl Table {
    /// Builds the replicas: the model is initialised once on the CPU from `cfg.seed` (so every
    /// rank starts from the same weights), then copied to every device.
    pub fn new(cfg: TableConfig) -> Result<Table> {
        if cfg.devices.is_empty() {
            return Err(TrainError::config(Setting::Devices, "no device given"));
        }
        if cfg.devices.iter().all(|d| *d == Device::Cpu) {
            // Each replica thread is one core's worth of work.
            tch::set_num_threads(1);
        }
        let reference = nn::VarStore::new(Device::Cpu);
        let model = model::build_seeded(
            cfg.seed as i64,
            cfg.model,
            &reference.root(),
            cfg.classes,
            cfg.image_size,
        );
        let layout = Arc::new(Layout::for_overlap(
            &reference,
            model.as_ref(),
            cfg.overlap,
            cfg.bucket_bytes,
            cfg.head_parallel,
        ));
        let steps = Arc::new(compile_steps(&cfg, &layout)?);
        let init: Vec<(String, Vec<f32>)> = {
            let vars = reference.variables();
            let mut v: Vec<_> = vars
                .iter()
                .map(|(n, t)| Ok((n.clone(), tensor_to_vec(t)?)))
                .collect::<Result<_>>()?;
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        };
        let shared = Arc::new(Shared::new(
            cfg.devices.len(),
            layout.buckets.len(),
            host_buckets(&cfg, &layout)?,
            head_exchange(&cfg, &layout)?,
        ));
        // Flat buffers, made here so that every replica gets handles to every one's gradients.
        let flats = cfg
            .devices
            .iter()
            .map(|d| Flat::zeros(&layout, *d))
            .collect::<Result<Vec<_>>>()?;
        let cfg = Arc::new(cfg);
        let (msg_tx, msgs) = unbounded();
        let (built_tx, built_rx) = unbounded::<Result<()>>();
        let parts = ReplicaParts {
            cfg: cfg.clone(),
            layout: layout.clone(),
            shared: shared.clone(),
            init: Arc::new(init),
            steps,
            grads: flats.iter().map(|f| f.grads.shallow_clone()).collect(),
            tx: msg_tx,
        };
        let mut cmds = Vec::new();
        let mut handles = Vec::new();
        for (index, flat) in flats.into_iter().enumerate() {
            let (tx, rx) = unbounded();
            cmds.push(tx);
            handles.push(parts.spawn(index, flat, rx, built_tx.clone())?);
        }
        // The replicas hold the initial values now; the host copy (a whole model, 350 MB for
        // ResNet-101 at 21,841 classes) goes with the last thread's handle.
        drop(parts);
        let table = Table {
            schedule: Schedule::of(cfg.comm_order, &layout),
            loss_scale: LossScaler::new(cfg.precision),
            cfg,
            layout,
            shared,
            cmds,
            msgs,
            handles,
            seq: 0,
        };
        for _ in 0..table.replicas() {
            built_rx.recv().map_err(|_| TrainError::Replica {
                replica: 0,
                message: "replica thread died".into(),
            })??;
        }
        Ok(table)
    }

    /// The flat layout of parameters, buffers and buckets.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Number of local replicas.
    pub fn replicas(&self) -> usize {
        self.cmds.len()
    }

    /// Whether the replicas run at a lower CPU priority than the communication
    /// ([`TableConfig::yield_to_comm`]).
    pub fn yields_to_comm(&self) -> bool {
        self.cfg.yield_to_comm
    }

    /// Current fp16 loss scale and the count of steps since the last overflow.
    pub fn loss_scale(&self) -> (f64, u64) {
        self.loss_scale.state()
    }

    /// Restores the fp16 loss-scaler state.
    pub fn set_loss_scale(&mut self, scale: f64, good_steps: u64) {
        self.loss_scale = LossScaler::restored(scale, good_steps);
    }

    fn send(&self, replica: usize, cmd: Cmd) -> Result<()> {
        self.cmds[replica]
            .send(cmd)
            .map_err(|_| TrainError::Replica {
                replica,
                message: "replica thread has exited".into(),
            })
    }

    fn recv(&self) -> Result<Msg> {
        match self.msgs.recv() {
            Ok(Msg::Failed(replica, e)) => Err(self.failed(replica, e)),
            Ok(m) => Ok(m),
            Err(_) => Err(TrainError::Replica {
                replica: 0,
                message: "all replica threads exited".into(),
            }),
        }
    }

    /// The error of replica `replica`'s failure `e`, after stopping the others.
    fn failed(&self, replica: usize, e: TrainError) -> TrainError {
        self.shared.abort();
        match e {
            TrainError::Replica { .. } => e,
            other => TrainError::Replica {
                replica,
                message: other.to_string(),
            },
        }
    }

    /// Fails when updates of the last step are still pending (`priority`): the weights must
    /// not be read or written before [`Table::flush`].
    fn settled(&self, what: &str) -> Result<()> {
        if self.schedule.as_ref().is_some_and(Schedule::unflushed) {
            return Err(TrainError::Replica {
                replica: 0,
                message: format!("{what} before the last step's updates were flushed"),
            });
        }
        Ok(())
    }

    /// Attaches a batch source to each replica (one per replica, e.g. the loader's per-replica
    /// queues of an epoch).
    pub fn attach(&self, sources: Vec<BatchIter>) -> Result<()> {
        if sources.len() != self.replicas() {
            return Err(TrainError::Replica {
                replica: 0,
                message: format!(
                    "{} batch sources for {} replicas",
                    sources.len(),
                    self.replicas()
                ),
            });
        }
        for (r, s) in sources.into_iter().enumerate() {
            self.send(r, Cmd::Data(s))?;
        }
        Ok(())
    }

    /// Makes every replica train on one batch held on its device from now on
    /// (`synthetic_data`).
    pub fn attach_synthetic(&self) -> Result<()> {
        for r in 0..self.replicas() {
            self.send(r, Cmd::Synthetic)?;
        }
        Ok(())
    }

    /// Runs one synchronous step with learning rate `lr`. With several ranks `comm` sums the
    /// buckets across ranks in place, called from this thread, in the same order on every rank
    /// (as handed over under `fifo`, agreed chunk by chunk under `priority`, where the step
    /// returns with some of its buckets still to reduce: see [`Table::flush`]), and runs the
    /// head's exchanges under `head_parallel` (with one rank, never).
    pub fn step(&mut self, lr: f64, comm: &dyn Comm) -> Result<StepStats> {
        let start = Instant::now();
        let cmd = StepCmd {
            lr,
            seq: self.seq,
            loss_scale: self.loss_scale.scale(),
            inv: 1.0 / (self.cfg.global_replicas as f64 * self.loss_scale.scale()),
        };
        self.seq += self.layout.buckets.len() as u64;
        for r in 0..self.replicas() {
            self.send(r, Cmd::Step(cmd))?;
        }
        let mut stats = match self.schedule {
            None => self.serve_fifo(cmd, comm)?,
            Some(_) => self.serve_priority(cmd, comm)?,
        };
        let n = self.replicas() as u32;
        stats.loss /= f64::from(n);
        stats.data_wait /= n;
        stats.forward_wait /= n;
        stats.compute /= n;
        if self.cfg.precision == Precision::Fp16 {
            self.loss_scale.update(!stats.skipped);
        }
        stats.wall = start.elapsed();
        Ok(stats)
    }

    /// Evaluates replica 0 on `batches`, counting only the first `valid(batch)` images of each
    /// (padding is left out), and returns the sums (not yet reduced across ranks). Under
    /// `head_parallel` every replica of the job takes part (collective: every rank calls it,
    /// a rank without val records with no batches), and `comm` runs the head's exchanges.
    pub fn evaluate(
        &self,
        batches: BatchIter,
        valid: ValidCount,
        comm: &dyn Comm,
    ) -> Result<EvalSums> {
        self.settled("an evaluation")?;
        self.send(0, Cmd::Eval(batches, valid))?;
        let taking_part = if self.cfg.head_parallel {
            for r in 1..self.replicas() {
                self.send(r, Cmd::Eval(Box::new(std::iter::empty()), Box::new(|_| 0)))?;
            }
            self.replicas()
        } else {
            1
        };
        let mut sums = EvalSums::default();
        let mut done = 0;
        while done < taking_part {
            match self.recv()? {
                Msg::Eval(s) => {
                    // Only replica 0 scores images: the others' sums are zero.
                    sums.loss += s.loss;
                    sums.top1 += s.top1;
                    sums.top5 += s.top5;
                    sums.count += s.count;
                    sums.skipped += s.skipped;
                    done += 1;
                }
                Msg::Head(request) => self.serve_head(request, comm)?,
                _ => {
                    return Err(TrainError::Replica {
                        replica: 0,
                        message: "unexpected reply to eval".into(),
                    })
                }
            }
        }
        Ok(sums)
    }

    /// Runs a head exchange across the ranks for the replicas (see [`head::exchange`]).
    fn serve_head(&self, request: head::request::Request, comm: &dyn Comm) -> Result<()> {
        let served = match &self.shared.head {
            Some(exchange) => exchange.serve(request, comm),
            None => Err(TrainError::Replica {
                replica: 0,
                message: format!("a head exchange without {}", Setting::HeadParallel),
            }),
        };
        if served.is_err() {
            self.shared.abort();
        }
        served
    }

    /// How the head is split over the replicas of the job (`head_parallel`).
    pub fn head_split(&self) -> Option<HeadSplit> {
        self.cfg
            .head_parallel
            .then(|| HeadSplit::new(self.cfg.classes as usize, self.cfg.global_replicas))
    }

    /// This rank's index among the ranks of the job.
    pub fn rank(&self) -> usize {
        self.cfg.rank
    }

    /// Host copies of every replica's state, in replica order. Parameters and momentum are
    /// identical on every replica, so only replica 0's are copied (`params` and `momentum`
    /// are empty for the others); every replica's head slice is (`head_parallel`).
    pub fn states(&self) -> Result<Vec<ReplicaState>> {
        self.settled("reading the weights")?;
        let mut out = Vec::new();
        for r in 0..self.replicas() {
            self.send(r, Cmd::GetState { full: r == 0 })?;
            match self.recv()? {
                Msg::State(s) => out.push(*s),
                _ => {
                    return Err(TrainError::Replica {
                        replica: r,
                        message: "unexpected reply to state".into(),
                    })
                }
            }
        }
        Ok(out)
    }

    /// Loads a state into replica `replica`.
    pub fn set_state(&self, replica: usize, state: ReplicaState) -> Result<()> {
        self.settled("setting the weights")?;
        self.send(replica, Cmd::SetState(Box::new(state)))?;
        // Make sure it was applied (or surface its error) before returning.
        self.send(replica, Cmd::Checksum)?;
        match self.recv()? {
            Msg::Checksum(_) => Ok(()),
            _ => Err(TrainError::Replica {
                replica,
                message: "unexpected reply to set_state".into(),
            }),
        }
    }

    /// crc32c of every replica's parameters, in replica order.
    pub fn checksums(&self) -> Result<Vec<u32>> {
        self.settled("checksumming the weights")?;
        let mut out = Vec::new();
        for r in 0..self.replicas() {
            self.send(r, Cmd::Checksum)?;
            match self.recv()? {
                Msg::Checksum(c) => out.push(c),
                _ => {
                    return Err(TrainError::Replica {
                        replica: r,
                        message: "unexpected reply to checksum".into(),
                    })
                }
            }
        }
        Ok(out)
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        self.shared.abort();
        for tx in &self.cmds {
            let _ = tx.send(Cmd::Stop);
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// What each replica thread is built from; [`ReplicaParts::spawn`] starts one.
struct ReplicaParts {
    cfg: Arc<TableConfig>,
    layout: Arc<Layout>,
    shared: Arc<Shared>,
    /// The initial values of every variable, by name.
    init: Arc<Vec<(String, Vec<f32>)>>,
    /// The compiled steps, by image size (`compile`).
    steps: Arc<Vec<(u32, Entry)>>,
    /// Every replica's flat gradients.
    grads: Vec<Tensor>,
    tx: Sender<Msg>,
}

impl ReplicaParts {
    /// Starts replica `index` on its thread; the thread reports on `built` whether it could
    /// build the replica, then serves `rx`.
    fn spawn(
        &self,
        index: usize,
        flat: Flat,
        rx: Receiver<Cmd>,
        built: Sender<Result<()>>,
    ) -> Result<JoinHandle<()>> {
        let (cfg, layout, shared, init, steps, tx) = (
            self.cfg.clone(),
            self.layout.clone(),
            self.shared.clone(),
            self.init.clone(),
            self.steps.clone(),
            self.tx.clone(),
        );
        let grads: Vec<Tensor> = self.grads.iter().map(|g| g.shallow_clone()).collect();
        std::thread::Builder::new()
            .name(format!("replica-{index}"))
            .spawn(move || {
                ddl_trace::set_thread_name(format!("replica {index}"));
                if cfg.yield_to_comm {
                    if let Err(e) = lower_thread_priority(COMPUTE_NICE) {
                        tracing::warn!("replica {index}: cannot lower its CPU priority: {e}");
                    }
                }
                let replica = build_replica(index, cfg, layout, shared, &init, flat, grads, tx)
                    .and_then(|r| r.with_compiled_steps(&steps));
                drop(init);
                match replica {
                    Ok(r) => {
                        let _ = built.send(Ok(()));
                        r.run(rx)
                    }
                    Err(e) => {
                        let _ = built.send(Err(e));
                    }
                }
            })
            .map_err(|e| TrainError::Replica {
                replica: index,
                message: format!("cannot spawn thread: {e}"),
            })
    }
}

/// Builds replica `index` on its device: the model with the initial values `init`, its
/// parameters moved into `flat`.
#[allow(clippy::too_many_arguments)]
fn build_replica(
    index: usize,
    cfg: Arc<TableConfig>,
    layout: Arc<Layout>,
    shared: Arc<Shared>,
    init: &[(String, Vec<f32>)],
    flat: Flat,
    grads: Vec<Tensor>,
    tx: Sender<Msg>,
) -> Result<Replica> {
    let ctx = DeviceCtx::new(cfg.devices[index])?;
    let vs = nn::VarStore::new(ctx.device());
    // Under `head_parallel`, this replica's model has the classes of its slice.
    let global = cfg.rank * cfg.devices.len() + index;
    let split = cfg
        .head_parallel
        .then(|| HeadSplit::new(cfg.classes as usize, cfg.global_replicas));
    let classes = split
        .as_ref()
        .map_or(cfg.classes, |s| s.classes(global).len() as i64);
    // This replica's initial values (overwritten) are drawn too.
    let model = model::build(cfg.model, &vs.root(), classes, cfg.image_size);
    let vars = vs.variables();
    let get = |name: &str| {
        vars.get(name)
            .map(|t| t.shallow_clone())
            .ok_or_else(|| TrainError::Replica {
                replica: index,
                message: format!("variable {name} missing in replica"),
            })
    };
    {
        let _guard = tch::no_grad_guard();
        for (name, values) in init {
            match &split {
                Some(s) if crate::weights::is_head(name) => {
                    from_host(&mut get(name)?, &s.slice(global, values))?
                }
                _ => from_host(&mut get(name)?, values)?,
            }
        }
    }
    let mut params = layout
        .params
        .iter()
        .map(|p| get(&p.name))
        .collect::<Result<Vec<_>>>()?;
    flat.adopt(&layout, &mut params, cfg.channels_last)?;
    let buffers = layout
        .buffers
        .iter()
        .map(|(n, _)| get(n))
        .collect::<Result<Vec<_>>>()?;
    let head = match split {
        Some(s) => Some(HeadSlice::adopt(&vs, s.classes(global), ctx.device())?),
        None => None,
    };
    Ok(Replica {
        index,
        sgd: Sgd::new(cfg.sgd, ctx.device())?,
        norm: Normalizer::new(ctx.device(), cfg.channels_last, (cfg.mean, cfg.std))?,
        loss_host: ctx.host_buffer(1, Kind::Float)?,
        ctx,
        cfg,
        layout,
        shared,
        _vs: vs,
        model: std::rc::Rc::new(model),
        params,
        buffers,
        flat,
        grads,
        feed: Feed::None,
        tx,
        head,
        pending: None,
        compiled: Vec::new(),
    })
}

/// The compiled step of every image size of `cfg.compile` (none without it), found in the
/// cache or compiled there now, before any replica is built; rank 0 says which.
fn compile_steps(cfg: &TableConfig, layout: &Layout) -> Result<Vec<(u32, Entry)>> {
    let Some(settings) = &cfg.compile else {
        return Ok(Vec::new());
    };
    if settings.cuda_graphs && cfg.devices.iter().any(|d| !matches!(d, Device::Cuda(_))) {
        return Err(TrainError::Config {
            settings: vec![Setting::CudaGraphs, Setting::Devices],
            message: "CUDA graphs replay the compiled step on a GPU; this rank's replicas \
                      run on the CPU"
                .into(),
        });
    }
    let mut progress = |line: &str| {
        if settings.verbose && cfg.rank == 0 {
            eprint_line(line);
        }
    };
    settings
        .image_sizes
        .iter()
        .map(|&size| {
            let spec = StepSpec {
                model: cfg.model,
                classes: cfg.classes,
                batch: cfg.batch,
                image_size: size,
                model_image_size: cfg.image_size,
                precision: cfg.precision,
                channels_last: cfg.channels_last,
                label_smoothing: cfg.label_smoothing,
                layout,
                device: cfg.devices[0],
                fold_small_constants: settings.fold_small_constants,
                inductor_options: &settings.inductor_options,
                refuse_first_packages: 0,
            };
            Ok((size, compiled::prepare(&spec, settings, &mut progress)?))
        })
        .collect()
}

/// The exchanges of the head under `head_parallel`: with several ranks, over a host buffer
/// (pinned for GPUs) that holds the largest of them, the features and labels of the global
/// batch.
fn head_exchange(cfg: &TableConfig, layout: &Layout) -> Result<Option<Exchange>> {
    if !cfg.head_parallel {
        return Ok(None);
    }
    let replicas = cfg.devices.len();
    let host = if cfg.ranks > 1 {
        let features = layout
            .left_out
            .iter()
            .find_map(|p| p.shape.get(1).copied())
            .unwrap_or(0) as usize;
        let samples = cfg.ranks * replicas * cfg.batch;
        let len = (samples * (features + 1)).max(3 * samples);
        Some(DeviceCtx::new(cfg.devices[0])?.host_buffer(len, Kind::Float)?)
    } else {
        None
    };
    Ok(Some(Exchange::new(cfg.ranks, cfg.rank, replicas, host)))
}

/// The host buffer of every bucket, where the allreduce across ranks runs: pinned when the
/// replicas are GPUs; none with one rank, whose gradients never leave the devices.
fn host_buckets(cfg: &TableConfig, layout: &Layout) -> Result<Vec<Mutex<HostBucket>>> {
    if cfg.ranks <= 1 {
        return Ok(Vec::new());
    }
    let ctx = DeviceCtx::new(cfg.devices[0])?;
    layout
        .buckets
        .iter()
        .map(|b| {
            Ok(Mutex::new(HostBucket::new(
                ctx.host_buffer(b.len, Kind::Float)?,
            )))
        })
        .collect()
}
