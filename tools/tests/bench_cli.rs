//! `ddl-bench` refuses sizes and counts that would print an empty table or be silently
//! changed, by name, before any MPI work; under `mpirun` each rank's refusal is one whole line.
//! `sim --exchange` counts the record exchange on a pack's shards as the loader does. Its help
//! lists the presets and algorithms its parsers accept.

use crate::common;

use std::process::Command;

use common::{assert_no_ansi, stderr_writes};
use ddl_loader::exchange_cost::exchange_cost;
use ddl_loader::placement::Placement;
use ddl_testkit::launch::{mpirun, run};
use ddl_testkit::{jpeg, write_manifest, write_shards, Record};

const BENCH: &str = env!("CARGO_BIN_EXE_ddl-bench");

#[test]
fn bad_sizes_and_counts_are_refused_by_name() {
    for (args, status, needle) in [
        (vec!["--max-bytes", "2"], 2, "--max-bytes"),
        (vec!["--min-bytes", "0"], 2, "--min-bytes"),
        (vec!["--iters", "0"], 2, "--iters"),
        (vec!["--step-factor", "1"], 2, "--step-factor"),
        (vec!["--step-factor", "0"], 2, "--step-factor"),
        (vec!["--timeout-s", "0"], 2, "--timeout-s"),
        (
            vec!["--min-bytes", "8K", "--max-bytes", "4K"],
            1,
            "--min-bytes 8192 is larger than --max-bytes 4096",
        ),
    ] {
        let mut cmd = Command::new(BENCH);
        cmd.arg("allreduce").args(&args);
        let w = stderr_writes(cmd);
        assert_eq!(w.status.code(), Some(status), "{args:?}: {}", w.all());
        assert!(w.stdout.is_empty(), "{args:?} printed a table: {}", w.all());
        assert_eq!(w.stderr.len(), 1, "{args:?}: not one write: {}", w.all());
        assert!(w.stderr[0].contains(needle), "{args:?}: {}", w.all());
        assert_no_ansi(&w);
    }
    let mut cmd = Command::new(BENCH);
    cmd.args(["calibrate", "--max-bytes", "3"]);
    let w = stderr_writes(cmd);
    assert_eq!(w.status.code(), Some(2), "{}", w.all());
    assert!(w.stderr_text().contains("--max-bytes"), "{}", w.all());
}

#[test]
fn under_mpirun_each_rank_refuses_in_one_whole_line() {
    for (args, line_start) in [
        (
            vec!["--iters", "0"],
            "error: invalid value '0' for '--iters <N>'",
        ),
        (
            vec!["--min-bytes", "1M", "--max-bytes", "4K"],
            "ddl-bench: error: --min-bytes 1048576 is larger than --max-bytes 4096",
        ),
    ] {
        let mut cmd = mpirun(2);
        cmd.arg(BENCH).arg("allreduce").args(&args);
        let w = stderr_writes(cmd);
        let all = w.all();
        assert!(!w.status.success(), "{all}");
        assert!(!w.stdout.contains("busbw"), "a table was printed: {all}");
        let text = w.stderr_text();
        for rank in 0..2 {
            let want = format!("rank {rank}: {line_start}");
            assert_eq!(
                text.lines().filter(|l| l.starts_with(&want)).count(),
                1,
                "rank {rank}'s line is missing or not whole:\n{all}"
            );
        }
    }
}

#[test]
fn sim_takes_the_class_count_and_compares_with_ddls_22k_run() {
    let sim = |args: &[&str]| {
        let mut cmd = Command::new(BENCH);
        cmd.args(["sim", "--step-compute-ms", "280", "--preset", "minsky"])
            .args(args);
        stderr_writes(cmd)
    };
    let w = sim(&["--model", "resnet101", "--classes", "21841"]);
    assert!(w.status.success(), "{}", w.all());
    assert!(
        w.stdout
            .contains("resnet101 with 21841 classes (87.3M params, 349.0 MB fp32)"),
        "{}",
        w.all()
    );
    assert!(
        w.stdout
            .contains("DDL's published 88% scaling efficiency (ResNet-101, ImageNet-22k"),
        "{}",
        w.all()
    );
    // With the head split over the GPUs: the backbone's 170 MB allreduced, the features of
    // 256 x 32 images exchanged, fewer bytes than the head's gradient below ~21,809 images.
    assert!(
        w.stdout.contains("the backbone's 170.0 MB allreduced")
            && w.stdout.contains("global batch of 8192 (32 per GPU)")
            && w.stdout.contains("below a global batch of 21809"),
        "{}",
        w.all()
    );
    let efficiency = |prefix: &str| -> f64 {
        let line = w
            .stdout
            .lines()
            .find(|l| l.trim_start().starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} row: {}", w.all()));
        let pct = line.split_whitespace().find(|f| f.ends_with('%')).unwrap();
        pct.trim_end_matches('%').parse().unwrap()
    };
    assert!(
        efficiency("hybrid/ring") > efficiency("flat/ring"),
        "{}",
        w.all()
    );
    let w = sim(&["--model", "resnet50"]);
    assert!(w.status.success(), "{}", w.all());
    assert!(w.stdout.contains("(25.6M params"), "{}", w.all());
    assert!(w.stdout.contains("vs DDL 95%"), "{}", w.all());
    for (args, status, needle) in [
        (vec!["--classes", "1"], 2, "--classes"),
        (
            vec!["--model", "vgg16"],
            1,
            "--model \"vgg16\" is not one of resnet18",
        ),
        (
            vec!["--cpu-replicas"],
            1,
            "--cpu-replicas needs the contention measured by `ddl-bench calibrate`",
        ),
        (vec!["--allreduce", "fastest"], 1, "--allreduce \"fastest\""),
    ] {
        let w = sim(&args);
        assert_eq!(w.status.code(), Some(status), "{args:?}: {}", w.all());
        assert!(w.stdout.is_empty(), "{args:?}: {}", w.all());
        assert!(w.stderr_text().contains(needle), "{args:?}: {}", w.all());
    }
}

#[test]
fn sim_exchange_counts_on_the_shards_or_expects_from_the_record_count() {
    let tmp = ddl_testkit::scratch("bench-exchange");
    let shards: Vec<Vec<Record>> = (0..4)
        .map(|s| {
            (0..25)
                .map(|i| Record::jpeg(jpeg(16, 16, s * 25 + i), 0))
                .collect()
        })
        .collect();
    let train = write_shards(tmp.path(), "train", &shards, 1);
    write_manifest(tmp.path(), 1, vec![("train", train)], 1);
    let data = tmp.path().to_str().unwrap();
    let sim = |args: &[&str]| {
        let mut cmd = Command::new(BENCH);
        cmd.args(["sim", "--preset", "minsky", "--nodes", "2", "--epochs", "4"])
            .args(["--gpus-per-node", "1", "--batch", "1"])
            .args(args);
        stderr_writes(cmd)
    };
    let w = sim(&["--exchange", "1", "--data", data]);
    assert!(w.status.success(), "{}", w.all());
    assert!(
        w.stdout
            .contains("# exchange: Q 1 over 2 nodes, 100 records of ")
            && w.stdout.contains("counted from the placement of seed 0")
            && w.stdout.contains("the run's 3 boundaries"),
        "{}",
        w.all()
    );
    let w = sim(&["--exchange", "1", "--data", data, "--json"]);
    assert!(w.status.success(), "{}", w.all());
    let rows: Vec<serde_json::Value> = w
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|r: &serde_json::Value| r.get("epoch").is_some())
        .collect();
    assert_eq!(rows.len(), 3, "{}", w.all());
    let placement = Placement::new(&[25; 4], 2, 1.0, 0).unwrap();
    for (epoch, row) in (1..).zip(&rows) {
        let counted = exchange_cost(&placement, epoch, 1.0).records();
        assert_eq!(row["epoch"], epoch, "{}", w.all());
        assert_eq!(row["records"].as_f64(), Some(counted as f64), "{}", w.all());
        assert_eq!(row["fits"], true, "{}", w.all());
    }
    // Without shards: Q (P - 1) / P of the records into epoch 1, half into each node.
    let w = sim(&[
        "--exchange",
        "0.5",
        "--records",
        "1000",
        "--record-bytes",
        "1KiB",
        "--link-gbps",
        "8",
        "--json",
    ]);
    assert!(w.status.success(), "{}", w.all());
    let first = w
        .stdout
        .lines()
        .find(|l| l.contains("\"epoch\":1,"))
        .unwrap();
    let first: serde_json::Value = serde_json::from_str(first).unwrap();
    assert_eq!(first["records"], 250.0, "{first}");
    assert_eq!(first["busiest_in_bytes"], 125.0 * 1024.0, "{first}");
    assert_eq!(first["link_s"], 125.0 * 1024.0 / 1e9, "{first}");
    for (args, status, needle) in [
        (
            vec!["--exchange", "0.5"],
            1,
            "--exchange needs --data DIR, or --records",
        ),
        (vec!["--records", "5"], 2, "--exchange"),
        (
            vec!["--exchange", "2", "--records", "5", "--record-bytes", "1"],
            1,
            "--exchange 2 is outside 0..=1",
        ),
        (
            vec!["--exchange", "1", "--data", data, "--records", "5"],
            2,
            "--records",
        ),
    ] {
        let w = sim(&args);
        assert_eq!(w.status.code(), Some(status), "{args:?}: {}", w.all());
        assert!(w.stdout.is_empty(), "{args:?}: {}", w.all());
        assert!(w.stderr_text().contains(needle), "{args:?}: {}", w.all());
    }
}

#[test]
fn calibrate_times_every_candidate_and_auto_runs_the_fastest() {
    let dir = ddl_testkit::scratch("calibrate");
    let model = dir.path().join("model.json");
    let out = run(mpirun(2).arg(BENCH).args([
        "calibrate",
        "--max-bytes",
        "64KiB",
        "--passes",
        "1",
        "-o",
        model.to_str().expect("utf-8 path"),
    ]));
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    let m = ddl_comm::CostModel::load(&model).expect("the model file loads");
    // Every algorithm auto chooses between on one node under MPI, timed in this layout at
    // 4, 16 and 64 KiB (multiring over one tier is the ring: auto never runs it, so it is
    // not timed, and a fast run of it cannot be what auto should have kept).
    let mut names: Vec<&str> = m.measured.iter().map(|c| c.algorithm.as_str()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        ["mpi", "multicolor:4:1048576", "rhd", "ring", "shm"],
        "{text}"
    );
    for c in &m.measured {
        assert_eq!((c.nodes, c.ranks_per_node), (1, 2), "{}", c.algorithm);
        let sizes: Vec<usize> = c.points.iter().map(|p| p.0).collect();
        assert_eq!(sizes, [4 << 10, 16 << 10, 64 << 10], "{}", c.algorithm);
        assert!(
            c.points.iter().all(|p| p.1 > 0.0 && p.1 < 1.0),
            "{}: {:?}",
            c.algorithm,
            c.points
        );
    }
    // auto with that model runs, at each size, the algorithm that was measured fastest.
    let out = run(mpirun(2).arg(BENCH).args([
        "allreduce",
        "--algos",
        "auto",
        "--min-bytes",
        "4KiB",
        "--max-bytes",
        "64KiB",
        "--iters",
        "1",
        "--json",
        "--model-file",
        model.to_str().expect("utf-8 path"),
    ]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("a JSON row"))
        .collect();
    assert_eq!(rows.len(), 3, "{stdout}");
    for row in rows {
        let bytes = row["bytes"].as_u64().expect("bytes") as usize;
        let fastest = m
            .measured
            .iter()
            .min_by(|a, b| {
                let at = |c: &ddl_comm::MeasuredCurve| {
                    c.points
                        .iter()
                        .find(|p| p.0 == bytes)
                        .expect("measured size")
                        .1
                };
                at(a).total_cmp(&at(b))
            })
            .expect("curves");
        assert_eq!(
            row["resolved"],
            fastest.algorithm.as_str(),
            "{bytes} bytes: {row}"
        );
        assert_eq!(row["correct"], true, "{row}");
        // The prediction at a measured size is the measurement.
        let predicted = row["predicted_us"].as_f64().expect("predicted_us");
        let measured = fastest
            .points
            .iter()
            .find(|p| p.0 == bytes)
            .expect("size")
            .1
            * 1e6;
        assert!(
            (predicted - measured).abs() < 1e-6 * measured,
            "{predicted} vs {measured}"
        );
    }
    // The contention of a compute thread per rank and the allreduce, measured on these
    // shared cores, slows the schedule of `sim --cpu-replicas`.
    let c = ddl_sim::StepModel::load(&model)
        .expect("the model file loads")
        .contention;
    assert_eq!(c.compute_threads, 1, "{text}");
    for slowdown in [c.comm_slowdown, c.compute_slowdown, c.round_slowdown] {
        assert!(slowdown.is_finite() && slowdown > 0.0, "{c:?}");
    }
    let schedule = |extra: &[&str]| -> f64 {
        let out = run(Command::new(BENCH)
            .args([
                "sim",
                "--nodes",
                "2",
                "--gpus-per-node",
                "1",
                "--model",
                "resnet18",
            ])
            .args(["--step-compute-ms", "100", "--json", "--model-file"])
            .arg(&model)
            .args(extra));
        assert!(out.status.success(), "{out:?}");
        let fifo = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON row"))
            .find(|r| r["order"] == "fifo")
            .expect("the fifo row");
        fifo["step_ms"].as_f64().expect("step_ms")
    };
    let (separate, shared) = (schedule(&[]), schedule(&["--cpu-replicas"]));
    if c.comm_slowdown.min(c.compute_slowdown) >= 1.0 {
        let slower = c.comm_slowdown.max(c.compute_slowdown) > 1.0;
        assert_eq!(shared > separate, slower, "{separate} / {shared} ms, {c:?}");
    }
}

/// The choices `--help` lists are the parsers': every preset of comm's registry with its help
/// line, each accepted by `predict --preset`; every algorithm under `predict --algo`.
#[test]
fn help_lists_the_presets_and_algorithms_the_parsers_accept() {
    let bench = |args: &[&str]| {
        let mut cmd = Command::new(BENCH);
        cmd.args(args);
        let w = stderr_writes(cmd);
        assert!(w.status.success(), "{args:?}: {}", w.all());
        w.stdout
    };
    // As one line of words: clap wraps the help to the terminal's width.
    let help = |sub: &str| {
        let text = bench(&[sub, "--help"]);
        text.split_whitespace().collect::<Vec<_>>().join(" ")
    };
    let (predict, sim) = (help("predict"), help("sim"));
    for preset in ddl_comm::cost::PRESETS {
        let line = format!("- {}: {}", preset.name, preset.help);
        assert!(predict.contains(&line), "{line} missing:\n{predict}");
        assert!(sim.contains(&line), "{line} missing:\n{sim}");
        let predicted = bench(&[
            "predict",
            "--algo",
            "ring",
            "--bytes",
            "4MiB",
            "--preset",
            preset.name,
        ]);
        assert!(
            predicted.contains("\"time_us\""),
            "{}: {predicted}",
            preset.name
        );
    }
    for name in ddl_comm::Algorithm::names() {
        assert!(predict.contains(name), "{name} missing:\n{predict}");
    }
}
