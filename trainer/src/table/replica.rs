//! One replica: its thread, model, optimizer and data, and its part of every step.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use tch::nn;
use tch::{Device, Kind, Reduction, Tensor};

use crate::config::{Overlap, Precision};
use crate::device::{set_cuda_autocast_dtype, sync_device};
use crate::error::{Result, TrainError};
use crate::model;
use crate::optim::Sgd;

use super::buckets::Layout;
use super::messages::{Cmd, Msg, Shared};
use super::tensor_io::{from_host, tensor_to_vec, to_host, BatchTensors};
use super::{BatchIter, EvalSums, ReplicaState, TableConfig, ValidCount};

pub(crate) struct Replica {
    pub(crate) index: usize,
    pub(crate) device: Device,
    pub(crate) cfg: Arc<TableConfig>,
    pub(crate) layout: Arc<Layout>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) _vs: nn::VarStore,
    pub(crate) model: model::Model,
    pub(crate) params: Vec<Tensor>,
    pub(crate) buffers: Vec<Tensor>,
    pub(crate) sgd: Sgd,
    /// Flat gradient buffers of every replica (shallow handles), own one at `index`.
    pub(crate) flats: Vec<Tensor>,
    pub(crate) data: Option<BatchIter>,
    pub(crate) tx: Sender<Msg>,
}

impl Replica {
    pub(crate) fn run(mut self, rx: Receiver<Cmd>) {
        if self.device.is_cuda() {
            set_cuda_autocast_dtype(self.cfg.precision);
        }
        for cmd in rx {
            let out = match cmd {
                Cmd::Data(it) => {
                    self.data = Some(it);
                    Ok(None)
                }
                Cmd::Step {
                    lr,
                    seq,
                    loss_scale,
                } => self.step(lr, seq, loss_scale).map(Some),
                Cmd::Eval(it, valid) => self.eval(it, &valid).map(|s| Some(Msg::Eval(s))),
                Cmd::GetState { full } => self.state(full).map(|s| Some(Msg::State(Box::new(s)))),
                Cmd::SetState(s) => self.set_state(&s).map(|_| None),
                Cmd::Checksum => self.checksum().map(|c| Some(Msg::Checksum(c))),
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

    fn step(&mut self, lr: f64, seq: u64, loss_scale: f64) -> Result<Msg> {
        let wait_start = Instant::now();
        let it = self.data.as_mut().ok_or_else(|| TrainError::Replica {
            replica: self.index,
            message: "step requested before any data source was attached".into(),
        })?;
        let batch = it.next().ok_or_else(|| TrainError::Replica {
            replica: self.index,
            message: "loader queue ended early".into(),
        })??;
        let data_wait = wait_start.elapsed();
        let replica = self.index as i64;
        ddl_trace::record(
            "data_wait",
            "train",
            wait_start,
            data_wait,
            &[("replica", replica)],
        );
        let compute_start = Instant::now();
        let tensors = BatchTensors::new(batch, self.device, self.cfg.channels_last)?;
        for p in self.params.iter_mut() {
            p.zero_grad();
        }
        let amp = self.cfg.precision != Precision::Fp32 && self.device.is_cuda();
        let staged = self.cfg.overlap == Overlap::Backward;
        let mut pass = tch::autocast(amp, || {
            model::StagedPass::forward(self.model.as_ref(), tensors.images(), true, staged)
        })?;
        let logits = pass.logits();
        let loss = logits
            .f_to_kind(Kind::Float)?
            .f_cross_entropy_loss::<Tensor>(
                tensors.labels(),
                None,
                Reduction::Mean,
                -100,
                self.cfg.label_smoothing,
            )?;
        let loss_value = loss.f_double_value(&[])?;
        let scaled = if loss_scale != 1.0 {
            loss.f_mul_scalar(loss_scale)?
        } else {
            loss
        };
        let stages = pass.stages();
        let backward_span = |s: usize| {
            ddl_trace::span_args(
                "backward",
                "train",
                &[("stage", s as i64), ("replica", replica)],
            )
        };
        {
            let _span = backward_span(stages - 1);
            scaled.f_backward()?;
        }
        drop(scaled);
        // Backward of the earlier stages, last first; after each, hand over the buckets it
        // completed.
        let mut handed = 0;
        let mut handing = Duration::ZERO;
        for s in (0..stages).rev() {
            if s + 1 < stages {
                let _span = backward_span(s);
                pass.backward_stage(s)?;
            }
            let ready = self.layout.buckets[handed..]
                .iter()
                .take_while(|b| b.stage >= s)
                .count();
            if ready > 0 {
                // A hand-off waits for the device anyway: count that wait as compute.
                sync_device(self.device);
                let t0 = Instant::now();
                for k in handed..handed + ready {
                    self.hand_off(k, seq)?;
                }
                handed += ready;
                handing += t0.elapsed();
            }
        }
        drop(pass);
        sync_device(self.device);
        let compute = compute_start.elapsed().saturating_sub(handing);
        ddl_trace::record(
            "forward_backward",
            "train",
            compute_start,
            compute_start.elapsed(),
            &[("replica", replica)],
        );
        let images_n = tensors.batch().len();
        let bad = tensors.batch().skipped;
        drop(tensors);

        let _guard = tch::no_grad_guard();
        let k_count = self.layout.buckets.len() as u64;
        // Apply each bucket once it is reduced across ranks.
        let defer = self.cfg.precision == Precision::Fp16;
        for (k, bucket) in self.layout.buckets.iter().enumerate() {
            let wait_for = if defer {
                seq + k_count
            } else {
                seq + k as u64 + 1
            };
            let skip = {
                let _span = ddl_trace::span_args(
                    "wait_reduced",
                    "reduce",
                    &[("bucket", k as i64), ("replica", replica)],
                );
                self.shared.wait_reduced(self.index, wait_for)?
            };
            if skip {
                break;
            }
            let _span = ddl_trace::span_args(
                "sgd_update",
                "train",
                &[("bucket", k as i64), ("replica", replica)],
            );
            let mut flat =
                self.flats[self.index].f_narrow(0, bucket.start as i64, bucket.len as i64)?;
            {
                let host = self.shared.host[k]
                    .read()
                    .unwrap_or_else(|e| e.into_inner());
                from_host(&mut flat, &host)?;
            }
            for &i in &bucket.params {
                let p = &self.layout.params[i];
                let mut g = flat
                    .f_narrow(0, (p.offset - bucket.start) as i64, p.numel as i64)?
                    .f_view(p.shape.as_slice())?;
                self.sgd.update(i, &mut self.params[i], &mut g, lr)?;
            }
        }
        sync_device(self.device);
        Ok(Msg::StepDone {
            loss: loss_value,
            images: images_n,
            data_wait,
            compute,
            bad,
        })
    }

    /// Copies the gradients of bucket `k` into this replica's flat buffer, sums it along the
    /// tree and, on replica 0, copies the node sum to host and hands it to the communication
    /// thread.
    fn hand_off(&self, k: usize, seq: u64) -> Result<()> {
        let _guard = tch::no_grad_guard();
        let bucket = &self.layout.buckets[k];
        let _span = ddl_trace::span_args(
            "intra_node_sum",
            "reduce",
            &[("bucket", k as i64), ("replica", self.index as i64)],
        );
        let q = seq + k as u64 + 1;
        let mut flat =
            self.flats[self.index].f_narrow(0, bucket.start as i64, bucket.len as i64)?;
        for &i in &bucket.params {
            let p = &self.layout.params[i];
            let mut dst = flat.f_narrow(0, (p.offset - bucket.start) as i64, p.numel as i64)?;
            let g = self.params[i].grad();
            if g.defined() {
                dst.f_view(p.shape.as_slice())?.f_copy_(&g)?;
            } else {
                let _ = dst.f_zero_()?;
            }
        }
        let n = self.flats.len();
        let mut level = 1;
        while level < n {
            if self.index % (2 * level) != 0 {
                sync_device(self.device);
                self.shared.publish(self.index, q);
                return Ok(());
            }
            let partner = self.index + level;
            if partner < n {
                self.shared.wait_progress(self.index, partner, q)?;
                let theirs =
                    self.flats[partner].f_narrow(0, bucket.start as i64, bucket.len as i64)?;
                let _ = flat.f_add_(&theirs.f_to_device(self.device)?)?;
            }
            level *= 2;
        }
        // Replica 0: the node sum of this bucket goes to the communication thread.
        let mut host = self.shared.host[k]
            .write()
            .unwrap_or_else(|e| e.into_inner());
        to_host(&flat, &mut host)?;
        drop(host);
        self.tx
            .send(Msg::Ready(k))
            .map_err(|_| TrainError::Replica {
                replica: 0,
                message: "communication thread is gone".into(),
            })
    }

    fn eval(&mut self, it: BatchIter, valid: &ValidCount) -> Result<EvalSums> {
        let _guard = tch::no_grad_guard();
        let mut sums = EvalSums::default();
        let amp = self.cfg.precision != Precision::Fp32 && self.device.is_cuda();
        for batch in it {
            let batch = batch?;
            // The first `real` slots are this rank's records (the rest is padding); bad ones
            // among them were left out and the kept ones come first.
            let real = valid(&batch);
            let dropped = batch.dropped_among_first(real);
            sums.skipped += dropped as f64;
            let n = (real - dropped).min(batch.len()) as i64;
            if n == 0 {
                continue;
            }
            let tensors = BatchTensors::new(batch, self.device, self.cfg.channels_last)?;
            let images = tensors.images().f_narrow(0, 0, n)?;
            let labels = tensors.labels().f_narrow(0, 0, n)?;
            let logits = tch::autocast(amp, || self.model.forward_t(&images, false))
                .f_to_kind(Kind::Float)?;
            let loss =
                logits.f_cross_entropy_loss::<Tensor>(&labels, None, Reduction::Sum, -100, 0.0)?;
            let k = self.cfg.classes.min(5);
            let (_, top) = logits.f_topk(k, -1, true, true)?;
            let hits = top.f_eq_tensor(&labels.f_unsqueeze(1)?)?;
            sums.loss += loss.f_double_value(&[])?;
            sums.top1 += hits
                .f_narrow(1, 0, 1)?
                .f_sum(Kind::Float)?
                .f_double_value(&[])?;
            sums.top5 += hits.f_sum(Kind::Float)?.f_double_value(&[])?;
            sums.count += n as f64;
        }
        Ok(sums)
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
        Ok(ReplicaState {
            params: all(&self.params)?,
            momentum: all(self.sgd.momentum())?,
            buffers: self
                .buffers
                .iter()
                .map(tensor_to_vec)
                .collect::<Result<_>>()?,
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
        let momentum: Vec<Tensor> = self
            .sgd
            .momentum()
            .iter()
            .map(|t| t.shallow_clone())
            .collect();
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
        sync_device(self.device);
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
