//! Under `mpirun -np 2` (2 ranks x 2 CPU replicas, BatchNorm model), `ddl-train --overlap
//! backward` (staged backward, each bucket allreduced while earlier stages are still in
//! backward) ends with weights bitwise identical to `--overlap pipeline` and `--overlap off`.

use std::fs;
use std::path::Path;

use ddl_tests::{mpirun_train, run_ok, synth_and_pack, Scratch, SynthSpec};

fn train(shards: &Path, overlap: &str, weights: &Path) -> Vec<u8> {
    let mut cmd = mpirun_train(2, shards);
    cmd.args([
        "--image-size",
        "32",
        "--batch",
        "4",
        "--devices",
        "cpu:2",
        "--max-steps",
        "4",
        "--warmup-epochs",
        "0",
        "--bucket-mb",
        "0.01",
        "--check-replicas",
        "--no-eval",
        "--quiet",
        "--overlap",
        overlap,
    ])
    .arg("--dump-weights")
    .arg(weights);
    run_ok(&mut cmd);
    fs::read(weights).unwrap()
}

#[test]
fn backward_overlap_matches_pipeline_and_off_under_mpirun() {
    let tmp = Scratch::new("overlap-mpi");
    let shards = synth_and_pack(
        tmp.path(),
        &SynthSpec {
            classes: 4,
            per_class: 16,
            val_per_class: 1,
            seed: 5,
            shards: 2,
            max_short_side: 40,
        },
    );
    let off = train(&shards, "off", &tmp.path().join("off.f32"));
    assert!(!off.is_empty());
    for mode in ["pipeline", "backward"] {
        let got = train(&shards, mode, &tmp.path().join(format!("{mode}.f32")));
        assert_eq!(got.len(), off.len(), "{mode}: weight files differ in size");
        let first_diff = got.iter().zip(&off).position(|(x, y)| x != y);
        assert_eq!(
            first_diff, None,
            "{mode}: weights differ from --overlap off"
        );
    }
}
