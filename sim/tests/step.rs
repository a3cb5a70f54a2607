//! What a step sends, against the bytes the ranks count when they run its collectives.

use std::sync::Arc;

use ddl_comm::{
    Algorithm, Allreducer, CostModel, Counted, Parts, Reduce, ShardAlgorithm, Sharded, Topology,
    Transport,
};
use ddl_sim::step::{HeadExchange, Step};

use crate::common::on_ranks;

#[test]
fn counted_bytes_are_what_step_predicts_for_the_ring() {
    // A head-parallel step of 4 ranks, 6 samples of 5 features each, 1000 gradient floats,
    // as the trainer runs it: allgather, max, sums, reduce-scatter, gradient.
    let (p, batch, features, gradient) = (4usize, 6usize, 5usize, 1000usize);
    let sent = on_ranks(p, |t| {
        let counted = Arc::new(Counted::new(t));
        let t: Arc<dyn Transport> = counted.clone();
        let topo = Topology::flat(p);
        let s = Sharded::new(t.clone(), ShardAlgorithm::Ring, topo, CostModel::default())
            .expect("sharded");
        let ar = Allreducer::new(t, Algorithm::Ring, topo).expect("allreducer");
        let rows = Parts::even(batch, p).scaled(features);
        let mut x = vec![1.0f32; batch * features];
        s.all_gather(&mut x, &rows).expect("allgather");
        s.allreduce_max(&mut vec![1.0f32; batch]).expect("max");
        ar.allreduce_f32(&mut vec![1.0f32; 3 * batch], false)
            .expect("sums");
        s.reduce_scatter(&mut x, &rows, Reduce::Sum)
            .expect("reduce-scatter");
        ar.allreduce_f32(&mut vec![1.0f32; gradient], false)
            .expect("gradient");
        counted.bytes_sent() as f64
    });
    let step = Step {
        gradient_bytes: 4 * gradient,
        head: Some(HeadExchange {
            features,
            global_batch: batch,
        }),
    };
    let mean = sent.iter().sum::<f64>() / p as f64;
    assert_eq!(mean, step.ring_bytes_sent(p), "per rank: {sent:?}");
}
