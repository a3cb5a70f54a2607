//! A `mpirun -np 2 ddl-train` job killed with SIGKILL in the middle of training and resumed with
//! `--resume` ends with weights bitwise identical to an uninterrupted run of the same flags.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ddl_tests::{mpirun_train, run_ok, synth_and_pack, Scratch, SynthSpec};

fn train_cmd(shards: &Path, ckpt: &Path, weights: &Path) -> Command {
    let mut cmd = mpirun_train(2, shards);
    cmd.args([
        "--image-size",
        "32",
        "--batch",
        "8",
        "--devices",
        "cpu:1",
        "--epochs",
        "3",
        "--warmup-epochs",
        "1",
        "--checkpoint-every",
        "3",
        "--keep-checkpoints",
        "2",
        "--no-eval",
    ])
    .arg("--checkpoint-dir")
    .arg(ckpt)
    .arg("--dump-weights")
    .arg(weights);
    cmd
}

fn checkpoints(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .map(|it| {
            it.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    names.retain(|n| n.starts_with("ckpt-") && n.ends_with(".ddlck"));
    names.sort();
    names
}

#[test]
fn killed_job_resumes_to_bitwise_identical_weights() {
    let tmp = Scratch::new("kill-resume");
    let shards = synth_and_pack(
        tmp.path(),
        &SynthSpec {
            classes: 4,
            per_class: 40,
            val_per_class: 2,
            seed: 9,
            shards: 2,
            max_short_side: 48,
        },
    );

    // The reference: the same job, never interrupted.
    let full = tmp.path().join("full.f32");
    run_ok(&mut train_cmd(
        &shards,
        &tmp.path().join("ckpt-full"),
        &full,
    ));

    // The same job, killed (mpirun and both ranks, SIGKILL) once its first checkpoint exists.
    let ckpt = tmp.path().join("ckpt");
    let killed_weights = tmp.path().join("killed.f32");
    let mut child = train_cmd(&shards, &ckpt, &killed_weights)
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn mpirun");
    let deadline = Instant::now() + Duration::from_secs(300);
    while checkpoints(&ckpt).is_empty() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the job ended before its first checkpoint"
        );
        assert!(Instant::now() < deadline, "no checkpoint within 300 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let pgid = child.id().to_string();
    run_ok(Command::new("kill").args(["-KILL", "--", &format!("-{pgid}")]));
    let status = child.wait().unwrap();
    assert!(!status.success(), "the job was not killed");
    assert!(
        !killed_weights.exists(),
        "the killed job ran to the end: nothing was resumed"
    );
    // Leave a half-written checkpoint behind too, as a crash during a write would.
    fs::write(ckpt.join("ckpt-999999999999.ddlck.tmp"), b"partial").unwrap();

    let resumed = tmp.path().join("resumed.f32");
    let mut cmd = train_cmd(&shards, &ckpt, &resumed);
    cmd.arg("--resume");
    run_ok(&mut cmd);

    let a = fs::read(&full).unwrap();
    let b = fs::read(&resumed).unwrap();
    assert!(!a.is_empty());
    assert_eq!(a.len(), b.len(), "weight files differ in size");
    let first_diff = a.iter().zip(&b).position(|(x, y)| x != y);
    assert_eq!(
        first_diff, None,
        "resumed weights differ from the uninterrupted run's"
    );
}
