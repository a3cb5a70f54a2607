//! Data-parallel exactness: 2 ranks x 2 CPU replicas at per-replica batch B follow the same
//! trajectory as 1 rank x 1 replica at batch 4B on the same samples (BatchNorm-free model),
//! for every allreduce algorithm of ddl-comm, with ranks simulated by threads over the
//! in-process transport, with NCHW and channels-last storage.

use crate::common;

use std::path::Path;

use ddl_trainer::config::Overlap;

const B: usize = 4;
const STEPS: u64 = 4;

fn reference(data: &Path, dir: &Path) -> Vec<(String, Vec<f32>)> {
    let mut cfg = common::config(data, "convnet_nobn", 4 * B, "cpu:1");
    cfg.max_steps = Some(STEPS);
    cfg.dump_weights = Some(dir.join("ref.bin"));
    common::run_ranks(&cfg, 1);
    ddl_testkit::read_dump(&dir.join("ref.bin"))
}

fn assert_close(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)], what: &str) {
    assert_eq!(a.len(), b.len());
    for ((na, va), (nb, vb)) in a.iter().zip(b) {
        assert_eq!(na, nb);
        let scale = vb.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
        let diff = va
            .iter()
            .zip(vb)
            .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(
            diff <= 1e-5 * scale,
            "{what}: {na} differs by {diff} (scale {scale})"
        );
    }
}

#[test]
fn two_ranks_two_replicas_match_one_big_batch() {
    let tmp = ddl_testkit::scratch("exact");
    let dir = tmp.path();
    let data = dir.join("data");
    common::make_dataset(&data, 4, 24, 0, 2, 0, 36);
    let want = reference(&data, dir);
    // The initial weights must have moved, or the comparison proves nothing.
    let init = {
        let mut cfg = common::config(&data, "convnet_nobn", 4 * B, "cpu:1");
        cfg.max_steps = Some(0);
        cfg.dump_weights = Some(dir.join("init.bin"));
        common::run_ranks(&cfg, 1);
        ddl_testkit::read_dump(&dir.join("init.bin"))
    };
    let moved = init.iter().zip(&want).any(|((_, a), (_, b))| a != b);
    assert!(moved, "the reference run did not change the weights");

    for algo in ["ring", "rhd", "multicolor", "multiring", "auto"] {
        for overlap in [Overlap::Off, Overlap::Pipeline, Overlap::Backward] {
            let mut cfg = common::config(&data, "convnet_nobn", B, "cpu:2");
            cfg.max_steps = Some(STEPS);
            cfg.allreduce = algo.parse().unwrap();
            cfg.overlap = Some(overlap);
            // Small buckets so that the overlapped path really has several.
            cfg.bucket_mb = 0.001;
            cfg.check_replicas = true;
            let out = dir.join(format!("{algo}-{}.bin", overlap.name()));
            cfg.dump_weights = Some(out.clone());
            common::run_ranks(&cfg, 2);
            assert_close(
                &ddl_testkit::read_dump(&out),
                &want,
                &format!("{algo} overlap={}", overlap.name()),
            );
        }
    }
    // Channels-last storage (images, activations, conv weights) changes the kernels, not the
    // maths.
    let mut cfg = common::config(&data, "convnet_nobn", B, "cpu:2");
    cfg.max_steps = Some(STEPS);
    cfg.channels_last = true;
    cfg.overlap = Some(Overlap::Backward);
    cfg.check_replicas = true;
    let out = dir.join("channels-last.bin");
    cfg.dump_weights = Some(out.clone());
    common::run_ranks(&cfg, 2);
    assert_close(&ddl_testkit::read_dump(&out), &want, "channels-last");
    // The comparison is sensitive: half the global batch (other samples) does not match.
    let mut cfg = common::config(&data, "convnet_nobn", B / 2, "cpu:2");
    cfg.max_steps = Some(STEPS);
    cfg.base_lr = 0.4 * 2.0;
    let out = dir.join("half.bin");
    cfg.dump_weights = Some(out.clone());
    common::run_ranks(&cfg, 2);
    let got = ddl_testkit::read_dump(&out);
    let differs = std::panic::catch_unwind(|| assert_close(&got, &want, "half batch")).is_err();
    assert!(differs, "a run on different samples matched the reference");
}
