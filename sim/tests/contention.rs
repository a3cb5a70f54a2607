//! The contention of compute and allreduce on shared cores, measured in-process.

use ddl_comm::{Algorithm, Allreducer, Topology};
use ddl_sim::contention::{measure, Contention};

use crate::common::on_ranks;

#[test]
fn contention_is_measured_on_every_rank_and_the_threads_stop() {
    let got = on_ranks(2, |t| {
        let ar = Allreducer::new(t.clone(), Algorithm::Ring, Topology::flat(2)).unwrap();
        measure(&*t, [&ar, &ar], 1 << 20, 3, 1, false, 1).unwrap()
    });
    let c = got[0];
    assert_eq!(c.compute_threads, 1);
    assert!(c.measured());
    // Two ranks and two compute threads on this machine's cores: each is a real ratio of
    // timed work, never zero, infinite or NaN.
    for s in [c.comm_slowdown, c.compute_slowdown, c.round_slowdown] {
        assert!(s.is_finite() && s > 0.0, "{c:?}");
    }
    assert!(!Contention::SEPARATE.measured());
}
