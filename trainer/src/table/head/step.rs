//! A head-parallel training step of one replica: the features and labels of its batch in, the
//! gradient that seeds the backbone's backward and the replica's loss out.

use tch::{Kind, Tensor};

use crate::config::Setting;
use crate::device::autocast;
use crate::error::{Result, TrainError};

use super::super::messages::StepCmd;
use super::super::replica::Replica;
use super::exchange::{Exchanged, Side};
use super::request::Op;

impl Replica {
    /// The classes of this replica's slice of the head.
    pub(crate) fn head_classes(&self) -> std::ops::Range<usize> {
        self.head.as_ref().map_or(0..0, |h| h.classes.clone())
    }

    /// This replica's part in the next head exchange (see [`super::exchange`]).
    pub(crate) fn exchanged(
        &mut self,
        op: Op,
        t: &Tensor,
        width: usize,
        more: bool,
    ) -> Result<Exchanged> {
        let index = self.index;
        let (Some(head), Some(exchange)) = (self.head.as_mut(), self.shared.head.as_ref()) else {
            return Err(TrainError::Replica {
                replica: index,
                message: format!("a head exchange without {}", Setting::HeadParallel),
            });
        };
        head.seq += 1;
        let side = Side {
            index,
            ctx: &self.ctx,
            tx: &self.tx,
        };
        let shared = &self.shared;
        exchange.exchange(&side, head.seq, op, t, width, more, &|| {
            shared.aborted(index)
        })
    }

    /// The head's part of a training step, from the `features` (`[B, F]`, the backbone's
    /// output) and `labels` of this replica's batch: returns the gradient of the features that
    /// seeds the backbone's backward (scaled by the fp16 loss scale, as a scaled loss's would
    /// be) and this replica's mean loss. The head's gradient is left in the slice's flat
    /// gradients, from every sample of the global batch: the gradient of the mean loss over
    /// each replica's batch, summed over the replicas, as the backbone's bucket sums are.
    pub(crate) fn head_step(
        &mut self,
        features: &Tensor,
        labels: &Tensor,
        cmd: StepCmd,
    ) -> Result<(Tensor, Tensor)> {
        let (b, f) = match features.size().as_slice() {
            &[b, f] => (b as usize, f as usize),
            other => {
                return Err(TrainError::Replica {
                    replica: self.index,
                    message: format!("features of shape {other:?}, expected [batch, features]"),
                })
            }
        };
        if b != self.cfg.batch {
            return Err(TrainError::Replica {
                replica: self.index,
                message: format!(
                    "a batch of {b} images where {} gathers {} from every replica",
                    Setting::HeadParallel,
                    self.cfg.batch
                ),
            });
        }
        let mine = Tensor::f_cat(
            &[
                features.f_detach()?.f_to_kind(Kind::Float)?,
                labels.f_to_kind(Kind::Float)?.f_unsqueeze(1)?,
            ],
            1,
        )?;
        let gathered = self.exchanged(Op::Gather, &mine, f + 1, false)?;
        let n: usize = gathered.rows.iter().sum::<usize>();
        let first = gathered.own / (f + 1) + self.index * b;
        let all = self
            .fetch(&gathered, 0..n * (f + 1))?
            .f_view([n as i64, f as i64 + 1])?;
        let global = all
            .f_narrow(1, 0, f as i64)?
            .f_contiguous()?
            .set_requires_grad(true);
        let targets = all.f_select(1, f as i64)?.f_to_kind(Kind::Int64)?;
        let classifier = self.model.classifier();
        let logits = autocast(self.ctx.device(), self.cfg.precision, || {
            global.apply(classifier)
        })
        .f_to_kind(Kind::Float)?;
        let softmax = self.softmax(&logits.f_detach()?, &targets)?;
        let (eps, classes) = (self.cfg.label_smoothing, self.cfg.classes as usize);
        let dz = softmax.gradient(eps, classes, 1.0 / b as f64)?;
        crate::device::backward(&[&logits], &[&dz])?;
        let mut partial = global.grad();
        if cmd.loss_scale != 1.0 {
            partial = partial.f_mul_scalar(cmd.loss_scale)?;
        }
        let summed = self.exchanged(Op::Scatter, &partial.f_reshape([-1])?, f, false)?;
        let start = summed.own + self.index * b * f;
        let seed = self
            .fetch(&summed, start..start + b * f)?
            .f_view([b as i64, f as i64])?
            .f_to_kind(features.kind())?;
        let loss = softmax
            .loss(eps, classes)?
            .f_narrow(0, first as i64, b as i64)?
            .f_mean(Kind::Float)?;
        Ok((seed, loss))
    }
}
