//! One replica: its thread, model, optimizer and data, and its part of every step.

use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use tch::nn;
use tch::{Kind, Reduction, Tensor};

use crate::compiled::{Entry, GraphLibrary, StepPackage};
use crate::config::Setting;
use crate::config::{Overlap, Precision};
use crate::console::eprint_line;
use crate::device::{autocast, DeviceCtx, Event};
use crate::error::{Result, TrainError};
use crate::model;
use crate::optim::Sgd;
use ddl_comm::CommOrder;

use super::buckets::Layout;
use super::comm::{BatchIter, ValidCount};
use super::config::TableConfig;
use super::feed::{Feed, StepBatch};
use super::flat::{range, Flat};
use super::head::HeadSlice;
use super::messages::{Cmd, Msg, ReplicaStep, StepCmd};
use super::shared::Shared;
use super::stats::{EvalSums, ReplicaState};
use super::tensor_io::{from_host, tensor_to_vec, to_host, BatchTensors, Normalizer};

pub(crate) struct Replica {
    pub(crate) index: usize,
    pub(crate) ctx: DeviceCtx,
    pub(crate) cfg: Arc<TableConfig>,
    pub(crate) layout: Arc<Layout>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) _vs: nn::VarStore,
    /// Shared with the forward pass's hook, which borrows the replica mutably.
    pub(crate) model: Rc<model::Model>,
    pub(crate) params: Vec<Tensor>,
    pub(crate) buffers: Vec<Tensor>,
    pub(crate) flat: Flat,
    /// The flat gradients of every replica (shallow handles), own one at `index`.
    pub(crate) grads: Vec<Tensor>,
    pub(crate) sgd: Sgd,
    pub(crate) norm: Normalizer,
    pub(crate) feed: Feed,
    /// Host copy of the step's loss (pinned on a GPU).
    pub(crate) loss_host: Tensor,
    pub(crate) tx: Sender<Msg>,
    /// This replica's slice of the head, under `head_parallel`.
    pub(crate) head: Option<HeadSlice>,
    /// `priority` order: the step whose bucket updates are still to be applied, each just
    /// before the next forward pass runs its stage (or at a flush).
    pub(crate) pending: Option<StepCmd>,
    /// The compiled step of each image size (`compile`), bound to this replica's tensors;
    /// empty: the eager step.
    pub(crate) compiled: Vec<(i64, StepPackage)>,
}

/// The factor a summed gradient is multiplied by, rounded to f32 once.
fn f32_factor(inv: f64) -> f64 {
    f64::from(inv as f32)
}

impl Replica {
    /// This replica with the compiled `steps` loaded and bound to its parameters, buffers and
    /// flat gradients, each replayed from a CUDA graph if the run asks (`cuda_graphs`).
    pub(crate) fn with_compiled_steps(mut self, steps: &[(u32, Entry)]) -> Result<Replica> {
        let device = self.ctx.device();
        let cuda_graphs = self.cfg.compile.as_ref().is_some_and(|c| c.cuda_graphs);
        let named: Vec<(String, Tensor)> = self
            .layout
            .params
            .iter()
            .map(|p| p.name.clone())
            .zip(self.params.iter().map(Tensor::shallow_clone))
            .chain(
                self.layout
                    .buffers
                    .iter()
                    .map(|(n, _)| n.clone())
                    .zip(self.buffers.iter().map(Tensor::shallow_clone)),
            )
            .collect();
        for (size, entry) in steps {
            let mut package = StepPackage::load(&entry.package(), entry.described.clone(), device)?;
            package.bind(&named, &self.flat.grads)?;
            if cuda_graphs {
                let library = entry.graph_library().map_err(|why| {
                    TrainError::config(
                        Setting::CudaGraphs,
                        format!("{} has no CUDA graph library: {why}", entry.dir.display()),
                    )
                })?;
                package.use_cuda_graphs(GraphLibrary::open(&library)?)?;
            }
            self.compiled.push((i64::from(*size), package));
        }
        Ok(self)
    }

    pub(crate) fn run(mut self, rx: Receiver<Cmd>) {
        for cmd in rx {
            let out = match cmd {
                Cmd::Data(it) => Feed::of(it, &self.ctx).map(|f| {
                    self.feed = f;
                    None
                }),
                Cmd::Synthetic => self.synthetic().map(|_| None),
                Cmd::Step(step) => self.step(step).map(Some),
                Cmd::Eval(it, valid) => match self.head {
                    Some(_) => self.eval_head(it, &valid),
                    None => self.eval(it, &valid),
                }
                .map(|s| Some(Msg::Eval(s))),
                Cmd::GetState { full } => self.state(full).map(|s| Some(Msg::State(Box::new(s)))),
                Cmd::SetState(s) => self.set_state(&s).map(|_| None),
                Cmd::Checksum => self.checksum().map(|c| Some(Msg::Checksum(c))),
                Cmd::Flush => self.flush().map(|_| Some(Msg::Flushed)),
                Cmd::Stop => break,
            };
            let msg = match out {
                Ok(Some(m)) => m,
                Ok(None) => continue,
                Err(e) => {
                    self.shared.abort();
                    Msg::Failed(self.index, e)
                }
            };
            if self.tx.send(msg).is_err() {
                break;
            }
        }
    }

    fn synthetic(&mut self) -> Result<()> {
        let c = &self.cfg;
        let batch = c.synthetic_batch.ok_or_else(|| TrainError::Replica {
            replica: self.index,
            message: "synthetic data asked of a table without a synthetic batch size".into(),
        })?;
        self.feed = Feed::synthetic(
            self.ctx.device(),
            batch,
            c.image_size,
            c.classes,
            &self.norm,
        )?;
        Ok(())
    }

    fn next_batch(&mut self) -> Result<StepBatch> {
        let _span = ddl_trace::span_args("data_wait", "train", &[("replica", self.index as i64)]);
        self.feed
            .next(&self.ctx, &self.norm)
            .ok_or_else(|| TrainError::Replica {
                replica: self.index,
                message: "loader queue ended early".into(),
            })?
    }

    fn step(&mut self, cmd: StepCmd) -> Result<Msg> {
        let start = Instant::now();
        let batch = self.next_batch()?;
        let data_wait = start.elapsed();
        let (loss_read, forward_wait) = self.forward_backward(&batch, cmd)?;
        let (reduce_wait, skipped) = if self.cfg.comm_order == CommOrder::Fifo {
            self.update(cmd)?
        } else {
            // The buckets are applied at the next forward pass, stage by stage; the head's
            // slice (`head_parallel`) is never reduced: now.
            self.pending = Some(cmd);
            self.update_head(cmd)?;
            (Duration::ZERO, false)
        };
        // The loss was copied right after forward: by now it has usually arrived.
        loss_read.synchronize()?;
        let loss = self.loss_host.f_double_value(&[0])?;
        Ok(Msg::StepDone(ReplicaStep {
            loss,
            images: batch.len(),
            data_wait,
            forward_wait,
            compute: start
                .elapsed()
                .saturating_sub(data_wait + reduce_wait + forward_wait),
            bad: batch.skipped,
            skipped,
        }))
    }

    /// Forward and backward of `batch`, handing every bucket over as soon as the backward of
    /// its stage is done; returns the event after the loss was copied to the host and the time
    /// the forward pass waited for the previous step's buckets (`priority` order).
    fn forward_backward(&mut self, batch: &StepBatch, cmd: StepCmd) -> Result<(Event, Duration)> {
        let start = Instant::now();
        let (loss_read, waited) = if self.compiled.is_empty() {
            let (pass, waited) = self.forward(batch, cmd)?;
            (self.backward(pass, batch, cmd)?, waited)
        } else {
            (self.compiled_step(batch, cmd)?, Duration::ZERO)
        };
        ddl_trace::record(
            "forward_backward",
            "train",
            start,
            start.elapsed(),
            &[("replica", self.index as i64), ("step", self.step_of(cmd))],
        );
        Ok((loss_read, waited))
    }

    /// The forward pass of `batch` in step `cmd`, each stage after the updates still pending
    /// for it (`priority` order); returns the pass and the time it waited for those.
    fn forward<'b>(
        &mut self,
        batch: &'b StepBatch,
        cmd: StepCmd,
    ) -> Result<(model::StagedPass<'b>, Duration)> {
        // `priority`: each stage's buckets are zeroed once their pending update is applied.
        if self.cfg.comm_order == CommOrder::Fifo {
            let _ = self.flat.grads.f_zero_()?;
        }
        if let Some(head) = self.head.as_mut() {
            head.zero_grad()?;
        }
        let (device, precision) = (self.ctx.device(), self.cfg.precision);
        let model = Rc::clone(&self.model);
        let mode = model::PassMode {
            train: true,
            staged: self.cfg.overlap == Overlap::Backward,
            classify: self.head.is_none(),
        };
        let mut waited = Duration::ZERO;
        let mut forward_span = None;
        let pass = {
            // Each stage's forward span runs from its hook to the next one's.
            let mut before = |s: usize| -> Result<()> {
                drop(forward_span.take());
                waited += self.before_stage(s, cmd)?;
                forward_span = Some(self.span("forward", s, cmd));
                Ok(())
            };
            let (net, images) = (model.as_ref().as_ref(), &batch.images);
            autocast(device, precision, || {
                model::StagedPass::run(net, images, mode, &mut before)
            })?
        };
        drop(forward_span);
        self.pending = None;
        Ok((pass, waited))
    }

    /// The loss of `pass` and its backward, stage by stage, last first, handing over the
    /// buckets each stage completes; returns the event after the loss was copied to the host.
    fn backward(
        &mut self,
        mut pass: model::StagedPass,
        batch: &StepBatch,
        cmd: StepCmd,
    ) -> Result<Event> {
        let replica = self.index as i64;
        let backward_span = |s: usize| {
            ddl_trace::span_args(
                "backward",
                "train",
                &[("stage", s as i64), ("replica", replica)],
            )
        };
        let stages = pass.stages();
        let loss = if self.head.is_some() {
            let (seed, loss) = self.head_step(pass.output(), &batch.labels, cmd)?;
            let _span = backward_span(stages - 1);
            crate::device::backward(&[pass.output()], &[&seed])?;
            loss
        } else {
            let loss = pass
                .output()
                .f_to_kind(Kind::Float)?
                .f_cross_entropy_loss::<Tensor>(
                    &batch.labels,
                    None,
                    Reduction::Mean,
                    -100,
                    self.cfg.label_smoothing,
                )?;
            let scaled = if cmd.loss_scale != 1.0 {
                loss.f_mul_scalar(cmd.loss_scale)?
            } else {
                loss.shallow_clone()
            };
            let _span = backward_span(stages - 1);
            scaled.f_backward()?;
            loss
        };
        self.ctx
            .copy(&mut self.loss_host, &loss.f_detach()?.f_reshape([1])?)?;
        let loss_read = self.ctx.record()?;
        // Backward of the earlier stages, last first; after each, hand over the buckets it
        // completed.
        let mut handed = 0;
        for s in (0..stages).rev() {
            if s + 1 < stages {
                let _span = backward_span(s);
                pass.backward_stage(s)?;
            }
            let ready = self.layout.buckets[handed..]
                .iter()
                .take_while(|b| b.stage >= s)
                .count();
            for k in handed..handed + ready {
                self.hand_off(k, cmd)?;
            }
            handed += ready;
        }
        Ok(loss_read)
    }

    /// Forward and backward of `batch` by the compiled step of its image size, which writes
    /// the whole flat gradient, then every bucket handed over; returns the event after the
    /// loss was copied to the host.
    fn compiled_step(&mut self, batch: &StepBatch, cmd: StepCmd) -> Result<Event> {
        let size = batch.images.size().last().copied().unwrap_or(0);
        let replica = self.index;
        let (_, package) = self
            .compiled
            .iter_mut()
            .find(|(s, _)| *s == size)
            .ok_or_else(|| TrainError::Replica {
                replica,
                message: format!("no compiled step for {size} px images"),
            })?;
        let loss = {
            let _span =
                ddl_trace::span_args("compiled_step", "train", &[("replica", replica as i64)]);
            let captured = package.captured_at();
            let loss = package.run(&batch.images, &batch.labels, cmd.loss_scale)?;
            let verbose = self.cfg.compile.as_ref().is_some_and(|c| c.verbose);
            if let (None, Some(at), true, 0) =
                (captured, package.captured_at(), verbose, self.cfg.rank)
            {
                eprint_line(&format!(
                    "cuda graphs: replica {replica} replays its {size} px compiled step from a \
                     CUDA graph, captured at its run {at}"
                ));
            }
            loss
        };
        self.ctx.copy(&mut self.loss_host, &loss.f_reshape([1])?)?;
        let loss_read = self.ctx.record()?;
        for k in 0..self.layout.buckets.len() {
            self.hand_off(k, cmd)?;
        }
        Ok(loss_read)
    }

    /// The step `cmd` is, counted from 0 (bucket sequence numbers advance by the bucket count
    /// per step).
    fn step_of(&self, cmd: StepCmd) -> i64 {
        (cmd.seq / self.layout.buckets.len().max(1) as u64) as i64
    }

    /// A span of this replica about stage `s` of step `cmd`.
    fn span(&self, name: &'static str, s: usize, cmd: StepCmd) -> ddl_trace::SpanGuard {
        ddl_trace::span_args(
            name,
            "train",
            &[
                ("stage", s as i64),
                ("replica", self.index as i64),
                ("step", self.step_of(cmd)),
            ],
        )
    }

    /// `priority` order, before stage `s` of step `cmd` runs forward: the updates of the
    /// stage's buckets pending from the previous step, each once it is reduced, then their
    /// gradients zeroed for this step's backward (not before: the replicas summing into
    /// replica 0 may still read them until the bucket is reduced). Returns the time it waited.
    fn before_stage(&mut self, s: usize, cmd: StepCmd) -> Result<Duration> {
        if self.cfg.comm_order == CommOrder::Fifo {
            return Ok(Duration::ZERO);
        }
        let mut waited = Duration::ZERO;
        let layout = self.layout.clone();
        for (k, bucket) in layout.buckets.iter().enumerate() {
            if bucket.stage != s {
                continue;
            }
            if let Some(pending) = self.pending {
                let t0 = Instant::now();
                let q = pending.seq + k as u64 + 1;
                let (_, reduced) = {
                    let _span = self.span("forward_wait", s, cmd);
                    self.shared.wait_reduced(self.index, k, q)?
                };
                waited += t0.elapsed();
                self.update_bucket(k, q, &reduced, pending)?;
            }
            let _guard = tch::no_grad_guard();
            let _ = range(&self.flat.grads, bucket)?.f_zero_()?;
        }
        Ok(waited)
    }

    /// Applies every update still pending (`priority` order) before the weights are read.
    fn flush(&mut self) -> Result<()> {
        let Some(pending) = self.pending else {
            return Ok(());
        };
        for s in 0..self.model.stages() {
            self.before_stage(s, pending)?;
        }
        self.pending = None;
        Ok(())
    }

    /// Sums bucket `k` of the replicas' gradients along the tree (replica r adds the sum of
    /// r + 2^l at level l); replica 0 then hands the node sum on ([`Replica::reduce`]).
    fn hand_off(&self, k: usize, cmd: StepCmd) -> Result<()> {
        let _guard = tch::no_grad_guard();
        let bucket = &self.layout.buckets[k];
        let _span = ddl_trace::span_args(
            "intra_node_sum",
            "reduce",
            &[("bucket", k as i64), ("replica", self.index as i64)],
        );
        let q = cmd.seq + k as u64 + 1;
        let mut sum = range(&self.grads[self.index], bucket)?;
        let n = self.grads.len();
        let mut level = 1;
        while level < n {
            if self.index % (2 * level) != 0 {
                self.shared.publish(self.index, q, self.ctx.record()?);
                return Ok(());
            }
            let partner = self.index + level;
            if partner < n {
                let summed = self.shared.wait_progress(self.index, partner, q)?;
                self.ctx.wait(&summed)?;
                let theirs = range(&self.grads[partner], bucket)?;
                let _ = sum.f_add_(&theirs.f_to_device(self.ctx.device())?)?;
            }
            level *= 2;
        }
        self.reduce(k, q, &mut sum, cmd)
    }

    /// Replica 0, with the node sum of bucket `k`: with several ranks it goes to the bucket's
    /// host buffer (copied on the side stream) and to the communication thread; with one rank
    /// it is the reduced sum, averaged here, on the device.
    fn reduce(&self, k: usize, q: u64, sum: &mut Tensor, cmd: StepCmd) -> Result<()> {
        if self.shared.host.is_empty() {
            let _ = sum.f_mul_scalar_(f32_factor(cmd.inv))?;
            let last = k + 1 == self.layout.buckets.len();
            let skip =
                self.cfg.precision == Precision::Fp16 && last && !all_finite(&self.flat.grads)?;
            self.shared.publish_reduced(k, q, skip, self.ctx.record()?);
            return Ok(());
        }
        self.ctx.wait_side(&self.ctx.record()?)?;
        let copied = {
            let host = self.shared.host[k]
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            self.ctx
                .copy_side(&mut host.tensor().shallow_clone(), sum)?
        };
        self.tx
            .send(Msg::Ready(k, copied))
            .map_err(|_| TrainError::Replica {
                replica: 0,
                message: "communication thread is gone".into(),
            })
    }

    /// Applies each bucket once it is reduced; returns the time spent waiting for that, and
    /// whether the step was skipped (fp16 overflow).
    fn update(&mut self, cmd: StepCmd) -> Result<(Duration, bool)> {
        let k_count = self.layout.buckets.len();
        // fp16: no update before every bucket is known to be finite.
        let defer = self.cfg.precision == Precision::Fp16;
        let mut waited = Duration::ZERO;
        for k in 0..k_count {
            let q = cmd.seq + k as u64 + 1;
            let t0 = Instant::now();
            let (skip, reduced) = {
                let _span = ddl_trace::span_args(
                    "wait_reduced",
                    "reduce",
                    &[("bucket", k as i64), ("replica", self.index as i64)],
                );
                let last = k_count - 1;
                match defer {
                    true => self
                        .shared
                        .wait_reduced(self.index, last, cmd.seq + k_count as u64)?,
                    false => self.shared.wait_reduced(self.index, k, q)?,
                }
            };
            waited += t0.elapsed();
            if skip {
                return Ok((waited, true));
            }
            self.update_bucket(k, q, &reduced, cmd)?;
        }
        self.update_head(cmd)?;
        Ok((waited, false))
    }

    /// The SGD update of bucket `k` of step `cmd` (reduction `q`, complete).
    fn update_bucket(&mut self, k: usize, q: u64, reduced: &Event, cmd: StepCmd) -> Result<()> {
        let _guard = tch::no_grad_guard();
        self.sgd.set_lr(cmd.lr)?;
        let _span = ddl_trace::span_args(
            "sgd_update",
            "train",
            &[("bucket", k as i64), ("replica", self.index as i64)],
        );
        let bucket = &self.layout.buckets[k];
        let mut grads = range(&self.flat.grads, bucket)?;
        self.fetch_reduced(k, q, &mut grads, reduced, cmd)?;
        let mut params = range(&self.flat.params, bucket)?;
        let mut momentum = range(&self.flat.momentum, bucket)?;
        self.sgd
            .update(&mut params, &mut grads, &mut momentum, bucket.decayed)
    }

    /// The update of this replica's slice of the head (`head_parallel`), whose gradient is
    /// its own and never reduced.
    fn update_head(&mut self, cmd: StepCmd) -> Result<()> {
        let Some(head) = self.head.as_mut() else {
            return Ok(());
        };
        let _guard = tch::no_grad_guard();
        self.sgd.set_lr(cmd.lr)?;
        let _span = ddl_trace::span_args("head_update", "train", &[("replica", self.index as i64)]);
        head.update(&self.sgd, f32_factor(1.0 / self.cfg.global_replicas as f64))
    }

    /// Puts the reduced, averaged gradient of bucket `k` into this replica's range `grads`:
    /// from the host buffer (several ranks), or from replica 0 (one rank; replica 0 itself
    /// holds it already and waits until every other replica has copied it before its update
    /// overwrites it).
    fn fetch_reduced(
        &self,
        k: usize,
        q: u64,
        grads: &mut Tensor,
        reduced: &Event,
        cmd: StepCmd,
    ) -> Result<()> {
        if !self.shared.host.is_empty() {
            {
                let host = self.shared.host[k]
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                self.ctx.copy(grads, host.tensor())?;
            }
            let _ = grads.f_mul_scalar_(f32_factor(cmd.inv))?;
        } else if self.index == 0 {
            for copied in self.shared.wait_copied(q)? {
                self.ctx.wait(&copied)?;
            }
        } else {
            self.ctx.wait(reduced)?;
            self.ctx
                .copy(grads, &range(&self.grads[0], &self.layout.buckets[k])?)?;
            self.shared
                .publish_copied(self.index, q, self.ctx.record()?);
        }
        Ok(())
    }

    fn eval(&mut self, it: BatchIter, valid: &ValidCount) -> Result<EvalSums> {
        let _guard = tch::no_grad_guard();
        let device = self.ctx.device();
        // Loss, top-1 and top-5 sums, kept on the device: read once at the end.
        let mut sums_dev = Tensor::f_zeros([3], (Kind::Double, device))?;
        let mut sums = EvalSums::default();
        for batch in it {
            let Some((tensors, n)) = self.eval_inputs(batch?, valid, &mut sums)? else {
                continue;
            };
            let images = tensors.images().f_narrow(0, 0, n)?;
            let labels = tensors.labels().f_narrow(0, 0, n)?;
            let logits = autocast(device, self.cfg.precision, || {
                self.model.forward_t(&images, false)
            })
            .f_to_kind(Kind::Float)?;
            let loss =
                logits.f_cross_entropy_loss::<Tensor>(&labels, None, Reduction::Sum, -100, 0.0)?;
            let k = self.cfg.classes.min(5);
            let (_, top) = logits.f_topk(k, -1, true, true)?;
            let hits = top.f_eq_tensor(&labels.f_unsqueeze(1)?)?;
            let top1 = hits.f_narrow(1, 0, 1)?.f_sum(Kind::Float)?;
            let top5 = hits.f_sum(Kind::Float)?;
            let part = Tensor::f_stack(&[loss, top1, top5], 0)?.f_to_kind(Kind::Double)?;
            let _ = sums_dev.f_add_(&part)?;
            sums.count += n as f64;
        }
        Ok(read_sums(&sums_dev, sums))
    }

    /// An evaluation batch on the device and how many of its leading images count: the first
    /// `valid(batch)` slots are this rank's records (the rest is padding), bad ones among them
    /// were left out (counted in `sums`) and the kept ones come first. `None` when none count.
    pub(crate) fn eval_inputs(
        &self,
        batch: ddl_loader::pipeline::Batch,
        valid: &ValidCount,
        sums: &mut EvalSums,
    ) -> Result<Option<(BatchTensors, i64)>> {
        let real = valid(&batch);
        let dropped = batch.dropped_among_first(real);
        sums.skipped += dropped as f64;
        let n = (real - dropped).min(batch.len()) as i64;
        if n == 0 {
            return Ok(None);
        }
        let tensors = BatchTensors::new(batch, self.ctx.device(), &self.norm)?;
        Ok(Some((tensors, n)))
    }

    fn state(&self, full: bool) -> Result<ReplicaState> {
        let _guard = tch::no_grad_guard();
        let all = |ts: &[Tensor]| -> Result<Vec<Vec<f32>>> {
            if full {
                ts.iter().map(tensor_to_vec).collect()
            } else {
                Ok(Vec::new())
            }
        };
        let momentum = self
            .flat
            .momentum_views(&self.layout, self.cfg.channels_last)?;
        let (head, head_momentum) = match &self.head {
            Some(h) => h.state(&self.layout.left_out)?,
            None => Default::default(),
        };
        Ok(ReplicaState {
            params: all(&self.params)?,
            momentum: all(&momentum)?,
            buffers: self
                .buffers
                .iter()
                .map(tensor_to_vec)
                .collect::<Result<_>>()?,
            head,
            head_momentum,
        })
    }

    fn set_state(&mut self, s: &ReplicaState) -> Result<()> {
        let _guard = tch::no_grad_guard();
        let check = |what: &str, got: usize, want: usize| {
            if got != want {
                Err(TrainError::Replica {
                    replica: self.index,
                    message: format!("state has {got} {what}, model has {want}"),
                })
            } else {
                Ok(())
            }
        };
        check("parameters", s.params.len(), self.params.len())?;
        check("momentum buffers", s.momentum.len(), self.params.len())?;
        check("buffers", s.buffers.len(), self.buffers.len())?;
        if let Some(head) = &self.head {
            let whole = &self.layout.left_out;
            check("head parameters", s.head.len(), whole.len())?;
            check("head momentum buffers", s.head_momentum.len(), whole.len())?;
            head.set_state(whole, &s.head, &s.head_momentum)
                .map_err(|message| TrainError::Replica {
                    replica: self.index,
                    message,
                })?;
        }
        let momentum = self
            .flat
            .momentum_views(&self.layout, self.cfg.channels_last)?;
        for (t, v) in self
            .params
            .iter()
            .chain(momentum.iter())
            .chain(self.buffers.iter())
            .zip(
                s.params
                    .iter()
                    .chain(s.momentum.iter())
                    .chain(s.buffers.iter()),
            )
        {
            if t.numel() != v.len() {
                return Err(TrainError::Replica {
                    replica: self.index,
                    message: format!(
                        "state tensor of {} elements for a tensor of {}",
                        v.len(),
                        t.numel()
                    ),
                });
            }
            from_host(&mut t.shallow_clone(), v)?;
        }
        self.ctx.sync();
        Ok(())
    }

    /// crc32c of the parameters' f32 little-endian bytes, in parameter order, read in chunks:
    /// whole copies of a 21k-class head (179 MB as floats, again as bytes) would raise the
    /// run's peak memory by two head copies.
    fn checksum(&self) -> Result<u32> {
        const CHUNK: i64 = 1 << 20;
        let mut crc = 0u32;
        let mut floats = Vec::new();
        let mut bytes = Vec::new();
        for p in &self.params {
            let flat = p.f_detach()?.f_to_kind(Kind::Float)?.f_flatten(0, -1)?;
            let n = flat.numel() as i64;
            let mut start = 0;
            while start < n {
                let len = CHUNK.min(n - start);
                floats.resize(len as usize, 0f32);
                to_host(&flat.f_narrow(0, start, len)?, &mut floats)?;
                bytes.clear();
                bytes.extend(floats.iter().flat_map(|x| x.to_le_bytes()));
                crc = crc32c::crc32c_append(crc, &bytes);
                start += len;
            }
        }
        Ok(crc)
    }
}

/// `sums` with the loss, top-1 and top-5 sums an evaluation kept on the device (read here,
/// once).
pub(crate) fn read_sums(on_device: &Tensor, mut sums: EvalSums) -> EvalSums {
    let [loss, top1, top5] = [0, 1, 2].map(|i| on_device.double_value(&[i]));
    sums.loss = loss;
    sums.top1 = top1;
    sums.top5 = top5;
    sums
}

/// Whether every element of `t` is finite (reads one flag from the device).
fn all_finite(t: &Tensor) -> Result<bool> {
    Ok(t.f_isfinite()?.f_all()?.int64_value(&[]) != 0)
}
