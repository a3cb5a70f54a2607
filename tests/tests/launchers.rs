//! ddl-train under a launcher that is not MPI's: torchrun starting two copies must not give two
//! independent one-rank trainings on the whole data set (exit 0, every image seen twice); each
//! copy refuses, naming the world size and the MPI command that runs the job.

use std::process::Command;

use ddl_tests::{bin, printed, run, scratch, venv_bin};

#[test]
fn ddl_train_under_torchrun_is_refused_naming_mpirun() {
    // Without --log-dir, torchrun's agent keeps its logs in a /tmp/torchelastic_* folder that
    // nothing removes.
    let logs = scratch("torchrun-logs");
    let out = run(Command::new(venv_bin("torchrun"))
        .args(["--nproc_per_node", "2", "--no-python", "--log-dir"])
        .arg(logs.path())
        .arg(bin("ddl-train"))
        .args([
            "--synthetic-data",
            "--model",
            "resnet_small",
            "--classes",
            "3",
        ])
        .args(["--image-size", "16", "--batch", "2", "--devices", "cpu:1"])
        .args(["--max-steps", "200"])
        .env("OMP_NUM_THREADS", "1"));
    let text = printed(&out);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("WORLD_SIZE=2"), "{text}");
    assert!(text.contains("mpirun -np 2 ddl-train"), "{text}");
    // Refused before training: no step ran.
    assert!(!text.contains("epoch"), "{text}");
}
