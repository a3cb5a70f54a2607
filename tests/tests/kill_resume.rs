//! A `mpirun -np 2 ddl-train` job interrupted in the middle of training and resumed with
//! `--resume` ends with weights bitwise identical to an uninterrupted run of the same flags:
//! killed with SIGKILL (it resumes from its last periodic checkpoint), or preempted with SIGTERM
//! (Slurm's SIGTERM, SIGCONT, SIGTERM: it stops after the step in flight, writes a checkpoint
//! there and says how to resume). The
//! resumed runs must really resume: they say from which checkpoint and run only the remaining
//! steps. The same holds with the classifier head split over the ranks (`--head-parallel`,
//! whose checkpoints hold every rank's slice) and under `--comm-order priority` (whose steps
//! end with buckets still to reduce: a checkpoint reduces and applies them first).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ddl_tests::{
    mpirun_train, printed, rank_pids, run_ok, scratch, scratch_until_exit, signal,
    sigterm_stop_step, synth_and_pack, Launched, SynthSpec, LAUNCH_TIMEOUT, RESUME_DATA,
};
use ddl_trainer::checkpoint::{self, Checkpoint};

/// [`RESUME_DATA`]'s 160 images / (2 ranks x batch 8) = 10 steps per epoch, 3 epochs.
const TOTAL_STEPS: u64 = 30;

/// Data-parallel, with the head split over the ranks, or data-parallel under `--comm-order
/// priority` (buckets in 4 KiB chunks, each step's rest reduced during the next one's forward).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    DataParallel,
    HeadParallel,
    Priority,
}

fn train_cmd(mode: Mode, shards: &Path, ckpt: &Path, weights: &Path, every: u64) -> Command {
    let mut cmd = mpirun_train(2, shards);
    match mode {
        Mode::DataParallel => {}
        Mode::HeadParallel => {
            cmd.arg("--head-parallel");
        }
        Mode::Priority => {
            cmd.args(["--overlap", "backward", "--bucket-mb", "0.05"])
                .args(["--comm-order", "priority:4096"]);
        }
    }
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
        "--keep-checkpoints",
        "2",
        "--no-eval",
    ])
    .arg("--checkpoint-every")
    .arg(every.to_string())
    .arg("--checkpoint-dir")
    .arg(ckpt)
    .arg("--dump-weights")
    .arg(weights);
    cmd
}

/// The shards and the uninterrupted run's weights, made once for both tests of a mode.
struct Reference {
    mode: Mode,
    shards: PathBuf,
    weights: Vec<u8>,
}

fn reference(mode: Mode) -> &'static Reference {
    static DP: OnceLock<Reference> = OnceLock::new();
    static HP: OnceLock<Reference> = OnceLock::new();
    static PRIORITY: OnceLock<Reference> = OnceLock::new();
    let cell = match mode {
        Mode::DataParallel => &DP,
        Mode::HeadParallel => &HP,
        Mode::Priority => &PRIORITY,
    };
    cell.get_or_init(|| {
        let tmp = scratch_until_exit("resume-reference");
        let shards = synth_and_pack(&tmp, &RESUME_DATA);
        let full = tmp.join("full.f32");
        let out = run_ok(&mut train_cmd(
            mode,
            &shards,
            &tmp.join("ckpt-full"),
            &full,
            3,
        ));
        if mode == Mode::Priority {
            let said = String::from_utf8_lossy(&out.stdout);
            assert!(said.contains("comm order priority:4096,"), "{said}");
        }
        let weights = fs::read(&full).unwrap();
        assert!(!weights.is_empty());
        Reference {
            mode,
            shards,
            weights,
        }
    })
}

/// Resumes from `ckpt` and checks that the run says so, from `from_step`, runs only the steps
/// left and ends with the reference's weights.
fn resume_and_compare(r: &Reference, ckpt: &Path, every: u64, from_step: u64, weights: &Path) {
    let mut cmd = train_cmd(r.mode, &r.shards, ckpt, weights, every);
    cmd.arg("--resume");
    let out = run_ok(&mut cmd);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let resumed_from = ckpt.join(checkpoint::file_name(from_step));
    assert!(
        stdout.contains(&format!("resume: {}", resumed_from.display()))
            && stdout.contains(&format!("global step {from_step})")),
        "the second run did not resume from {}:\n{}",
        resumed_from.display(),
        printed(&out)
    );
    let done = format!(
        "done: {TOTAL_STEPS} global steps ({} in this run)",
        TOTAL_STEPS - from_step
    );
    assert!(
        stdout.contains(&done),
        "expected {done:?}:\n{}",
        printed(&out)
    );
    let b = fs::read(weights).unwrap();
    assert_eq!(r.weights.len(), b.len(), "weight files differ in size");
    let first_diff = r.weights.iter().zip(&b).position(|(x, y)| x != y);
    assert_eq!(
        first_diff, None,
        "resumed weights differ from the uninterrupted run's"
    );
}

fn checkpoints(dir: &Path) -> Vec<PathBuf> {
    checkpoint::list(dir).unwrap_or_default()
}

#[test]
fn killed_job_resumes_to_bitwise_identical_weights() {
    killed_job_resumes(Mode::DataParallel);
}

#[test]
fn killed_head_parallel_job_resumes_to_bitwise_identical_weights() {
    killed_job_resumes(Mode::HeadParallel);
}

#[test]
fn killed_priority_job_resumes_to_bitwise_identical_weights() {
    killed_job_resumes(Mode::Priority);
}

/// The priority run is the data-parallel one (one bucket, reduced after backward): cutting
/// buckets into chunks and applying them during the next forward changes no sum at 2 ranks.
#[test]
fn priority_run_ends_with_the_data_parallel_weights() {
    let (priority, fifo) = (reference(Mode::Priority), reference(Mode::DataParallel));
    assert!(
        priority.weights == fifo.weights,
        "--comm-order priority ended elsewhere than --overlap off"
    );
}

fn killed_job_resumes(mode: Mode) {
    let r = reference(mode);
    let tmp = scratch("kill-resume");

    // The same job, killed (mpirun and both ranks, SIGKILL) once its first checkpoint exists.
    let ckpt = tmp.path().join("ckpt");
    let killed_weights = tmp.path().join("killed.f32");
    let mut job = Launched::start(&mut train_cmd(mode, &r.shards, &ckpt, &killed_weights, 3));
    job.wait_for("the first checkpoint", || !checkpoints(&ckpt).is_empty());
    job.signal_job(libc::SIGKILL);
    let out = job.wait_within(LAUNCH_TIMEOUT);
    assert!(!out.status.success(), "the job was not killed");
    assert!(
        !killed_weights.exists(),
        "the killed job ran to the end: nothing was resumed"
    );
    let newest = checkpoint::step_of(checkpoints(&ckpt).last().unwrap()).unwrap();
    assert!(newest < TOTAL_STEPS);
    // Leave a half-written checkpoint behind too, as a crash during a write would.
    fs::write(ckpt.join("ckpt-999999999999.ddlck.tmp"), b"partial").unwrap();

    resume_and_compare(r, &ckpt, 3, newest, &tmp.path().join("resumed.f32"));
}

#[test]
fn sigterm_to_one_rank_stops_all_after_a_step_and_resumes_bitwise() {
    sigterm_stops_and_resumes(Mode::DataParallel);
}

#[test]
fn sigterm_to_a_head_parallel_job_stops_it_and_resumes_bitwise() {
    sigterm_stops_and_resumes(Mode::HeadParallel);
}

#[test]
fn sigterm_to_a_priority_job_stops_it_and_resumes_bitwise() {
    sigterm_stops_and_resumes(Mode::Priority);
}

fn sigterm_stops_and_resumes(mode: Mode) {
    let r = reference(mode);
    let tmp = scratch("sigterm-resume");
    let ckpt = tmp.path().join("ckpt");
    let metrics = tmp.path().join("metrics.jsonl");
    let weights = tmp.path().join("stopped.f32");
    // Checkpoints only at epoch ends: the one the stop leaves must come from the stop.
    let mut cmd = train_cmd(mode, &r.shards, &ckpt, &weights, 0);
    cmd.arg("--metrics").arg(&metrics);
    let mut job = Launched::start(&mut cmd);
    let steps_done = || {
        fs::read_to_string(&metrics)
            .map(|s| {
                s.lines()
                    .filter(|l| l.contains("\"type\":\"step\""))
                    .count()
            })
            .unwrap_or(0)
    };
    job.wait_for("step 2", || steps_done() >= 2);
    // A scheduler may signal only some ranks: rank 1 alone, which does not write checkpoints;
    // both ranks must stop after the same step and rank 0 must write it. The signals are those
    // Slurm sends at a job's time limit, one after the other as its separate requests come
    // (a signal sent while the same one is still pending would merge with it): one stop.
    let ranks = rank_pids(job.pid());
    assert_eq!(ranks.len(), 2, "ranks of mpirun: {ranks:?}");
    for sig in [libc::SIGTERM, libc::SIGCONT, libc::SIGTERM] {
        signal(ranks[1].1, sig);
        job.wait_for("the signal's delivery", || !pending(ranks[1].1, sig));
    }
    let out = job.wait_within(LAUNCH_TIMEOUT);
    let text = printed(&out);
    assert!(
        !out.status.success(),
        "a preempted run must exit non-zero: {text}"
    );
    assert!(!weights.exists(), "the job ran to the end: {text}");
    let step = sigterm_stop_step(&text, 2, |s| ckpt.join(checkpoint::file_name(s)));
    assert!((2..TOTAL_STEPS).contains(&step), "{text}");
    let path = ckpt.join(checkpoint::file_name(step));
    // The checkpoint is at the stop step, the last step the metrics recorded.
    let ck = Checkpoint::read(&path).unwrap();
    assert_eq!(ck.meta.global_step, step);
    assert_eq!(steps_done() as u64, step, "steps recorded vs stop step");
    if step % 10 != 0 {
        assert_eq!((ck.meta.epoch, ck.meta.step), (step / 10, step % 10));
    }

    resume_and_compare(r, &ckpt, 0, step, &tmp.path().join("resumed.f32"));
}

/// Whether signal `sig` is pending for process `pid` (`/proc/PID/status`: `ShdPnd`, the
/// signals sent to the process, and `SigPnd`, to its main thread).
fn pending(pid: u32, sig: i32) -> bool {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().any(|l| {
        let mask = l
            .strip_prefix("ShdPnd:")
            .or_else(|| l.strip_prefix("SigPnd:"))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok());
        mask.is_some_and(|m| m & (1 << (sig - 1)) != 0)
    })
}

/// A second Ctrl-C, more than a second after the first stop signal, while the checkpoint that
/// signal asked for is being written: the write is finished first, the process says so and
/// exits with SIGINT's status, and the checkpoint is whole (it was lost before).
#[test]
fn a_second_ctrl_c_lets_the_checkpoint_write_finish() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let tmp = scratch("second-sigint");
    let shards = synth_and_pack(
        tmp.path(),
        &SynthSpec {
            classes: 2,
            per_class: 8,
            val_per_class: 1,
            seed: 4,
            shards: 1,
            max_short_side: 72,
        },
    );
    let ck = tmp.path().join("ck");
    // ResNet-50: a checkpoint of about 200 MB, long enough a write to signal into, after a
    // first step (64 px, 8 images) longer than the second that separates the two signals.
    let mut child = ddl_tests::command("ddl-train")
        .arg("--data")
        .arg(&shards)
        .args(["--model", "resnet50", "--image-size", "64", "--batch", "8"])
        .args(["--devices", "cpu:1", "--workers", "1", "--no-eval"])
        .arg("--checkpoint-dir")
        .arg(&ck)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    // Its start line: the signal handlers are installed.
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let started = lines.next().unwrap().unwrap();
    assert!(started.starts_with("ddl-train: resnet50"), "{started}");
    signal(pid, libc::SIGTERM);
    // Not a wait for an event: a second signal within this window is part of the first stop.
    std::thread::sleep(ddl_trainer::signal::REPEAT_WINDOW);
    let deadline = Instant::now() + LAUNCH_TIMEOUT;
    let writing = loop {
        let tmp_file = fs::read_dir(&ck).ok().and_then(|d| {
            d.filter_map(|e| e.ok())
                .find(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        });
        if tmp_file.is_some() {
            break true;
        }
        if Instant::now() > deadline || child.try_wait().unwrap().is_some() {
            break false;
        }
        std::thread::yield_now();
    };
    assert!(
        writing,
        "the checkpoint write was never seen in {}",
        ck.display()
    );
    signal(pid, libc::SIGINT);
    // Bounded: a hang fails the test instead of stalling CI.
    let deadline = Instant::now() + LAUNCH_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("ddl-train did not end after the second signal");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(
        err.contains("second SIGINT came during the checkpoint write") && err.contains("complete"),
        "{err}"
    );
    let written = checkpoint::list(&ck).unwrap();
    assert_eq!(written.len(), 1, "{written:?}");
    Checkpoint::read(&written[0]).expect("the checkpoint is whole");
}
