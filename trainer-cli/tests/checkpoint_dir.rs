//! A `ddl-train` process holds its checkpoint directory from before it looks into it to its
//! end: of two runs started together exactly one writes. `--resume` of a directory that does
//! not exist, or holds no checkpoint, says so even with `--quiet`.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use ddl_trainer::checkpoint::{self, Checkpoint};

use crate::common::{scratch_with_data, TRAIN};

/// `ddl-train` on `data` into `ckpt` for `steps` steps, with `seed`, quiet.
fn train_command(data: &Path, ckpt: &Path, steps: u32, seed: u64) -> Command {
    let mut c = Command::new(TRAIN);
    c.args(["--data", data.to_str().unwrap()])
        .args(["--checkpoint-dir", ckpt.to_str().unwrap()])
        .args([
            "--model",
            "convnet_nobn",
            "--batch",
            "2",
            "--image-size",
            "32",
        ])
        .args([
            "--devices",
            "cpu:1",
            "--workers",
            "1",
            "--no-eval",
            "--quiet",
        ])
        .args(["--checkpoint-every", "1", "--keep-checkpoints", "3"])
        .args([
            "--max-steps",
            &steps.to_string(),
            "--seed",
            &seed.to_string(),
        ]);
    c
}

/// A finished process's stderr, as text.
fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn of_two_runs_started_together_exactly_one_writes() {
    let (tmp, data) = scratch_with_data("ckrace");
    let dir = tmp.path();
    for trial in 0..4 {
        let ckpt = dir.join(format!("ckpt-{trial}"));
        let start = |seed| {
            train_command(&data, &ckpt, 6, seed)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (a, b) = (start(0), start(1));
        let pids = [a.id(), b.id()];
        let outs = [a.wait_with_output().unwrap(), b.wait_with_output().unwrap()];
        let won: Vec<usize> = (0..2).filter(|&i| outs[i].status.success()).collect();
        let all = format!("{}\n{}", stderr(&outs[0]), stderr(&outs[1]));
        assert_eq!(
            won.len(),
            1,
            "trial {trial}: exactly one run may write:\n{all}"
        );
        let (winner, loser) = (won[0], 1 - won[0]);
        // Refused by the lock while the winner ran, naming it, or (had the winner ended
        // before the loser looked) by the winner's checkpoints.
        let refusal = stderr(&outs[loser]);
        assert!(
            refusal.contains(&format!("pid {} on host", pids[winner]))
                || refusal.contains("checkpoint file(s)"),
            "trial {trial}: {refusal}"
        );
        let left = checkpoint::occupants(&ckpt).unwrap();
        assert!(!left.is_empty(), "trial {trial}: no checkpoint");
        for path in left {
            let ck = Checkpoint::read(&path).unwrap();
            assert_eq!(
                ck.meta.flags["seed"],
                winner as u64,
                "trial {trial}: {}",
                path.display()
            );
        }
    }
}

#[test]
fn resume_from_a_missing_directory_says_so_even_when_quiet() {
    let (tmp, data) = scratch_with_data("ckmissing");
    let dir = tmp.path();
    let ckpt = dir.join("mistyped");
    let out = train_command(&data, &ckpt, 1, 0)
        .arg("--resume")
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&format!("resume: {} did not exist", ckpt.display()))
            && err.contains("starting from scratch"),
        "{err}"
    );
    // An existing directory without checkpoints says so too.
    let empty = dir.join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = train_command(&data, &empty, 1, 0)
        .arg("--resume")
        .output()
        .unwrap();
    assert!(
        stderr(&out).contains("holds no checkpoint"),
        "{}",
        stderr(&out)
    );
}
