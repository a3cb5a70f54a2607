//! `--overlap backward` (staged backward, buckets reduced while earlier stages are still in
//! backward) changes when gradients are reduced, not what they are: on CPU its weights are
//! bitwise those of `off` and `pipeline`, with BatchNorm and 2 ranks x 2 replicas (ranks
//! simulated by threads; tests/tests/overlap_mpi.rs does the same under mpirun). The staged
//! backward itself is checked per model in model.rs.

use crate::common;

use ddl_trainer::config::auto_overlap;
use ddl_trainer::config::Overlap;

#[test]
fn auto_overlaps_backward_on_gpus_and_across_nodes() {
    assert_eq!(auto_overlap(false, 1, 2), Overlap::Off);
    assert_eq!(auto_overlap(false, 2, 2), Overlap::Backward);
    assert_eq!(auto_overlap(true, 1, 2), Overlap::Backward);
    // One replica in the whole job has nothing to reduce: no staged backward.
    assert_eq!(auto_overlap(true, 1, 1), Overlap::Off);
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
