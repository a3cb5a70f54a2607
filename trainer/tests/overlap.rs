//! `--overlap backward` (staged backward, buckets reduced while earlier stages are still in
//! backward) changes when gradients are reduced, not what they are: on CPU its weights are
//! bitwise those of `off` and `pipeline`, with BatchNorm and 2 ranks x 2 replicas (ranks
//! simulated by threads; tests/tests/overlap_mpi.rs does the same under mpirun). The staged
//! backward itself is checked per model in model.rs. So does `--comm-order priority` (buckets
//! cut into chunks and reduced lowest stage first, each stage's update applied just before the
//! next forward runs it), where cutting a bucket cannot change a sum: at 2 ranks (two-term
//! sums commute) and with shm at 3 (every element summed in rank order).

use crate::common;

use ddl_comm::{Algorithm, CommOrder};
use ddl_trainer::config::Overlap;
use ddl_trainer::config::{auto_overlap, comm_order, Precision};

#[test]
fn auto_overlaps_backward_on_gpus_and_across_nodes() {
    assert_eq!(auto_overlap(false, 1, 2, false), Overlap::Off);
    assert_eq!(auto_overlap(false, 2, 2, false), Overlap::Backward);
    assert_eq!(auto_overlap(true, 1, 2, false), Overlap::Backward);
    // One replica in the whole job has nothing to reduce: no staged backward.
    assert_eq!(auto_overlap(true, 1, 1, false), Overlap::Off);
    // A compiled step is one graph: its buckets are pipelined after it.
    assert_eq!(auto_overlap(true, 1, 2, true), Overlap::Pipeline);
    assert_eq!(auto_overlap(false, 2, 2, true), Overlap::Pipeline);
    assert_eq!(auto_overlap(false, 1, 2, true), Overlap::Off);
}

#[test]
fn backward_overlap_gives_the_same_weights() {
    let tmp = ddl_testkit::scratch("overlap");
    let dir = tmp.path();
    let data = dir.join("data");
    // 4 classes x 16 = 64 records; batch 4 x 2 replicas x 2 ranks = 16 per step.
    common::make_dataset(&data, 4, 16, 0, 2, 0, 36);
    let run = |model: &str, overlap: Overlap| {
        let mut cfg = common::config(&data, model, 4, "cpu:2");
        cfg.max_steps = Some(3);
        cfg.overlap = Some(overlap);
        cfg.comm_order = CommOrder::Fifo;
        cfg.bucket_mb = 0.01;
        cfg.check_replicas = true;
        let out = dir.join(format!("{model}-{}.bin", overlap.name()));
        cfg.dump_weights = Some(out.clone());
        common::run_ranks(&cfg, 2);
        std::fs::read(out).unwrap()
    };
    for model in ["resnet_small", "convnet_nobn"] {
        let off = run(model, Overlap::Off);
        assert!(
            off == run(model, Overlap::Pipeline),
            "{model}: pipeline != off"
        );
        assert!(
            off == run(model, Overlap::Backward),
            "{model}: backward != off"
        );
    }
}

/// 1 KiB chunks: every bucket of the test models but the smallest is cut.
const CHUNKED: CommOrder = CommOrder::Priority { chunk_bytes: 1024 };

/// The weights after `steps` steps of `model` on `ranks` ranks x 2 replicas with `--overlap
/// backward` in `order`, reduced with `algorithm` (a run that evaluates and checkpoints at
/// the end of each of its 2 epochs, so that the pending updates are flushed between steps).
fn backward_weights(
    dir: &std::path::Path,
    model: &str,
    ranks: usize,
    order: CommOrder,
    algorithm: Algorithm,
) -> Vec<u8> {
    let data = dir.join(format!("data-{ranks}"));
    if !data.exists() {
        // 4 classes x 12 = 48 records: 2 steps per epoch of batch 4 x 2 replicas x 3 ranks,
        // 3 of 2 ranks.
        common::make_dataset(&data, 4, 12, 2, 2, 1, 36);
    }
    let mut cfg = common::config(&data, model, 4, "cpu:2");
    cfg.epochs = 2;
    cfg.eval = true;
    cfg.overlap = Some(Overlap::Backward);
    cfg.comm_order = order;
    cfg.allreduce = algorithm.clone();
    cfg.bucket_mb = 0.01;
    cfg.check_replicas = true;
    cfg.checkpoint_dir = Some(dir.join(format!("ckpt-{model}-{ranks}-{order}-{algorithm}")));
    let out = dir.join(format!("{model}-{ranks}-{order}-{algorithm}.bin"));
    cfg.dump_weights = Some(out.clone());
    common::run_ranks(&cfg, ranks);
    std::fs::read(out).unwrap()
}

#[test]
fn priority_order_gives_the_weights_of_fifo() {
    let tmp = ddl_testkit::scratch("overlap-priority");
    for (model, ranks, algorithm) in [
        ("resnet_small", 2, Algorithm::Ring),
        ("convnet_nobn", 2, Algorithm::Rhd),
        ("resnet_small", 3, Algorithm::SHM),
    ] {
        let fifo = backward_weights(tmp.path(), model, ranks, CommOrder::Fifo, algorithm.clone());
        let priority = backward_weights(tmp.path(), model, ranks, CHUNKED, algorithm.clone());
        assert!(!fifo.is_empty());
        assert!(
            fifo == priority,
            "{model}, {ranks} ranks, {algorithm}: priority != fifo"
        );
    }
}

#[test]
fn priority_falls_back_to_fifo_where_it_cannot_run() {
    let p = CommOrder::PRIORITY;
    let fp32 = Precision::Fp32;
    assert_eq!(comm_order(p, Overlap::Backward, 2, fp32), (p, None));
    assert_eq!(
        comm_order(p, Overlap::Backward, 2, Precision::Bf16),
        (p, None)
    );
    for (overlap, ranks, precision, why) in [
        (Overlap::Off, 2, fp32, "--overlap backward"),
        (Overlap::Pipeline, 2, fp32, "--overlap backward"),
        (Overlap::Backward, 1, fp32, "several ranks"),
        (Overlap::Backward, 2, Precision::Fp16, "fp16"),
    ] {
        let (order, reason) = comm_order(p, overlap, ranks, precision);
        assert_eq!(order, CommOrder::Fifo);
        assert!(reason.as_deref().unwrap().contains(why), "{reason:?}");
    }
    assert_eq!(
        comm_order(CommOrder::Fifo, Overlap::Backward, 2, fp32),
        (CommOrder::Fifo, None)
    );
}
