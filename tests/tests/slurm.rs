//! ddl under a real Slurm (one node of Debian's slurm-wlm, started by the test:
//! `ddl_tests::slurm`), as HPC users run it:
//! - `srun --mpi=pmix -n 2 ddl-train` forms one world of 2 ranks, whose start-up line says how
//!   long Slurm leaves between SIGTERM and SIGKILL (without `--mpi=pmix`, it is refused);
//! - `scancel` of a batch job running `mpirun ddl-train` stops it with a checkpoint, the ranks'
//!   last lines reach the job's output file, and the job resubmitted with `--resume` (`srun`
//!   inside `sbatch` this time) ends bitwise equal to the uninterrupted run;
//! - a job that reaches its one-minute time limit (Slurm's SIGTERM, SIGCONT, SIGTERM) stops
//!   with a checkpoint at the step it was in, which resumes exactly;
//! - Python in the batch shell of a 2-task job, without `srun`, is a world of one whose
//!   `ddl.Loader` serves the whole split.
//!
//! One cluster for all of them, in one test; the time-limit job waits for its limit while
//! the others run.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ddl_tests::slurm::{Cluster, KILL_WAIT_S};
use ddl_tests::{
    bin, printed, run_ok, sigterm_stop_step, synth_and_pack, venv_bin, Launched, RESUME_DATA,
};
use ddl_trainer::checkpoint::{self, Checkpoint};

/// Longest any one job or command of this test may take: far above what each needs.
const JOB_LIMIT: Duration = Duration::from_secs(300);
/// [`RESUME_DATA`]'s 160 images / (2 ranks x batch 8) = 10 steps per epoch, 3 epochs.
const STEPS: u64 = 30;

#[test]
fn ddl_trains_under_slurm_and_every_stop_leaves_a_checkpoint() {
    let cluster = Cluster::start();
    let shards = synth_and_pack(cluster.dir(), &RESUME_DATA);
    let (running, started) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let time_limit = s.spawn(|| time_limit_stops_with_a_checkpoint(&cluster, &shards, running));
        let reference = srun_forms_one_world(&cluster, &shards);
        batch_shell_python_is_a_world_of_one(&cluster, &shards);
        // A cancelled job keeps its node completing for a few seconds, and Slurm starts no
        // job on a completing node: the time-limit job must have started by then.
        let _ = started.recv();
        scancel_stops_and_the_resubmitted_job_resumes(&cluster, &shards, &reference);
        time_limit.join().expect("the time-limit job's checks");
    });
}

/// `ddl-train` with the flags every job here shares (resnet_small at 32 px, a CPU replica
/// per rank, checkpoints only at epoch ends), as a command line for job scripts.
fn train_line(shards: &Path, ckpt: &Path, extra: &str) -> String {
    format!(
        "{} --data {} --model resnet_small --workers 1 --image-size 32 --batch 8 \
         --devices cpu:1 --warmup-epochs 1 --no-eval --keep-checkpoints 3 \
         --checkpoint-dir {} {extra}",
        bin("ddl-train").display(),
        shards.display(),
        ckpt.display()
    )
}

/// `srun --mpi=pmix -n 2`: one world of two ranks (one start-up line, saying so), trained to
/// the end; its weights are the reference of the stopped and resumed job. Without
/// `--mpi=pmix`, each task says what is missing.
fn srun_forms_one_world(cluster: &Cluster, shards: &Path) -> Vec<u8> {
    let dir = cluster.dir();
    let weights = dir.join("reference.f32");
    let line = train_line(
        shards,
        &dir.join("ck-reference"),
        &format!("--epochs 3 --dump-weights {}", weights.display()),
    );
    let mut srun = cluster.command("srun");
    srun.args(["--mpi=pmix", "-n", "2", "--cpus-per-task", "1"])
        .args(line.split_whitespace());
    let out = Launched::start(&mut srun).wait_within(JOB_LIMIT);
    let text = printed(&out);
    assert!(out.status.success(), "{text}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let starts: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("ddl-train: resnet_small on"))
        .collect();
    assert_eq!(starts.len(), 1, "one world, one start-up line: {text}");
    assert!(starts[0].contains("on 2 rank(s)"), "{text}");
    assert!(
        starts[0].contains(&format!("SIGKILL {KILL_WAIT_S} s after SIGTERM (KillWait)")),
        "the start-up line says Slurm's KillWait: {text}"
    );
    // Without --mpi=pmix (this cluster's MpiDefault is none, Slurm's default), refused before
    // MPI starts, naming the flag.
    let mut bare = cluster.command("srun");
    bare.args(["-n", "2"]).args(line.split_whitespace());
    let out = Launched::start(&mut bare).wait_within(JOB_LIMIT);
    let text = printed(&out);
    assert!(!out.status.success(), "{text}");
    assert_eq!(text.matches("without an MPI plugin").count(), 2, "{text}");
    assert!(text.contains("srun --mpi=pmix"), "{text}");
    fs::read(&weights).expect("the reference weights")
}

/// `scancel` of `mpirun ddl-train` in a batch job: both ranks stop after the same step with a
/// checkpoint there, their lines in the job's output; the job resubmitted with `--resume`
/// (`srun` in `sbatch`) ends with the reference's weights.
fn scancel_stops_and_the_resubmitted_job_resumes(
    cluster: &Cluster,
    shards: &Path,
    reference: &[u8],
) {
    let dir = cluster.dir();
    let ckpt = dir.join("ck-cancelled");
    let metrics = dir.join("cancelled.jsonl");
    let weights = dir.join("resumed.f32");
    let output = dir.join("cancelled.out");
    // Open MPI's daemons kill their ranks about two timeouts after Slurm's SIGTERM (1 s by
    // default), and wait that long themselves (the node meanwhile completing the job).
    let script = format!(
        "mpirun --mca odls_base_sigkill_timeout 5 {}",
        train_line(
            shards,
            &ckpt,
            &format!("--epochs 3 --metrics {}", metrics.display())
        )
    );
    let job = cluster.sbatch(&["-n", "2"], &script, &output);
    let steps =
        || fs::read_to_string(&metrics).map_or(0, |s| s.matches("\"type\":\"step\"").count());
    let deadline = Instant::now() + JOB_LIMIT;
    while steps() < 2 {
        let state = cluster.job_field(&job, "JobState").unwrap_or_default();
        assert!(
            Instant::now() < deadline && matches!(state.as_str(), "PENDING" | "RUNNING"),
            "job {job} ({state}) trained no 2 steps: {}",
            fs::read_to_string(&output).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let cancel = cluster
        .command("scancel")
        .arg(&job)
        .status()
        .expect("scancel");
    assert!(cancel.success());
    cluster.wait_end(&job, JOB_LIMIT);
    let said = fs::read_to_string(&output).unwrap_or_default();
    // Open MPI's kill, shorter than KillWait, is the one the run must fit in.
    assert!(said.contains("under mpirun about 9 s"), "{said}");
    let step = stop_step(&said, 2, &ckpt);
    assert!(step < STEPS, "{said}");
    assert!(!weights.exists(), "the job ran to its end: {said}");

    let script = format!(
        "srun --mpi=pmix {}",
        train_line(
            shards,
            &ckpt,
            &format!("--epochs 3 --resume --dump-weights {}", weights.display())
        )
    );
    let output = dir.join("resumed.out");
    let job = cluster.sbatch(&["-n", "2"], &script, &output);
    let state = cluster.wait_end(&job, JOB_LIMIT);
    let said = fs::read_to_string(&output).unwrap_or_default();
    assert_eq!(state, "COMPLETED", "{said}");
    let from = ckpt.join(checkpoint::file_name(step));
    assert!(
        said.contains(&format!("resume: {}", from.display())),
        "{said}"
    );
    assert!(
        fs::read(&weights).expect("the resumed weights") == reference,
        "the resumed job's weights differ from the uninterrupted run's: {said}"
    );
}

/// The step at which `ranks` ranks said in `output` that SIGTERM stopped them, whose
/// checkpoint in `ckpt` is whole.
fn stop_step(output: &str, ranks: usize, ckpt: &Path) -> u64 {
    let step = sigterm_stop_step(output, ranks, |s| ckpt.join(checkpoint::file_name(s)));
    let path = ckpt.join(checkpoint::file_name(step));
    let ck =
        Checkpoint::read(&path).unwrap_or_else(|e| panic!("{}: {e}\n{output}", path.display()));
    assert_eq!(ck.meta.global_step, step);
    step
}

/// A one-task job with a one-minute time limit: Slurm's SIGTERM, SIGCONT, SIGTERM stop it
/// after a step with a checkpoint there, and the run resumed from it trains the next steps
/// exactly as the run resumed from the periodic checkpoint before it.
fn time_limit_stops_with_a_checkpoint(
    cluster: &Cluster,
    shards: &Path,
    running: std::sync::mpsc::Sender<()>,
) {
    let dir = cluster.dir();
    let ckpt = dir.join("ck-limited");
    let output = dir.join("limited.out");
    // slurmctld ends a job past its limit at its next check, every 30 s from its start: the
    // job is submitted for its minute to end a few seconds before the third, so that it
    // trains about 10 s. It sleeps most of its minute at no cost to the other tests, and
    // starts its step 5 s before the minute is over (Slurm starts none after it).
    let submit = cluster.controller_started() + Duration::from_secs(25);
    std::thread::sleep(submit.saturating_duration_since(Instant::now()));
    let script = format!(
        "sleep 55\nsrun --mpi=pmix {}",
        train_line(shards, &ckpt, "--epochs 1000 --checkpoint-every 10")
    );
    let job = cluster.sbatch(&["-n", "1", "--time=1"], &script, &output);
    let deadline = Instant::now() + JOB_LIMIT;
    while cluster.job_field(&job, "JobState").as_deref() == Some("PENDING") {
        assert!(
            Instant::now() < deadline,
            "job {job} never ran\n{}",
            cluster.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = running.send(());
    let state = cluster.wait_end(&job, JOB_LIMIT);
    let said = fs::read_to_string(&output).unwrap_or_default();
    assert_eq!(state, "TIMEOUT", "{said}\n{}", cluster.logs());
    assert!(said.contains("DUE TO TIME LIMIT"), "{said}");
    let step = stop_step(&said, 1, &ckpt);
    // The periodic checkpoint before the stop's (or none: from the start) in a directory of
    // its own, for a run through the same steps.
    let earlier = dir.join("ck-earlier");
    fs::create_dir(&earlier).expect("a directory");
    let before = checkpoint::list(&ckpt)
        .expect("the checkpoints")
        .into_iter()
        .rfind(|p| checkpoint::step_of(p).is_some_and(|s| s < step));
    if let Some(path) = &before {
        fs::copy(path, earlier.join(path.file_name().expect("a file"))).expect("a copy");
    }
    let resumed = |from: &Path, weights: &Path| {
        let more = format!(
            "--epochs 1000 --resume --max-steps {} --dump-weights {}",
            step + 2,
            weights.display()
        );
        let line = train_line(shards, from, &more);
        let mut args = line.split_whitespace();
        run_ok(Command::new(args.next().expect("a program")).args(args));
        fs::read(weights).expect("weights")
    };
    assert!(
        resumed(&ckpt, &dir.join("from-stop.f32"))
            == resumed(&earlier, &dir.join("from-earlier.f32")),
        "resumed from the time limit's checkpoint at step {step}, the run differs from one \
         resumed from {before:?}"
    );
}

/// `python` in the batch shell of a 2-task job, without srun: a world of one, saying so, whose
/// loader serves every record of the split.
fn batch_shell_python_is_a_world_of_one(cluster: &Cluster, shards: &Path) {
    let python = venv_bin("python");
    let output = cluster.dir().join("python.out");
    let script = format!(
        "{} - <<'EOF'\n\
         import ddl, ddl.dist as dd\n\
         loader = ddl.Loader({:?}, split='train', batch_size=8, image_size=32, workers=1,\n\
         \x20                   drop_last=False)\n\
         records = sum(len(labels) for _, labels in loader)\n\
         dd.init()\n\
         print(f'records {{records}} of {{len(loader.dataset)}}, world {{dd.size()}}')\n\
         EOF",
        python.display(),
        shards.display().to_string()
    );
    let job = cluster.sbatch(&["-n", "2"], &script, &output);
    let state = cluster.wait_end(&job, JOB_LIMIT);
    let said = fs::read_to_string(&output).unwrap_or_default();
    assert_eq!(state, "COMPLETED", "{said}");
    assert!(said.contains("records 160 of 160, world 1"), "{said}");
    assert!(said.contains("not in a job step of its 2 tasks"), "{said}");
}
