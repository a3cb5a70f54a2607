//! `ddl-train --compile` as users run it: under `mpirun -np 2` (2 ranks x 2 CPU replicas,
//! BatchNorm model) it keeps every replica of both ranks on the same weights (`--check-replicas`
//! fails the run otherwise), and its weights follow those of the eager run from the same start
//! without being them; with a Python that has no torch it fails saying so; killed mid-compile,
//! it takes the compile along, and the next compile removes its folder.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ddl_tests::{
    command, mpirun_train, printed, run, run_ok, scratch, signal, synth_and_pack, Launched,
    SynthSpec, LAUNCH_TIMEOUT,
};

/// The weights after 4 steps of 2 ranks x 2 replicas with `flags`, dumped to `weights`, and
/// what the job printed on stderr.
fn train(shards: &Path, flags: &[&str], weights: &Path) -> (Vec<f32>, String) {
    let mut cmd = mpirun_train(2, shards);
    cmd.args([
        "--image-size",
        "32",
        "--batch",
        "8",
        "--devices",
        "cpu:2",
        "--warmup-epochs",
        "0",
        "--base-lr",
        "0.05",
        "--check-replicas",
        "--no-eval",
    ])
    .args(flags)
    .arg("--dump-weights")
    .arg(weights);
    let out = run_ok(&mut cmd);
    let dumped = fs::read(weights)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    (dumped, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn compiled_ranks_keep_equal_weights_that_follow_eager() {
    let tmp = scratch("compiled-mpi");
    let shards = synth_and_pack(
        tmp.path(),
        &SynthSpec {
            classes: 4,
            per_class: 16,
            val_per_class: 1,
            seed: 9,
            shards: 2,
            max_short_side: 40,
        },
    );
    let cache: PathBuf = Path::new(env!("CARGO_TARGET_TMPDIR")).join("compile-cache");
    let cache = cache.to_str().unwrap();
    let (init, _) = train(
        &shards,
        &["--max-steps", "0", "--quiet"],
        &tmp.path().join("init.f32"),
    );
    let (eager, _) = train(
        &shards,
        &["--max-steps", "4", "--quiet"],
        &tmp.path().join("eager.f32"),
    );
    let (compiled, said) = train(
        &shards,
        &["--max-steps", "4", "--compile", "--compile-cache", cache],
        &tmp.path().join("compiled.f32"),
    );
    // The step came from the cache, compiled now or before: rank 0 says which.
    let step = "compile: resnet_small step (4 classes, batch 8, 32 px, fp32, NCHW, cpu)";
    assert!(
        said.lines()
            .any(|l| l.contains(step)
                && (l.contains("from the cache") || l.contains("with Inductor"))),
        "{said}"
    );
    let (mut diff, mut update) = (0f64, 0f64);
    for ((&i, &e), &c) in init.iter().zip(&eager).zip(&compiled) {
        diff += (f64::from(c) - f64::from(e)).powi(2);
        update += (f64::from(e) - f64::from(i)).powi(2);
    }
    let rel = (diff / update).sqrt();
    // Within 3% of eager's update, but not eager's itself: Inductor's kernels sum in another
    // order, so a run that did not use the compiled step would be bitwise eager.
    assert!(
        update > 0.0 && rel > 0.0 && rel < 0.03,
        "compiled update {rel:.3e} from eager's"
    );
}

#[test]
fn compile_with_a_python_without_torch_says_what_is_missing() {
    let tmp = scratch("compiled-no-torch");
    // A Python that cannot import torch (a virtualenv of the system's, without packages).
    let venv = tmp.path().join("bare");
    run_ok(
        Command::new("python3")
            .args(["-m", "venv", "--without-pip"])
            .arg(&venv),
    );
    let out = run(command("ddl-train")
        .args([
            "--synthetic-data",
            "--classes",
            "3",
            "--model",
            "convnet_nobn",
        ])
        .args([
            "--image-size",
            "16",
            "--batch",
            "2",
            "--devices",
            "cpu:1",
            "--max-steps",
            "1",
        ])
        .arg("--compile")
        .arg("--compile-cache")
        .arg(tmp.path().join("cache"))
        .env("DDL_PYTHON", venv.join("bin/python")));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{}", printed(&out));
    assert!(err.contains("cannot import torch"), "{}", printed(&out));
    // The failed compile's folder is kept and named: its spec, script and log.
    assert!(err.contains("whole log"), "{err}");
}

/// `ddl-train --synthetic-data --compile` of a small step into `cache`, compiled by `python`.
fn synthetic_compile(cache: &Path, python: &Path) -> Command {
    let mut cmd = command("ddl-train");
    cmd.args([
        "--synthetic-data",
        "--classes",
        "3",
        "--model",
        "convnet_nobn",
    ])
    .args(["--image-size", "16", "--batch", "2", "--devices", "cpu:1"])
    .args(["--max-steps", "1", "--compile", "--compile-cache"])
    .arg(cache)
    .env("DDL_PYTHON", python);
    cmd
}

/// Whether process `pid` (not a child of this one) ends within `limit`.
fn ends_within(pid: u32, limit: Duration) -> bool {
    // SAFETY: pidfd_open takes a pid and flags; poll gets one valid pollfd.
    unsafe {
        let fd = libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) as i32;
        if fd < 0 {
            return true; // no such process any more
        }
        let mut ready = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let n = libc::poll(&mut ready, 1, limit.as_millis() as i32);
        libc::close(fd);
        n == 1
    }
}

#[test]
fn a_compile_dies_with_a_killed_ddl_train_and_its_folder_goes_next_time() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = scratch("compiled-killed");
    let cache = tmp.path().join("cache");
    // A compiler that says its pid, then works on for ten minutes.
    let slow = tmp.path().join("slow-python");
    let pid_file = tmp.path().join("compiler.pid");
    fs::write(
        &slow,
        format!(
            "#!/bin/sh\necho $$ > {}.tmp\nmv {0}.tmp {0}\nexec sleep 600\n",
            pid_file.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&slow, fs::Permissions::from_mode(0o755)).unwrap();
    let mut job = Launched::start(&mut synthetic_compile(&cache, &slow));
    job.wait_for("the compiler's start", || pid_file.exists());
    let compiler: u32 = fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    signal(job.pid(), libc::SIGKILL);
    let _ = job.wait_within(LAUNCH_TIMEOUT);
    if !ends_within(compiler, Duration::from_secs(30)) {
        signal(compiler, libc::SIGKILL);
        panic!("the compiler (pid {compiler}) outlived the ddl-train killed during its compile");
    }
    let temporary = |cache: &Path| -> Vec<String> {
        fs::read_dir(cache)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect()
    };
    assert_eq!(temporary(&cache).len(), 1, "the killed compile's folder");

    // The next compile of any step in the cache removes it (this one fails at once).
    let out = run(&mut synthetic_compile(&cache, Path::new("/bin/false")));
    assert!(!out.status.success(), "{}", printed(&out));
    assert_eq!(temporary(&cache), Vec::<String>::new(), "{}", printed(&out));
}
