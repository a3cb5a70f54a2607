//! The collectives of one training step across the ranks, data-parallel or with the classifier
//! head split by class over the replicas of the job (ddl-train's head-parallel mode, the hybrid of
//! Das et al. 2016 and Intel's MLSL): the calls, the bytes a rank sends with the ring
//! algorithms, and their time under a [`CostModel`], as `ddl-plan` and `ddl-bench sim` print
//! them.
//!
//! Data-parallel, a step allreduces the gradient of every parameter, the head's included.
//! Head-parallel, it allreduces the backbone's gradient only; instead, the features of the
//! global batch are all-gathered, the softmax's per-sample maximum is allreduced with `max` (a
//! reduce-scatter and an allgather), its per-sample sum of exponentials, target logit and sum
//! of logits are allreduced ([`LOSS_SUMS`] floats per sample), and the gradient of the features
//! is reduce-scattered back. With the ring that is `4 x features + 4 + 4 x LOSS_SUMS` bytes per
//! sample where the head's gradient is `4 x (features + 1) x classes` bytes, so the split sends
//! less below a global batch of about the class count ([`crossover_batch`]).

use ddl_comm::allreduce::signature::CALL_CHECK_WORD;
use ddl_comm::{Algorithm, CostModel, ShardAlgorithm, ShardedOp, Topology};

/// Floats summed over the ranks per sample of the global batch by the head-parallel loss: the
/// sum of exponentials, the target logit and the sum of the logits.
pub const LOSS_SUMS: usize = 3;

/// One collective call of a step, with the bytes of its whole buffer (f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// Summed over the ranks.
    Allreduce(usize),
    /// Every rank's part to every rank.
    AllGather(usize),
    /// Each part combined onto its rank.
    ReduceScatter(usize),
}

/// The head-parallel exchange of a step: what replaces the head's gradient allreduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadExchange {
    /// Features the head reads (2048 for the Bottleneck ResNets).
    pub features: usize,
    /// Images of the global batch.
    pub global_batch: usize,
}

/// What one step exchanges across the ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// Bytes of gradient allreduced (every bucket; data-parallel, the head's too).
    pub gradient_bytes: usize,
    /// Head-parallel: the exchange of features that replaces the head's gradient.
    pub head: Option<HeadExchange>,
}

impl Step {
    /// The step's calls, in the order a step runs them.
    pub fn calls(&self) -> Vec<Call> {
        let mut calls = Vec::new();
        if let Some(h) = self.head {
            let per_sample = 4 * h.global_batch;
            let features = per_sample * h.features;
            calls.extend([
                Call::AllGather(features),
                Call::ReduceScatter(per_sample),
                Call::AllGather(per_sample),
                Call::Allreduce(LOSS_SUMS * per_sample),
                Call::ReduceScatter(features),
            ]);
        }
        calls.push(Call::Allreduce(self.gradient_bytes));
        calls
    }

    /// Bytes one of `ranks` ranks sends per step with the ring algorithms, averaged over the
    /// ranks: `2 (p - 1) / p` of an allreduce's buffer and its call check's word to each other
    /// rank, `(p - 1) / p` of an allgather's or a reduce-scatter's.
    pub fn ring_bytes_sent(&self, ranks: usize) -> f64 {
        if ranks <= 1 {
            return 0.0;
        }
        let share = (ranks - 1) as f64 / ranks as f64;
        self.calls()
            .iter()
            .map(|c| match *c {
                Call::Allreduce(b) => {
                    2.0 * share * b as f64 + (ranks - 1) as f64 * CALL_CHECK_WORD as f64
                }
                Call::AllGather(b) | Call::ReduceScatter(b) => share * b as f64,
            })
            .sum()
    }

    /// Predicted seconds of the step's collectives over `topo`: the allreduces with `allreduce`,
    /// the allgathers and reduce-scatters with `sharded`.
    pub fn predict(
        &self,
        model: &CostModel,
        allreduce: &Algorithm,
        sharded: &ShardAlgorithm,
        topo: Topology,
    ) -> f64 {
        self.calls()
            .iter()
            .map(|c| match *c {
                Call::Allreduce(b) => model.predict(allreduce, b, topo),
                Call::AllGather(b) => model.predict_sharded(ShardedOp::AllGather, sharded, b, topo),
                Call::ReduceScatter(b) => {
                    model.predict_sharded(ShardedOp::ReduceScatter, sharded, b, topo)
                }
            })
            .sum()
    }
}

/// The global batch at which a head-parallel step sends as many bytes as a data-parallel one
/// with the ring algorithms, whatever the rank count: `(features + 1) x classes` floats of head
/// gradient against `features + 1 + LOSS_SUMS` per sample. Below it the split sends less.
pub fn crossover_batch(features: usize, classes: usize) -> f64 {
    ((features + 1) * classes) as f64 / (features + 1 + LOSS_SUMS) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_split_sends_less_below_the_crossover_and_more_above() {
        let (features, classes, head) = (2048, 21_841, 2049 * 21_841 * 4);
        let backbone = 23_508_032 * 4;
        let crossover = crossover_batch(features, classes);
        assert!((21_000.0..21_841.0).contains(&crossover), "{crossover}");
        for (batch, hybrid_wins) in [(256, true), (8192, true), (32_768, false)] {
            let dp = Step {
                gradient_bytes: backbone + head,
                head: None,
            };
            let hp = Step {
                gradient_bytes: backbone,
                head: Some(HeadExchange {
                    features,
                    global_batch: batch,
                }),
            };
            let (a, b) = (dp.ring_bytes_sent(8), hp.ring_bytes_sent(8));
            assert_eq!(b < a, hybrid_wins, "batch {batch}: {a} vs {b}");
        }
        // At the crossover the two are equal.
        let at = |g: usize| Step {
            gradient_bytes: 0,
            head: Some(HeadExchange {
                features,
                global_batch: g,
            }),
        };
        let dp_head = Step {
            gradient_bytes: head,
            head: None,
        };
        // Against the same calls with empty buffers: the call checks' words cancel.
        let dp_empty = Step {
            gradient_bytes: 0,
            head: None,
        };
        let per_sample = at(1).ring_bytes_sent(4) - at(0).ring_bytes_sent(4);
        let ratio = (dp_head.ring_bytes_sent(4) - dp_empty.ring_bytes_sent(4)) / per_sample;
        assert!((ratio - crossover).abs() < 1e-6, "{ratio} vs {crossover}");
    }
}
