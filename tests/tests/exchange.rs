//! `mpirun ddl-train --exchange`: three emulated nodes (`--residency rank`) trade records over
//! MPI, on shards that do not divide evenly over them; one of them is killed while its next
//! epoch's records are being exchanged. The job
//! ends, nothing of the half-exchanged epoch is served, and the two survivors resume the
//! checkpoint (`--allow-new-layout`), reading the lost node's shards from the shard
//! directory: the interrupted epoch ends with no record served twice, and every later epoch
//! serves each record once.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use ddl_loader::trace_records::{read, TraceLine};
use ddl_tests::{
    command, mpirun_train, printed, rank_pids, run_ok, scratch, signal, synth_and_pack, Launched,
    SynthSpec,
};
use ddl_trainer::checkpoint;

/// 4 classes x 30 images in 5 shards of 24: 48, 48 and 24 at home on 3 nodes, 40 held by
/// each; 72 and 48 on 2, 60 held by each.
const RECORDS: u64 = 120;
const BATCH: usize = 4;

fn train(np: usize, shards: &Path, run: &Path, ckpt: &Path) -> Command {
    let mut cmd = mpirun_train(np, shards);
    cmd.args([
        "--residency",
        "rank",
        "--exchange",
        "0.5",
        "--image-size",
        "32",
    ])
    .args([
        "--devices",
        "cpu:1",
        "--epochs",
        "3",
        "--no-eval",
        "--comm-timeout",
        "20",
    ])
    .args(["--batch", &BATCH.to_string(), "--checkpoint-every", "2"])
    .arg("--stage")
    .arg(run.join("stage"))
    .arg("--trace-records")
    .arg(run.join("trace.jsonl"))
    .arg("--checkpoint-dir")
    .arg(ckpt);
    cmd
}

fn lines(run: &Path, ranks: usize) -> Vec<TraceLine> {
    (0..ranks)
        .flat_map(|r| read(&run.join(format!("trace.jsonl.{r}"))).unwrap_or_default())
        .collect()
}

/// The arena of epoch 1 of node `node` under `stage`, being written or written.
fn arena_started(stage: &Path, node: usize) -> bool {
    let Ok(entries) = std::fs::read_dir(stage) else {
        return false;
    };
    let suffix = format!("-train-node{node}");
    entries.flatten().any(|e| {
        let dir = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        name.starts_with("ddl-exchange-")
            && name.ends_with(&suffix)
            && (dir.join("epoch-1.ddl").exists() || dir.join("epoch-1.ddl.tmp").exists())
    })
}

#[test]
fn a_node_killed_mid_exchange_stops_the_job_and_two_survivors_finish_its_work() {
    let tmp = scratch("exchange-loss");
    let shards = synth_and_pack(
        tmp.path(),
        &SynthSpec {
            classes: 4,
            per_class: 30,
            val_per_class: 1,
            seed: 3,
            shards: 5,
            max_short_side: 40,
        },
    );
    let (first, ckpt) = (tmp.path().join("first"), tmp.path().join("ckpt"));
    let mut job = Launched::start(&mut train(3, &shards, &first, &ckpt));
    job.wait_for("node 1's exchange and a checkpoint", || {
        arena_started(&first.join("stage"), 1)
            && !checkpoint::list(&ckpt).unwrap_or_default().is_empty()
    });
    let ranks = rank_pids(job.pid());
    assert_eq!(ranks.len(), 3, "ranks of mpirun: {ranks:?}");
    signal(ranks[1].1, libc::SIGKILL);
    let out = job.wait_within(Duration::from_secs(120));
    assert!(!out.status.success(), "{}", printed(&out));
    let before = lines(&first, 3);
    assert!(
        before.iter().all(|l| l.epoch == 0),
        "epoch 1 was served while its exchange was cut short"
    );
    let newest = checkpoint::list(&ckpt).unwrap();
    let resumed_at = checkpoint::step_of(newest.last().unwrap()).unwrap();

    let second = tmp.path().join("second");
    let mut cmd = train(2, &shards, &second, &ckpt);
    cmd.args(["--resume", "--allow-new-layout"]);
    let out = run_ok(&mut cmd);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("are dealt over 2 node(s)"),
        "{}",
        printed(&out)
    );
    let after = lines(&second, 2);
    let mut epoch0: Vec<u64> = before
        .iter()
        .filter(|l| l.step <= resumed_at)
        .chain(after.iter().filter(|l| l.epoch == 0))
        .flat_map(|l| l.ids.clone())
        .collect();
    epoch0.sort_unstable();
    let distinct: BTreeSet<u64> = epoch0.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        epoch0.len(),
        "a record served twice in epoch 0"
    );
    assert!(
        RECORDS - (distinct.len() as u64) < 2 * BATCH as u64,
        "{} served",
        distinct.len()
    );
    for epoch in 1..3 {
        let mut all: Vec<u64> = after
            .iter()
            .filter(|l| l.epoch == epoch)
            .flat_map(|l| l.ids.clone())
            .collect();
        all.sort_unstable();
        assert_eq!(all, (0..RECORDS).collect::<Vec<_>>(), "epoch {epoch}");
    }
}

/// Copies the checkpoint files of `from` into a new directory `to`.
fn copy_checkpoints(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for path in checkpoint::list(from).unwrap() {
        std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
    }
}

#[test]
fn a_resume_onto_more_ranks_than_one_step_of_records_left_finishes() {
    // 2 classes x 20 images in 4 shards: 20 per node on 2 nodes, 5 steps of 2 x 4.
    let tmp = scratch("exchange-more-ranks");
    let spec = SynthSpec {
        classes: 2,
        per_class: 20,
        val_per_class: 1,
        seed: 3,
        shards: 4,
        max_short_side: 40,
    };
    let shards = synth_and_pack(tmp.path(), &spec);
    let train = |np: usize, run: &Path| {
        let mut cmd = mpirun_train(np, &shards);
        cmd.args(["--residency", "rank", "--exchange", "0.5"])
            .args(["--image-size", "16", "--devices", "cpu:1", "--batch", "4"])
            .args(["--epochs", "2", "--no-eval", "--comm-timeout", "20"])
            .args(["--checkpoint-every", "1", "--stage"])
            .arg(run.join("stage"))
            .arg("--checkpoint-dir")
            .arg(run.join("ckpt"));
        cmd
    };
    let first = tmp.path().join("first");
    run_ok(train(2, &first).args(["--max-steps", "4"]));
    // Step 4 of 5 onto 4 ranks: 8 records left, a step of 16. Before, a rank's allreduce
    // call check and its record exchange's thread waited for each other's requests across
    // ranks, and 5 of 6 such resumes waited out --comm-timeout; each try here did so alike.
    for attempt in 0..2 {
        let again = tmp.path().join(format!("again-{attempt}"));
        copy_checkpoints(&first.join("ckpt"), &again.join("ckpt"));
        let mut cmd = train(4, &again);
        cmd.args(["--resume", "--allow-new-layout"]);
        let out = Launched::start(&mut cmd).wait_within(Duration::from_secs(120));
        let said = printed(&out);
        assert!(out.status.success(), "try {attempt}: {said}");
        assert!(
            said.contains("resume: epoch 0 had served 32 of 40 records"),
            "try {attempt}: {said}"
        );
    }
}

#[test]
fn exchange_on_one_node_is_a_note() {
    let tmp = scratch("exchange-one-node");
    let shards = synth_and_pack(
        tmp.path(),
        &SynthSpec {
            classes: 2,
            per_class: 8,
            val_per_class: 1,
            seed: 1,
            shards: 2,
            max_short_side: 40,
        },
    );
    let out = run_ok(
        command("ddl-train")
            .arg("--data")
            .arg(&shards)
            .args([
                "--model",
                "resnet_small",
                "--workers",
                "1",
                "--image-size",
                "32",
            ])
            .args([
                "--batch",
                "4",
                "--devices",
                "cpu:1",
                "--epochs",
                "1",
                "--no-eval",
            ])
            .args(["--exchange", "0.5"]),
    );
    let said = printed(&out);
    assert!(
        said.contains("note: --exchange 0.5 exchanges nothing"),
        "{said}"
    );
}
