//! Checkpoint and resume: a run stopped after k steps and resumed to N ends with weights
//! bitwise identical to an uninterrupted N-step run (BatchNorm model, 2 replicas, so the
//! per-replica running statistics must round-trip too), also when the newest checkpoint is
//! damaged and an older one must be used. The runs use `--overlap backward` (staged
//! backward), whose resumed trajectory must be exact too.

use crate::common;

use std::time::{Duration, Instant};

use ddl_trainer::checkpoint::{self, Checkpoint};
use ddl_trainer::config::Overlap;
use ddl_trainer::signal::{KillTiming, StopSignal};
use ddl_trainer::TrainError;

#[test]
fn resume_is_bitwise_exact() {
    let tmp = ddl_testkit::scratch("resume");
    let dir = tmp.path();
    let data = dir.join("data");
    // 4 classes x 20 = 80 records; batch 4 x 2 replicas x 2 ranks = 16 per step: 5 steps/epoch.
    common::make_dataset(&data, 4, 20, 2, 2, 1, 36);
    let base = |name: &str| {
        let mut cfg = common::config(&data, "resnet_small", 4, "cpu:2");
        cfg.epochs = 2;
        cfg.eval = true;
        cfg.warmup_epochs = 0.5;
        cfg.schedule = ddl_trainer::schedule::DecayKind::Cosine;
        cfg.checkpoint_dir = Some(dir.join(format!("ck-{name}")));
        cfg.checkpoint_every = 2;
        cfg.keep_checkpoints = 10;
        cfg.overlap = Some(Overlap::Backward);
        cfg
    };
    // Uninterrupted: 8 steps, crossing the epoch boundary at 5.
    let mut full = base("full");
    full.max_steps = Some(8);
    full.dump_weights = Some(dir.join("full.bin"));
    let s = common::run_ranks(&full, 2);
    assert_eq!(s.global_steps, 8);
    let want = std::fs::read(dir.join("full.bin")).unwrap();

    // Interrupted at 7 (checkpoint at 7 written on stop), resumed to 8.
    let mut first = base("cut");
    first.max_steps = Some(7);
    let s = common::run_ranks(&first, 2);
    assert_eq!(s.global_steps, 7);
    let files = checkpoint::list(&dir.join("ck-cut")).unwrap();
    let steps: Vec<u64> = files
        .iter()
        .map(|p| Checkpoint::read(p).unwrap().meta.global_step)
        .collect();
    assert_eq!(steps, vec![2, 4, 5, 6, 7]);
    // Every replica of every rank has its own BatchNorm statistics in the file.
    let ck = Checkpoint::read(files.last().unwrap()).unwrap();
    let a = ck.get("buffer/0/0/bn1.running_mean").unwrap();
    let b = ck.get("buffer/1/1/bn1.running_mean").unwrap();
    assert_ne!(
        a, b,
        "replicas saw different batches, their BN statistics must differ"
    );
    assert_eq!((ck.meta.epoch, ck.meta.step), (1, 2));

    let mut second = base("cut");
    second.max_steps = Some(8);
    second.resume = true;
    second.dump_weights = Some(dir.join("resumed.bin"));
    let s = common::run_ranks(&second, 2);
    assert_eq!(s.steps_run, 1);
    assert!(s.resumed_from.unwrap().ends_with(checkpoint::file_name(7)));
    assert!(
        std::fs::read(dir.join("resumed.bin")).unwrap() == want,
        "resumed weights differ from uninterrupted"
    );

    // Damage the newest checkpoint (step 8 now): resuming falls back to step 7 with a warning
    // and still ends bitwise identical.
    let newest = checkpoint::list(&dir.join("ck-cut"))
        .unwrap()
        .pop()
        .unwrap();
    assert!(newest.ends_with(checkpoint::file_name(8)));
    let mut bytes = std::fs::read(&newest).unwrap();
    let n = bytes.len();
    bytes[n / 3] ^= 1;
    std::fs::write(&newest, &bytes).unwrap();
    let mut third = second.clone();
    third.dump_weights = Some(dir.join("fallback.bin"));
    let s = common::run_ranks(&third, 2);
    assert_eq!(s.warnings.len(), 1, "{:?}", s.warnings);
    assert!(s.warnings[0].contains("damaged"));
    assert!(s.resumed_from.unwrap().ends_with(checkpoint::file_name(7)));
    assert!(std::fs::read(dir.join("fallback.bin")).unwrap() == want);
}

/// A job whose time limit would bring SIGKILL before a stop begun at the limit's SIGTERM could
/// write its checkpoint (a step and a write are longer than the scheduler's grace) stops by
/// itself ahead of it, on every rank after the same step, with the checkpoint written there;
/// with the limit far ahead it trains on.
#[test]
fn a_run_stops_ahead_of_a_time_limit_it_could_not_stop_in() {
    let tmp = ddl_testkit::scratch("time-limit");
    let data = tmp.path().join("data");
    // 4 classes x 8 = 32 records; batch 4 x 2 ranks: 4 steps per epoch.
    common::make_dataset(&data, 4, 8, 2, 1, 1, 36);
    let timing = |kill_in: Duration| KillTiming {
        grace: Some((Duration::from_secs(1), "the test's scheduler".into())),
        kill_by: Some(Instant::now() + kill_in),
        said: String::new(),
    };
    let mut cfg = common::config(&data, "resnet_small", 4, "cpu:1");
    cfg.epochs = 2;
    cfg.checkpoint_dir = Some(tmp.path().join("ck"));
    // SIGKILL due in a second: less than any step, write and margin.
    cfg.kill_timing = Some(timing(Duration::from_secs(1)));
    let results = common::try_all(&cfg, 2);
    for r in &results {
        match r {
            Err(TrainError::Preempted {
                signal: StopSignal::TimeLimit,
                global_step: 1,
                checkpoint: Some(path),
                ..
            }) => assert_eq!(Checkpoint::read(path).unwrap().meta.global_step, 1),
            other => panic!("expected a stop ahead of the time limit at step 1: {other:?}"),
        }
    }
    let stopped = results[0].as_ref().unwrap_err().to_string();
    assert!(
        stopped.starts_with("stopped ahead of the job's time limit after global step 1"),
        "{stopped}"
    );

    cfg.checkpoint_dir = Some(tmp.path().join("ck-far"));
    cfg.kill_timing = Some(timing(Duration::from_secs(3600)));
    assert_eq!(common::run_ranks(&cfg, 2).global_steps, 8);
}
