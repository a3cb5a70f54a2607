//! Output of ddl-pack, ddl-prof, ddl-bench and ddl-synth when stderr is not a terminal: no
//! ANSI colour codes, and every error (usage or run time) written in one piece, so that under
//! `mpirun` one rank's error line never interleaves with another's; a closed pipe or a full disk
//! ends a tool with at most one line; names from the input reach the terminal escaped.

use crate::common;

use std::process::Command;

use common::{assert_no_ansi, stderr_writes, Writes};

fn bin(name: &str) -> Command {
    Command::new(match name {
        "ddl-pack" => env!("CARGO_BIN_EXE_ddl-pack"),
        "ddl-prof" => env!("CARGO_BIN_EXE_ddl-prof"),
        "ddl-bench" => env!("CARGO_BIN_EXE_ddl-bench"),
        "ddl-synth" => env!("CARGO_BIN_EXE_ddl-synth"),
        other => panic!("no binary {other}"),
    })
}

/// The process failed, wrote its error in exactly one write, and that write holds `needle`.
fn assert_one_error_write(w: &Writes, needle: &str) {
    assert!(!w.status.success(), "{}", w.all());
    let errors: Vec<&String> = w.stderr.iter().filter(|s| s.contains("error")).collect();
    assert_eq!(errors.len(), 1, "the error is not one write:\n{}", w.all());
    assert!(errors[0].contains(needle), "{}", w.all());
    assert!(errors[0].ends_with('\n'), "{}", w.all());
    assert_no_ansi(w);
}

#[test]
fn usage_errors_are_one_write_without_colour() {
    for (tool, args, needle) in [
        (
            "ddl-pack",
            vec!["in", "-o", "out", "--quality", "101"],
            "--quality",
        ),
        ("ddl-prof", vec!["shards", "--prefetch", "0"], "--prefetch"),
        ("ddl-bench", vec!["allreduce", "--iters", "0"], "--iters"),
        ("ddl-synth", vec!["out", "--classes", "many"], "--classes"),
    ] {
        let mut cmd = bin(tool);
        cmd.args(&args);
        let w = stderr_writes(cmd);
        assert_eq!(w.status.code(), Some(2), "{tool}: {}", w.all());
        assert_one_error_write(&w, needle);
    }
}

#[test]
fn run_time_errors_are_one_line_in_one_write_without_colour() {
    let tmp = ddl_testkit::scratch("hygiene-runtime");
    let dir = tmp.path();
    let missing = dir.join("no-such-dir");
    let m = missing.to_str().unwrap();
    for (tool, args) in [
        ("ddl-pack", vec!["--verify", m]),
        ("ddl-prof", vec![m, "--seconds", "0.1"]),
        (
            "ddl-bench",
            vec!["sim", "--step-compute-ms", "100", "--model", "vgg"],
        ),
    ] {
        let mut cmd = bin(tool);
        cmd.args(&args);
        let w = stderr_writes(cmd);
        assert_eq!(w.status.code(), Some(1), "{tool}: {}", w.all());
        assert_one_error_write(&w, &format!("{tool}: error: "));
        let line = w.stderr.iter().find(|s| s.contains("error")).unwrap();
        assert_eq!(line.matches('\n').count(), 1, "{tool}: {}", w.all());
        // Each cause once: the chain once printed "...: No such file or directory (os error
        // 2): No such file or directory (os error 2)".
        assert!(line.matches("(os error").count() <= 1, "{tool}: {line}");
    }
}

#[test]
fn a_closed_output_pipe_ends_a_tool_quietly() {
    use std::os::unix::process::ExitStatusExt;
    for args in [
        vec!["sim", "--model", "resnet101", "--classes", "21841"],
        vec!["sim", "--json"],
    ] {
        let out = bin("ddl-bench")
            .args(&args)
            .stdout(ddl_testkit::closed_pipe())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.is_empty(), "{args:?} wrote: {err}");
        assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{args:?}: {err}");
    }
}

#[test]
fn progress_and_summaries_carry_no_colour() {
    let tmp = ddl_testkit::scratch("hygiene-progress");
    let dir = tmp.path();
    let tree = dir.join("tree");
    let out = dir.join("shards");
    let w = stderr_writes(synth_small(&tree));
    assert!(w.status.success(), "{}", w.all());
    assert_no_ansi(&w);
    let mut pack = bin("ddl-pack");
    pack.arg(&tree).arg("-o").arg(&out).args(["--shards", "1"]);
    let w = stderr_writes(pack);
    assert!(w.status.success(), "{}", w.all());
    assert_no_ansi(&w);
    // Each progress line is one write.
    assert!(w.stderr.iter().all(|s| s.ends_with('\n')), "{}", w.all());
    let mut prof = bin("ddl-prof");
    prof.arg(&out).args([
        "--threads",
        "1",
        "--batch",
        "4",
        "--image-size",
        "32",
        "--seconds",
        "0.1",
        "--stage-seconds",
        "0.05",
    ]);
    let w = stderr_writes(prof);
    assert!(w.status.success(), "{}", w.all());
    assert_no_ansi(&w);
    assert!(
        w.stderr.iter().all(|s| s.matches('\n').count() == 1),
        "{}",
        w.all()
    );
}

/// ddl-synth of a small tree (2 classes of 4 images, 32-48 px) into `tree`.
fn synth_small(tree: &std::path::Path) -> Command {
    let mut synth = bin("ddl-synth");
    synth.arg(tree).args([
        "--classes",
        "2",
        "--per-class",
        "4",
        "--val-per-class",
        "1",
        "--min-side",
        "32",
        "--max-side",
        "48",
    ]);
    synth
}

/// A small generated tree packed into shards in `dir`: (tree, shards).
fn small_pack(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (tree, shards) = (dir.join("tree"), dir.join("shards"));
    assert!(synth_small(&tree).output().unwrap().status.success());
    let out = bin("ddl-pack")
        .arg(&tree)
        .arg("-o")
        .arg(&shards)
        .args(["--shards", "1"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (tree, shards)
}

#[test]
fn a_full_disk_ends_a_tool_with_one_line() {
    let tmp = ddl_testkit::scratch("hygiene-full-disk");
    let (tree, shards) = small_pack(tmp.path());
    let m = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let again = tmp.path().join("again");
    let runs: [(&str, Vec<String>); 3] = [
        ("ddl-pack", vec![m(&tree), "-o".into(), m(&again)]),
        ("ddl-pack", vec!["--verify".into(), m(&shards)]),
        (
            "ddl-prof",
            [
                &m(&shards),
                "--threads",
                "1",
                "--batch",
                "4",
                "--image-size",
                "32",
                "--seconds",
                "0.1",
            ]
            .map(String::from)
            .to_vec(),
        ),
    ];
    for (tool, args) in runs {
        let out = bin(tool)
            .args(&args)
            .stdout(ddl_testkit::full_disk())
            .output()
            .unwrap();
        ddl_testkit::assert_ended_on_full_disk(tool, &out);
    }
}

#[test]
fn names_from_the_input_reach_the_terminal_escaped() {
    let tmp = ddl_testkit::scratch("hygiene-names");
    let (tree, _) = small_pack(tmp.path());
    // An unreadable input whose name holds a newline (that would forge a summary line) and an
    // escape sequence (that would clear the screen).
    let class = std::fs::read_dir(tree.join("train"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let evil = "x\ntrain: 9999 records\u{1b}[2J.JPEG";
    std::fs::write(class.join(evil), b"not a jpeg").unwrap();
    let out = bin("ddl-pack")
        .arg(&tree)
        .arg("-o")
        .arg(tmp.path().join("evil"))
        .args(["--shards", "1", "--max-skip-fraction", "0.5"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains('\u{1b}'), "{text:?}");
    assert!(
        !text.lines().any(|l| l.starts_with("train: 9999")),
        "a forged line: {text}"
    );
    assert!(
        text.contains("x\\ntrain: 9999 records\\u001b[2J.JPEG"),
        "{text}"
    );
}
