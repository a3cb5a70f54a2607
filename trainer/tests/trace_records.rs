//! `trace_records`: a job of two ranks (threads of this process) with two CPU replicas each
//! writes one trace file per rank, one line per replica and step, numbered as the metrics'
//! steps; every epoch serves each record at most once and exactly as many as its full steps
//! hold (the `Drop` tail leaves the rest out); the same seed writes the same files, and a run
//! stopped by `max_steps` (then killed mid-line) and resumed writes the uninterrupted run's; a
//! resume on fewer ranks cuts every file of the old layout at its checkpoint, keeping the
//! trace lines around a line that is not one; a trace another writer holds is refused.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use ddl_loader::trace_records::{read, TraceLine};
use ddl_trainer::TrainConfig;
use serde_json::Value;

use crate::common;

const RANKS: usize = 2;
const REPLICAS: usize = 2;
const BATCH: usize = 2;
/// Train records: 3 classes x 9.
const RECORDS: usize = 27;
/// Full steps of an epoch: 27 records / global batch 8 (3 left out by the `Drop` tail).
const STEPS: u64 = 3;
const EPOCHS: u32 = 2;

/// Packs the dataset into `dir/data` (3 train shards, no val) and returns its path.
fn setup(dir: &Path) -> PathBuf {
    let data = dir.join("data");
    common::make_dataset(&data, 3, RECORDS / 3, 0, 3, 0, 36);
    data
}

/// The run on `data` writing its trace and checkpoints under `run`.
fn config(data: &Path, run: &Path) -> TrainConfig {
    let mut cfg = common::config(data, "convnet_nobn", BATCH, "cpu:2");
    cfg.epochs = EPOCHS;
    cfg.trace_records = Some(run.join("trace.jsonl"));
    cfg.checkpoint_dir = Some(run.join("ck"));
    cfg
}

/// The files of the ranks of a run writing to `run/trace.jsonl`, their bytes.
fn files(run: &Path) -> Vec<Vec<u8>> {
    assert!(
        !run.join("trace.jsonl").exists(),
        "several ranks: no unsuffixed file"
    );
    (0..RANKS)
        .map(|r| std::fs::read(run.join(format!("trace.jsonl.{r}"))).unwrap())
        .collect()
}

/// Every line of every rank of a run under `run`.
fn lines(run: &Path) -> Vec<TraceLine> {
    (0..RANKS)
        .flat_map(|r| read(&run.join(format!("trace.jsonl.{r}"))).unwrap())
        .collect()
}

#[test]
fn every_record_at_most_once_per_epoch_at_the_metrics_steps() {
    let tmp = ddl_testkit::scratch("trace-records");
    let data = setup(tmp.path());
    let run = tmp.path().join("run");
    let mut cfg = config(&data, &run);
    cfg.metrics = Some(tmp.path().join("metrics.jsonl"));
    let s = common::run_ranks(&cfg, RANKS);
    assert_eq!(s.global_steps, STEPS * u64::from(EPOCHS));

    // The metrics' step records: (step, epoch).
    let metrics = std::fs::read_to_string(tmp.path().join("metrics.jsonl")).unwrap();
    let steps: BTreeMap<u64, u64> = metrics
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["type"] == "step")
        .map(|v| (v["step"].as_u64().unwrap(), v["epoch"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        steps.keys().copied().collect::<Vec<_>>(),
        [1, 2, 3, 4, 5, 6]
    );

    for r in 0..RANKS {
        let mine = read(&run.join(format!("trace.jsonl.{r}"))).unwrap();
        let at: Vec<(u64, usize)> = mine.iter().map(|l| (l.step, l.replica)).collect();
        let want: Vec<(u64, usize)> = (1..=STEPS * u64::from(EPOCHS))
            .flat_map(|s| (0..REPLICAS).map(move |k| (s, k)))
            .collect();
        assert_eq!(
            at, want,
            "rank {r}: one line per step and replica, in order"
        );
        for l in &mine {
            assert_eq!(l.rank, r);
            assert_eq!(Some(&l.epoch), steps.get(&l.step), "step {}", l.step);
            assert_eq!(l.ids.len(), BATCH);
        }
    }

    let all = lines(&run);
    let mut orders = Vec::new();
    for epoch in 0..u64::from(EPOCHS) {
        let ids: Vec<u64> = all
            .iter()
            .filter(|l| l.epoch == epoch)
            .flat_map(|l| l.ids.iter().copied())
            .collect();
        let distinct: BTreeSet<u64> = ids.iter().copied().collect();
        let served = STEPS as usize * RANKS * REPLICAS * BATCH;
        assert_eq!(ids.len(), served, "epoch {epoch}");
        assert_eq!(distinct.len(), served, "epoch {epoch}: a record twice");
        assert!(ids.iter().all(|&id| id < RECORDS as u64), "{ids:?}");
        orders.push(ids);
    }
    assert_ne!(orders[0], orders[1], "each epoch has an order of its own");
}

#[test]
fn same_seed_same_trace_and_a_resumed_run_continues_it() {
    let tmp = ddl_testkit::scratch("trace-records-resume");
    let data = setup(tmp.path());
    let (full, again, cut) = (
        tmp.path().join("full"),
        tmp.path().join("again"),
        tmp.path().join("cut"),
    );
    common::run_ranks(&config(&data, &full), RANKS);
    common::run_ranks(&config(&data, &again), RANKS);
    let want = files(&full);
    assert!(files(&again) == want, "same seed, another trace");

    // Stopped inside the second epoch; the pipeline read ahead of the last step.
    let mut first = config(&data, &cut);
    first.max_steps = Some(STEPS + 1);
    let s = common::run_ranks(&first, RANKS);
    assert_eq!(s.global_steps, STEPS + 1);
    let steps: BTreeSet<u64> = lines(&cut).iter().map(|l| l.step).collect();
    assert_eq!(steps, (1..=STEPS + 1).collect(), "only the steps trained");

    // As if killed after its checkpoint: a line past it and a torn one.
    let rank0 = cut.join("trace.jsonl.0");
    let mut text = std::fs::read_to_string(&rank0).unwrap();
    let line = TraceLine {
        epoch: 1,
        step: STEPS + 2,
        rank: 0,
        replica: 0,
        ids: vec![0, 1],
    };
    text.push_str(&serde_json::to_string(&line).unwrap());
    text.push_str("\n{\"epoch\":1,\"st");
    std::fs::write(&rank0, text).unwrap();

    let mut second = config(&data, &cut);
    second.resume = true;
    let s = common::run_ranks(&second, RANKS);
    assert_eq!(s.steps_run, STEPS * u64::from(EPOCHS) - (STEPS + 1));
    assert!(
        files(&cut) == want,
        "resumed trace differs from the uninterrupted one"
    );
}

#[test]
fn a_resume_on_fewer_ranks_cuts_every_file_of_the_old_layout_at_its_checkpoint() {
    let tmp = ddl_testkit::scratch("trace-records-elastic");
    let data = setup(tmp.path());
    let run = tmp.path().join("run");
    let file = |r: usize| run.join(format!("trace.jsonl.{r}"));
    // 3 ranks of one replica (global batch 6: 4 steps an epoch), stopped after step 5 with a
    // checkpoint.
    let job = |ranks_steps: (usize, u64), resume: bool| {
        let mut cfg = config(&data, &run);
        cfg.devices = "cpu:1".parse().unwrap();
        cfg.max_steps = Some(ranks_steps.1);
        cfg.resume = resume;
        cfg.allow_new_layout = resume;
        common::run_ranks(&cfg, ranks_steps.0)
    };
    job((3, 5), false);
    let before: Vec<Vec<TraceLine>> = (0..3).map(|r| read(&file(r)).unwrap()).collect();
    // As if killed after its checkpoint: every rank wrote a line of step 6, and rank 1's file
    // holds a line that is not a trace line between its steps 2 and 3.
    for r in 0..3 {
        let mut text = std::fs::read_to_string(file(r)).unwrap();
        if r == 1 {
            let at = text.match_indices('\n').nth(1).unwrap().0 + 1;
            text.insert_str(at, "{\"epoch\":0,\"st\n");
        }
        let past = TraceLine {
            epoch: 1,
            step: 6,
            rank: r,
            replica: 0,
            ids: vec![1000, 1001],
        };
        text.push_str(&serde_json::to_string(&past).unwrap());
        text.push('\n');
        std::fs::write(file(r), text).unwrap();
    }

    // Resumed on 2 ranks for one step: the departed rank 2's file is cut at step 5 too, and
    // rank 1's keeps its trace lines around the bad one.
    assert_eq!(job((2, 6), true).steps_run, 1);
    for (r, old) in before.iter().enumerate() {
        let now = read(&file(r)).unwrap();
        let (kept, new): (Vec<TraceLine>, Vec<TraceLine>) =
            now.into_iter().partition(|l| l.step <= 5);
        assert_eq!(&kept, old, "rank {r}'s lines up to the checkpoint");
        let steps: Vec<u64> = new.iter().map(|l| l.step).collect();
        let want: &[u64] = if r < 2 { &[6] } else { &[] };
        assert_eq!(steps, want, "rank {r}: the resumed run's lines alone");
        assert!(new.iter().all(|l| l.ids != [1000, 1001]), "rank {r}");
    }
}

#[test]
fn a_trace_another_run_writes_is_refused_naming_it() {
    let tmp = ddl_testkit::scratch("trace-records-busy");
    let data = setup(tmp.path());
    let run = tmp.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    let path = run.join("trace.jsonl");
    let held = ddl_loader::trace_records::TraceFile::lock(&path).unwrap();
    let mut cfg = config(&data, &run);
    cfg.devices = "cpu:1".parse().unwrap();
    let err = common::try_all(&cfg, 1)
        .remove(0)
        .expect_err("a second writer");
    let message = err.to_string();
    assert!(
        message.contains("--trace-records")
            && message.contains(&path.display().to_string())
            && message.contains("another run or loader is writing"),
        "{message}"
    );
    drop(held);
}
