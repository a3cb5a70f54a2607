//! The cost model's view of the registry's algorithms: each one's predicted time (its own
//! formula, in its file, where `calibrate` did not time it) and the choice among `auto`'s
//! candidates.

use crate::algorithm::{auto_candidates, Algorithm};
use crate::cost::CostModel;
use crate::topology::Topology;

impl CostModel {
    /// Predicted seconds of one allreduce of `bytes` (f32) with `algorithm` over `topo`.
    ///
    /// Measured where `calibrate` timed the algorithm in this layout
    /// ([`MeasuredCurve`](crate::MeasuredCurve)). Otherwise each algorithm is modelled as the
    /// sequence of lock-step rounds it runs (the pipeline segments of multiring and the chunk
    /// schedule of multicolor included): a round costs its latency, the larger of its
    /// node-local transfer time (busiest rank) and its node link time (busiest link, the
    /// chunks of all ranks of the node that cross it in that round), then the additions;
    /// `Mpi` as the rounds of the algorithm Open MPI 4.1 picks. `Auto` is the best prediction
    /// among [`auto_candidates`] (`shm` and `mpi` included).
    pub fn predict(&self, algorithm: &Algorithm, bytes: usize, topo: Topology) -> f64 {
        self.predicted(&algorithm.to_string(), bytes, topo, || {
            match algorithm.implement() {
                Some(implementation) => implementation.predict(self, bytes, topo),
                None => self.predict(&self.choose(bytes, topo), bytes, topo),
            }
        })
    }

    /// The algorithm with the smallest predicted time for `bytes` over `topo` among all of
    /// [`auto_candidates`] (`shm` on one node, `mpi`): what `auto` runs under MPI on a node
    /// whose ranks share memory.
    pub fn choose(&self, bytes: usize, topo: Topology) -> Algorithm {
        self.choose_among(bytes, topo, &auto_candidates(topo, true, true))
    }

    /// The one of `candidates` with the smallest predicted time for `bytes` over `topo` (the
    /// first of equals; the ring when there are none).
    pub fn choose_among(
        &self,
        bytes: usize,
        topo: Topology,
        candidates: &[Algorithm],
    ) -> Algorithm {
        let mut best = Algorithm::Ring;
        let mut best_t = f64::INFINITY;
        for a in candidates {
            let t = self.predict(a, bytes, topo);
            if t < best_t {
                best_t = t;
                best = a.clone();
            }
        }
        best
    }
}
