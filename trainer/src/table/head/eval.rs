//! Evaluation with the head split over the replicas: replica 0 of every rank computes the
//! features of its rank's images, every replica of the job scores its classes for all of them,
//! and each sample's loss and top-k hits come from exchanged sums (see [`super`]).

use tch::{Kind, Tensor};

use crate::device::autocast;
use crate::error::Result;

use super::super::replica::{read_sums, Replica};
use super::super::{BatchIter, EvalSums, ValidCount};
use super::request::Op;

impl Replica {
    /// Evaluates the images of `it` (replica 0's; the other replicas get none) with every
    /// replica of the job: rounds until no rank has a batch left, each gathering the features
    /// of every rank's valid images. Returns this replica's sums (zero but on replica 0).
    pub(crate) fn eval_head(&mut self, it: BatchIter, valid: &ValidCount) -> Result<EvalSums> {
        let _guard = tch::no_grad_guard();
        let device = self.ctx.device();
        let features = self.features()?;
        let classes = self.cfg.classes;
        let k = classes.min(5) as f64;
        let mut sums_dev = Tensor::f_zeros([3], (Kind::Double, device))?;
        let mut sums = EvalSums::default();
        let mut it = it;
        loop {
            let batch = match self.index {
                0 => it.next().transpose()?,
                _ => None,
            };
            let had = batch.is_some();
            let mut rows = Tensor::f_zeros([0, features as i64 + 1], (Kind::Float, device))?;
            if let Some(batch) = batch {
                if let Some((tensors, n)) = self.eval_inputs(batch, valid, &mut sums)? {
                    let images = tensors.images().f_narrow(0, 0, n)?;
                    let labels = tensors.labels().f_narrow(0, 0, n)?;
                    let model = self.model.as_ref().as_ref();
                    let f = autocast(self.ctx.device(), self.cfg.precision, || {
                        crate::model::features_t(model, &images, false)
                    });
                    rows = Tensor::f_cat(
                        &[
                            f.f_to_kind(Kind::Float)?,
                            labels.f_to_kind(Kind::Float)?.f_unsqueeze(1)?,
                        ],
                        1,
                    )?;
                }
            }
            let mine = rows.size()[0] as usize;
            let gathered = self.exchanged(Op::GatherCounted, &rows, features + 1, had)?;
            if !gathered.more {
                break;
            }
            let n: usize = gathered.rows.iter().sum();
            if n == 0 {
                continue;
            }
            let width = features as i64 + 1;
            let all = self
                .fetch(&gathered, 0..n * (features + 1))?
                .f_view([n as i64, width])?;
            let x = all.f_narrow(1, 0, features as i64)?;
            let classifier = self.model.classifier();
            let logits = autocast(self.ctx.device(), self.cfg.precision, || {
                x.apply(classifier)
            })
            .f_to_kind(Kind::Float)?;
            let targets = all.f_select(1, features as i64)?.f_to_kind(Kind::Int64)?;
            let softmax = self.softmax(&logits, &targets)?;
            // How many of this replica's logits exceed the target's, summed over the replicas:
            // the target's rank among every class.
            let above = logits
                .f_gt_tensor(&softmax.target.f_unsqueeze(1)?)?
                .f_sum_dim_intlist(1, false, Kind::Float)?;
            let ranked = self.exchanged(Op::Sum, &above, n, false)?;
            if mine == 0 {
                continue;
            }
            let first = (gathered.own / (features + 1)) as i64;
            let rank = self.fetch(&ranked, 0..n)?.f_narrow(0, first, mine as i64)?;
            let loss = softmax
                .log_sum_exp()?
                .f_sub(&softmax.target)?
                .f_narrow(0, first, mine as i64)?
                .f_sum(Kind::Double)?;
            let top1 = rank.f_lt(1.0)?.f_sum(Kind::Double)?;
            let topk = rank.f_lt(k)?.f_sum(Kind::Double)?;
            let _ = sums_dev.f_add_(&Tensor::f_stack(&[loss, top1, topk], 0)?)?;
            sums.count += mine as f64;
        }
        Ok(read_sums(&sums_dev, sums))
    }

    /// Features the classifier reads (its weight's second dimension).
    fn features(&self) -> Result<usize> {
        let ws = &self.model.classifier().ws;
        Ok(ws.size().get(1).copied().unwrap_or(0) as usize)
    }
}
