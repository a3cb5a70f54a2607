//! The cost model's formulas of the allgather and reduce-scatter, and `auto`'s choice between
//! them.

use super::ops::ShardedOp;
use super::ShardAlgorithm;
use crate::cost::{CostModel, DEFAULT_SHM_SYNC};
use crate::topology::Topology;

impl CostModel {
    /// Predicted seconds of one allgather or reduce-scatter (`op`) of a `bytes` buffer (f32, all
    /// parts together, cut evenly) with `algorithm` over `topo`. The ring: `p - 1` lock-step
    /// rounds of one part per rank (combined on arrival for the reduce-scatter); `shm` (one
    /// node only): two synchronisations per chunk, each rank copying the whole buffer once
    /// (its part in and the others' out, or every part in), the reduce-scatter's owner combining
    /// its part over all ranks; `auto`: the best of [`CostModel::choose_sharded`]'s candidates.
    pub fn predict_sharded(
        &self,
        op: ShardedOp,
        algorithm: &ShardAlgorithm,
        bytes: usize,
        topo: Topology,
    ) -> f64 {
        let p = topo.ranks();
        if p <= 1 || bytes == 0 {
            return 0.0;
        }
        let n = bytes as f64;
        let scatter = op == ShardedOp::ReduceScatter;
        match algorithm {
            ShardAlgorithm::Ring => {
                let round = self.pairs_round(topo, n, n / p as f64, scatter, |r| (r + 1) % p);
                (p - 1) as f64 * round.time()
            }
            ShardAlgorithm::Shm { .. } if topo.nodes > 1 => f64::INFINITY,
            ShardAlgorithm::Shm { chunk_bytes } => {
                let sync = if self.shm_sync > 0.0 {
                    self.shm_sync
                } else {
                    DEFAULT_SHM_SYNC
                };
                let chunks = (n / (*chunk_bytes).max(1) as f64).ceil();
                let combine = if scatter { n * self.intra.gamma } else { 0.0 };
                2.0 * sync * chunks + n * self.copy_per_byte() + combine
            }
            ShardAlgorithm::Auto => {
                let best = self.choose_sharded(op, bytes, topo, true);
                self.predict_sharded(op, &best, bytes, topo)
            }
        }
    }

    /// What `auto` runs for an allgather or reduce-scatter of `bytes` over `topo`: the ring, or
    /// `shm` where all ranks share one node's memory (`shared_memory`) and it is predicted
    /// faster.
    pub fn choose_sharded(
        &self,
        op: ShardedOp,
        bytes: usize,
        topo: Topology,
        shared_memory: bool,
    ) -> ShardAlgorithm {
        let ring = ShardAlgorithm::Ring;
        if !(shared_memory && topo.nodes == 1) {
            return ring;
        }
        let shm = ShardAlgorithm::SHM;
        if self.predict_sharded(op, &shm, bytes, topo)
            < self.predict_sharded(op, &ring, bytes, topo)
        {
            shm
        } else {
            ring
        }
    }
}
