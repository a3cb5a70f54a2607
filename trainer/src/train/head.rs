//! The whole model of a run whose head is split over the replicas (`head_parallel`): every
//! replica's slice gathered into the whole head for checkpoints, `export` and
//! `dump_weights`, and a whole head cut into the replicas' slices for `resume` and
//! `init_from`. A data-parallel run's whole model is replica 0's.
//!
//! The head's rows are classes and each replica holds consecutive ones, so the whole head is
//! the slices one after the other in replica order (rank by rank): a checkpoint of a split
//! head holds every slice as it is, at its place in the whole `fc.weight` and `fc.bias`.

use crate::error::{Result, TrainError};
use crate::table::{HeadSplit, ReplicaState};

use super::checkpoints::{bytes_to_f32s, f32s_to_bytes};
use super::run::Run;

/// The whole head's weights and momentum, each parameter in
/// [`crate::table::Layout::left_out`] order.
type Head = (Vec<Vec<f32>>, Vec<Vec<f32>>);

/// This rank's replicas' head slices as bytes: for each replica, its weights then its
/// momentum, each parameter in [`crate::table::Layout::left_out`] order.
fn slices(states: &[ReplicaState]) -> Vec<u8> {
    let values: Vec<f32> = states
        .iter()
        .flat_map(|s| s.head.iter().chain(&s.head_momentum).flatten().copied())
        .collect();
    f32s_to_bytes(&values)
}

/// Replica 0's weights, momentum and BatchNorm buffers, every parameter in the model's
/// creation order ([`crate::table::Layout::model_params`]), the head whole.
pub(super) struct Whole {
    pub(super) params: Vec<Vec<f32>>,
    pub(super) momentum: Vec<Vec<f32>>,
    pub(super) buffers: Vec<Vec<f32>>,
}

impl Run<'_> {
    /// Every local replica's state and, on rank 0, the whole model (collective: under
    /// `head_parallel` rank 0 gathers every rank's slices).
    pub(super) fn whole(&mut self) -> Result<(Vec<ReplicaState>, Option<Whole>)> {
        self.table.flush(&self.comm)?;
        let mut states = self.table.states()?;
        let head = match self.table.head_split() {
            Some(split) => self.gather_head(&states, &split)?,
            None => Some((Vec::new(), Vec::new())),
        };
        // Moved, not copied: with a 21k-class head the weights and momentum are 700 MB.
        let whole = head.map(|(head, head_momentum)| Whole {
            params: std::mem::take(&mut states[0].params)
                .into_iter()
                .chain(head)
                .collect(),
            momentum: std::mem::take(&mut states[0].momentum)
                .into_iter()
                .chain(head_momentum)
                .collect(),
            buffers: states[0].buffers.clone(),
        });
        Ok((states, whole))
    }

    /// Rank 0: the whole head's weights and momentum (in [`crate::table::Layout::left_out`]
    /// order) from the slices of every replica of every rank; `None` on the other ranks.
    fn gather_head(&self, states: &[ReplicaState], split: &HeadSplit) -> Result<Option<Head>> {
        match self.comm.gather_bytes(slices(states))? {
            Some(all) => Ok(Some(self.assemble(&all, split)?)),
            None => Ok(None),
        }
    }

    /// Every rank: the whole model as the seed drew it (before any step; momentum zero), the
    /// head gathered from every replica of every rank (collective).
    pub(super) fn seeded(&mut self) -> Result<Whole> {
        let mut states = self.table.states()?;
        let (head, head_momentum) = match self.table.head_split() {
            Some(split) => {
                let all = self.comm.allgather_bytes(slices(&states))?;
                self.assemble(&all, &split)?
            }
            None => (Vec::new(), Vec::new()),
        };
        let first = std::mem::take(&mut states[0]);
        Ok(Whole {
            params: first.params.into_iter().chain(head).collect(),
            momentum: first.momentum.into_iter().chain(head_momentum).collect(),
            buffers: first.buffers,
        })
    }

    /// The whole head from every rank's [`slices`], in rank order.
    fn assemble(&self, all: &[Vec<u8>], split: &HeadSplit) -> Result<Head> {
        let whole = &self.table.layout().left_out;
        let classes = split.classes(split.replicas() - 1).end;
        let mut params: Vec<Vec<f32>> = whole.iter().map(|p| Vec::with_capacity(p.numel)).collect();
        let mut momentum = params.clone();
        let replicas = self.table.replicas();
        for (rank, bytes) in all.iter().enumerate() {
            let values = bytes_to_f32s(bytes);
            let mut at = 0;
            for g in rank * replicas..(rank + 1) * replicas {
                let rows = split.classes(g).len();
                for into in [&mut params, &mut momentum] {
                    for (p, out) in whole.iter().zip(into.iter_mut()) {
                        let n = rows * p.numel / classes;
                        let slice = values.get(at..at + n).ok_or_else(|| {
                            TrainError::FromRoot(format!(
                                "rank {rank} sent {} head values, fewer than its slices hold",
                                values.len()
                            ))
                        })?;
                        out.extend_from_slice(slice);
                        at += n;
                    }
                }
            }
        }
        Ok((params, momentum))
    }

    /// Loads `params` and `momentum` (every parameter in creation order, the head whole) and
    /// `buffers(r)` into every local replica `r`, each taking its slice of the head.
    pub(super) fn set_whole(
        &self,
        params: &[Vec<f32>],
        momentum: &[Vec<f32>],
        buffers: &dyn Fn(usize) -> Result<Vec<Vec<f32>>>,
    ) -> Result<()> {
        let backbone = self.table.layout().params.len();
        let split = self.table.head_split();
        let replicas = self.table.replicas();
        for r in 0..replicas {
            let g = self.table.rank() * replicas + r;
            let slices = |values: &[Vec<f32>]| -> Vec<Vec<f32>> {
                match &split {
                    Some(s) => values[backbone..].iter().map(|v| s.slice(g, v)).collect(),
                    None => Vec::new(),
                }
            };
            let keep = if split.is_some() {
                backbone
            } else {
                params.len()
            };
            self.table.set_state(
                r,
                ReplicaState {
                    params: params[..keep].to_vec(),
                    momentum: momentum[..keep].to_vec(),
                    buffers: buffers(r)?,
                    head: slices(params),
                    head_momentum: slices(momentum),
                },
            )?;
        }
        Ok(())
    }
}
