//! The softmax over every class of the head from one replica's logits (its classes, every
//! sample of the global batch): what the replicas exchange so that each can compute the loss
//! and its logits' gradient without the others' logits.

use std::ops::Range;

use tch::{Kind, Tensor};

use crate::error::Result;

use super::super::replica::Replica;
use super::exchange::Exchanged;
use super::request::Op;

/// The softmax of `N` samples over the whole head, seen from one replica.
pub(crate) struct Softmax {
    /// `exp(logit - max)` of this replica's classes, `[N, classes]`.
    exp: Tensor,
    /// Per sample, over every class of the head: the largest logit, the sum of
    /// `exp(logit - max)`, the target's logit and the sum of the logits, `[N]` each.
    max: Tensor,
    sum_exp: Tensor,
    pub(crate) target: Tensor,
    sum_logits: Tensor,
    /// Per sample: whether its target is one of this replica's classes, and its index among
    /// them (0 where it is not), `[N]`.
    mine: Tensor,
    local: Tensor,
}

impl Softmax {
    /// `log(sum(exp(logits)))` over every class, `[N]`.
    pub(crate) fn log_sum_exp(&self) -> Result<Tensor> {
        Ok(self.max.f_add(&self.sum_exp.f_log()?)?)
    }

    /// The cross-entropy of every sample with label smoothing `eps` over `classes` classes, as
    /// torch's `cross_entropy(label_smoothing=eps)`: `(1 - eps) (lse - target) + eps (lse -
    /// mean logit)`, `[N]`.
    pub(crate) fn loss(&self, eps: f64, classes: usize) -> Result<Tensor> {
        let lse = self.log_sum_exp()?;
        let nll = lse.f_sub(&self.target)?;
        if eps == 0.0 {
            return Ok(nll);
        }
        let smooth = lse.f_sub(&self.sum_logits.f_div_scalar(classes as f64)?)?;
        Ok(nll
            .f_mul_scalar(1.0 - eps)?
            .f_add(&smooth.f_mul_scalar(eps)?)?)
    }

    /// The gradient of `scale x` the summed [`Softmax::loss`] with respect to this replica's
    /// logits: `scale (softmax - (1 - eps) onehot - eps / classes)`, `[N, classes]`.
    pub(crate) fn gradient(&self, eps: f64, classes: usize, scale: f64) -> Result<Tensor> {
        let p = self.exp.f_div(&self.sum_exp.f_unsqueeze(1)?)?;
        let onehot = p.f_zeros_like()?.f_scatter(
            1,
            &self.local.f_unsqueeze(1)?,
            &self.mine.f_to_kind(Kind::Float)?.f_unsqueeze(1)?,
        )?;
        let mut g = p.f_sub(&onehot.f_mul_scalar(1.0 - eps)?)?;
        if eps != 0.0 {
            g = g.f_sub_scalar(eps / classes as f64)?;
        }
        Ok(g.f_mul_scalar(scale)?)
    }
}

impl Replica {
    /// The softmax over the whole head of `logits` (`[N, classes of this slice]`, f32) for the
    /// targets `labels` (`[N]`, int64): the maximum exchanged with `max`, then the sums.
    pub(crate) fn softmax(&mut self, logits: &Tensor, labels: &Tensor) -> Result<Softmax> {
        let _guard = tch::no_grad_guard();
        let classes = self.head_classes();
        let n = logits.size()[0] as usize;
        let local_max = logits.f_amax([1], false)?;
        let max = self.exchanged(Op::Max, &local_max, 1, false)?;
        let max = self.fetch(&max, 0..n)?;
        let exp = logits.f_sub(&max.f_unsqueeze(1)?)?.f_exp()?;
        let shifted = labels.f_sub_scalar(classes.start as i64)?;
        let mine = shifted
            .f_ge(0)?
            .f_logical_and(&shifted.f_lt(classes.len() as i64)?)?;
        let local = shifted.f_where_scalarother(&mine, 0)?;
        let at_target = logits
            .f_gather(1, &local.f_unsqueeze(1)?, false)?
            .f_squeeze_dim(1)?;
        let target = at_target.f_where_scalarother(&mine, 0.0)?;
        let sums = Tensor::f_stack(
            &[
                exp.f_sum_dim_intlist(1, false, Kind::Float)?,
                target,
                logits.f_sum_dim_intlist(1, false, Kind::Float)?,
            ],
            0,
        )?;
        let summed = self.exchanged(Op::Sum, &sums, n, false)?;
        let summed = self.fetch(&summed, 0..3 * n)?.f_view([3, n as i64])?;
        Ok(Softmax {
            exp,
            max,
            sum_exp: summed.f_get(0)?,
            target: summed.f_get(1)?,
            sum_logits: summed.f_get(2)?,
            mine,
            local,
        })
    }

    /// Elements `range` of an exchange's result, copied to this replica's device.
    pub(crate) fn fetch(&self, ex: &Exchanged, range: Range<usize>) -> Result<Tensor> {
        let src = ex
            .tensor
            .f_narrow(0, range.start as i64, range.len() as i64)?;
        let mut dst = Tensor::f_empty([range.len() as i64], (Kind::Float, self.ctx.device()))?;
        self.ctx.copy(&mut dst, &src)?;
        Ok(dst)
    }
}
