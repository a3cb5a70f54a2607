//! The classifier head split by class over every replica of the job (`head_parallel`, the
//! hybrid of Das et al. 2016 and Intel's MLSL): the backbone stays data-parallel, while replica
//! `g` (rank x replicas + replica) holds classes [`HeadSplit::classes`]`(g)` of the head's
//! weight and bias, its own flat weights, gradients and momentum, and updates them alone.
//!
//! A step ([`step`]): the features of every replica (with its labels) are all-gathered, each
//! replica computes the logits of its classes for the whole global batch, and the softmax
//! cross-entropy is computed without gathering the logits (as Megatron's vocab-parallel
//! cross-entropy does): the per-sample maximum is exchanged with `max`, then the sums of the
//! exponentials, the target logit (from the replica owning it) and the sum of the logits (for
//! label smoothing) are summed ([`softmax`]). Each replica's head gradient then comes from
//! every sample of the global batch, so it is never reduced; the gradient of the features is
//! summed over the replicas and each replica keeps its own samples' rows, which seed the
//! backbone's backward. Evaluation ([`eval`]) counts, per sample, the logits above the target
//! on every replica: the target is in the top k when fewer than k are, as merging the
//! replicas' top k would find.

mod eval;
pub(crate) mod exchange;
pub(crate) mod request;
mod softmax;
mod step;

use std::ops::Range;

use ddl_comm::Parts;
use tch::{nn, Device, Tensor};

use crate::error::Result;
use crate::optim::Sgd;
use crate::weights;

use super::buckets::{Layout, ParamInfo};
use super::flat::{range, Flat};
use super::tensor_io::{from_host, tensor_to_vec};

/// How the classes of the head are split over the replicas of the job: replica `g` (rank x
/// replicas per rank + replica) holds classes `classes(g)`, as evenly as possible (the first
/// `classes % replicas` one more).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeadSplit {
    parts: Parts,
}

impl HeadSplit {
    /// `classes` classes over `replicas` replicas.
    pub fn new(classes: usize, replicas: usize) -> HeadSplit {
        HeadSplit {
            parts: Parts::even(classes, replicas),
        }
    }

    /// The classes of replica `g`.
    pub fn classes(&self, g: usize) -> Range<usize> {
        self.parts.range(g)
    }

    /// Replicas the head is split over.
    pub fn replicas(&self) -> usize {
        self.parts.ranks()
    }

    /// The classes of every replica, in replica order.
    pub fn counts(&self) -> Vec<usize> {
        (0..self.replicas()).map(|g| self.parts.count(g)).collect()
    }

    /// Replica `g`'s rows of a head parameter `whole` (a row per class: the weight's rows of
    /// `features` values, the bias's single values).
    pub fn slice(&self, g: usize, whole: &[f32]) -> Vec<f32> {
        let row = whole.len() / self.parts.len().max(1);
        let c = self.classes(g);
        whole[c.start * row..c.end * row].to_vec()
    }
}

/// Values of some parameters and their momentum, each a list in one parameter order.
pub(crate) type WeightsAndMomentum = (Vec<Vec<f32>>, Vec<Vec<f32>>);

/// One replica's slice of the head: its classes, and its parameters as views of flat buffers
/// of their own, updated by the replica alone.
pub(crate) struct HeadSlice {
    /// The classes of the slice.
    pub(crate) classes: Range<usize>,
    /// The slice's parameters (the head's weight and bias, cut to the slice): one bucket.
    layout: Layout,
    flat: Flat,
    params: Vec<Tensor>,
    /// Exchanges this replica has taken part in (the next one's number).
    pub(crate) seq: u64,
}

impl HeadSlice {
    /// The slice of classes `classes` of the head the model built in `vs` holds: its
    /// parameters move into flat buffers of their own on `device`.
    pub(crate) fn adopt(
        vs: &nn::VarStore,
        classes: Range<usize>,
        device: Device,
    ) -> Result<HeadSlice> {
        let layout = Layout::cut(vs, usize::MAX, &|_| 0, &weights::is_head);
        let vars = vs.variables();
        let mut params: Vec<Tensor> = layout
            .params
            .iter()
            .map(|p| vars[&p.name].shallow_clone())
            .collect();
        let flat = Flat::zeros(&layout, device)?;
        flat.adopt(&layout, &mut params, false)?;
        Ok(HeadSlice {
            classes,
            layout,
            flat,
            params,
            seq: 0,
        })
    }

    /// Zeroes the gradients (before a step's backward accumulates into them).
    pub(crate) fn zero_grad(&mut self) -> Result<()> {
        let _ = self.flat.grads.f_zero_()?;
        Ok(())
    }

    /// Applies the step's gradient, scaled by `factor` (1 / the replicas of the job, as the
    /// backbone's summed gradient is).
    pub(crate) fn update(&mut self, sgd: &Sgd, factor: f64) -> Result<()> {
        let _guard = tch::no_grad_guard();
        let bucket = &self.layout.buckets[0];
        let mut grads = range(&self.flat.grads, bucket)?;
        let _ = grads.f_mul_scalar_(factor)?;
        let mut params = range(&self.flat.params, bucket)?;
        let mut momentum = range(&self.flat.momentum, bucket)?;
        sgd.update(&mut params, &mut grads, &mut momentum, bucket.decayed)
    }

    /// The index in this slice of each of `whole` (the table's head parameters, by name).
    fn order(&self, whole: &[ParamInfo]) -> Vec<usize> {
        whole
            .iter()
            .map(|w| {
                self.layout
                    .params
                    .iter()
                    .position(|p| p.name == w.name)
                    .unwrap_or_else(|| panic!("head parameter {} not in the slice", w.name))
            })
            .collect()
    }

    /// Host copies of the slice's weights and momentum, in the order of `whole`.
    pub(crate) fn state(&self, whole: &[ParamInfo]) -> Result<WeightsAndMomentum> {
        let momentum = self.flat.momentum_views(&self.layout, false)?;
        let order = self.order(whole);
        let values = |ts: &[Tensor]| -> Result<Vec<Vec<f32>>> {
            order.iter().map(|&i| tensor_to_vec(&ts[i])).collect()
        };
        Ok((values(&self.params)?, values(&momentum)?))
    }

    /// Loads weights and momentum given in the order of `whole`.
    pub(crate) fn set_state(
        &self,
        whole: &[ParamInfo],
        params: &[Vec<f32>],
        momentum: &[Vec<f32>],
    ) -> std::result::Result<(), String> {
        let order = self.order(whole);
        let views = self
            .flat
            .momentum_views(&self.layout, false)
            .map_err(|e| e.to_string())?;
        let _guard = tch::no_grad_guard();
        for (k, &i) in order.iter().enumerate() {
            for (t, v) in [(&self.params[i], &params[k]), (&views[i], &momentum[k])] {
                if t.numel() != v.len() {
                    return Err(format!(
                        "head slice {} of {} values for {} classes ({} values)",
                        whole[k].name,
                        v.len(),
                        self.classes.len(),
                        t.numel()
                    ));
                }
                from_host(&mut t.shallow_clone(), v).map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }
}
