//! `ddl-prof` end to end on a small generated shard set: the JSON schema, the Chrome trace,
//! the plots, `--cold`, flag checks before measuring, bad records, and `ddl-prof plot` on a
//! metrics file.

use std::path::Path;
use std::process::Command;

use ddl_loader::shard::{cached_bytes, ShardReader};
use ddl_testkit::launch::{self, mpirun};
use ddl_testkit::{jpeg, scratch, write_manifest, write_shards, Record};
use serde_json::Value;

const PROF: &str = env!("CARGO_BIN_EXE_ddl-prof");

/// Packs `shards` train shards of `per_shard` JPEGs (4 classes) into `dir` with a manifest.
fn make_shards(dir: &Path, shards: usize, per_shard: usize) {
    make_shards_with_junk(dir, shards, per_shard, &[]);
}

/// [`make_shards`], where records numbered in `junk` hold bytes that are not an image (with a
/// valid checksum).
fn make_shards_with_junk(dir: &Path, shards: usize, per_shard: usize, junk: &[usize]) {
    let records: Vec<Vec<Record>> = (0..shards)
        .map(|s| {
            (0..per_shard)
                .map(|k| {
                    let n = s * per_shard + k;
                    let (iw, ih) = (160 + (n * 37) % 200, 140 + (n * 53) % 180);
                    let label = (n % 4) as u32;
                    if junk.contains(&n) {
                        Record {
                            bytes: b"this record is not a JPEG".to_vec(),
                            label,
                            size: (ih as u16, iw as u16),
                        }
                    } else {
                        Record::jpeg(jpeg(iw, ih, n), label)
                    }
                })
                .collect()
        })
        .collect();
    let split = write_shards(dir, "train", &records, shards);
    write_manifest(dir, 4, vec![("train", split)], shards);
}

fn run(args: &[&str]) -> std::process::Output {
    let out = Command::new(PROF).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ddl-prof {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    out
}

fn positive(v: &Value, key: &str) -> f64 {
    let x = v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} missing in {v}"));
    assert!(x > 0.0 && x.is_finite(), "{key} = {x} in {v}");
    x
}

#[test]
fn profile_json_trace_and_plots() {
    let tmp = scratch("prof-main");
    let dir = tmp.path();
    let shards = dir.join("shards");
    std::fs::create_dir_all(&shards).unwrap();
    make_shards(&shards, 2, 24);
    let (json, svg, png, trace) = (
        dir.join("prof.json"),
        dir.join("prof.svg"),
        dir.join("prof.png"),
        dir.join("trace.json"),
    );
    let out = run(&[
        shards.to_str().unwrap(),
        "--threads",
        "1,2",
        "--batch",
        "8",
        "--image-size",
        "64",
        "--seconds",
        "0.4",
        "--stage-seconds",
        "0.1",
        "--json",
        json.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
        "--trace",
        trace.to_str().unwrap(),
        "--gpu-rate",
        "50",
    ]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    let verdict_line = stdout.lines().last().unwrap();
    assert!(verdict_line.starts_with("verdict: "), "{stdout}");
    assert!(
        verdict_line.contains("bottleneck") && verdict_line.contains("GPU"),
        "{verdict_line}"
    );

    // JSON schema: every stage at every thread count, units, positive figures.
    let v: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["schema_version"], 1);
    for k in ["images_per_s", "bytes_per_s", "seconds", "file_bytes"] {
        assert!(v["units"][k].is_string(), "unit of {k}");
    }
    assert_eq!(v["units"]["images_per_s"], "images/s");
    assert_eq!(v["dataset"]["records"], 48);
    assert_eq!(v["dataset"]["shards"], 2);
    positive(&v["dataset"], "mean_record_bytes");
    positive(&v["dataset"], "file_bytes");
    assert_eq!(v["config"]["threads"], serde_json::json!([1, 2]));
    let stages = v["stages"].as_array().unwrap();
    let names = [
        "read",
        "check",
        "decode_full",
        "decode_scaled",
        "decode_region",
        "crop_resize",
        "normalize",
        "queue",
    ];
    assert_eq!(stages.len(), names.len() * 2);
    for name in names {
        for t in [1, 2] {
            let r = stages
                .iter()
                .find(|r| r["stage"] == name && r["threads"] == t)
                .unwrap_or_else(|| panic!("no {name} at {t} threads"));
            positive(r, "images_per_s");
            positive(r, "bytes_per_s");
            positive(r, "seconds");
            assert!(r["images"].as_u64().unwrap() > 0);
            assert!(r["bytes_basis"].is_string() && r["method"].is_string());
        }
    }
    let e2e = v["end_to_end"].as_array().unwrap();
    assert_eq!(e2e.len(), 2);
    for r in e2e {
        let rate = positive(r, "images_per_s");
        let (images, secs) = (r["images"].as_f64().unwrap(), positive(r, "seconds"));
        assert!((rate - images / secs).abs() < 1e-6 * rate);
        assert_eq!(
            r["images"].as_u64().unwrap(),
            8 * r["batches"].as_u64().unwrap()
        );
        positive(r, "speedup");
        positive(r, "efficiency");
        assert_eq!(r["skipped"], 0);
    }
    let verdict = &v["verdict"];
    assert_eq!(verdict["threads"], 2);
    assert_eq!(verdict["node_images_per_s"], e2e[1]["images_per_s"]);
    assert!(names.contains(&verdict["bottleneck"].as_str().unwrap()));
    positive(verdict, "bottleneck_images_per_s");
    positive(verdict, "predicted_images_per_s");
    let exact = positive(verdict, "gpus_fed_exact");
    assert_eq!(verdict["gpus_fed"].as_f64().unwrap(), exact.floor());
    let share: f64 = verdict["time_share"]
        .as_object()
        .unwrap()
        .values()
        .map(|x| x.as_f64().unwrap())
        .sum();
    assert!((share - 1.0).abs() < 1e-6);
    assert_eq!(verdict["line"].as_str().unwrap(), verdict_line);
    assert!(v["cold"].is_null());

    // Chrome trace: valid JSON, required keys, decode spans from the profiler's workers.
    let t: Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let events = t["traceEvents"].as_array().unwrap();
    let mut decode_tids = std::collections::BTreeSet::new();
    for e in events {
        for k in ["name", "ph", "pid", "tid"] {
            assert!(e.get(k).is_some(), "{e} lacks {k}");
        }
        match e["ph"].as_str().unwrap() {
            "X" => {
                assert!(e["cat"].is_string());
                assert!(e["ts"].as_f64().unwrap() >= 0.0);
                assert!(e["dur"].as_f64().unwrap() >= 0.0);
                if e["name"] == "decode_region" {
                    decode_tids.insert(e["tid"].as_u64().unwrap());
                }
            }
            "M" => assert!(e["args"]["name"].is_string()),
            other => panic!("unexpected phase {other}"),
        }
    }
    assert!(decode_tids.len() >= 2, "decode spans from {decode_tids:?}");
    assert!(events
        .iter()
        .any(|e| e["name"] == "end_to_end" && e["args"]["threads"] == 2));
    assert!(events
        .iter()
        .any(|e| e["name"] == "thread_name" && e["args"]["name"] == "main"));

    // Plots.
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(s.contains("<svg") && s.contains("end_to_end") && s.contains("decode_region"));
    run(&[
        shards.to_str().unwrap(),
        "--threads",
        "1",
        "--batch",
        "8",
        "--image-size",
        "64",
        "--seconds",
        "0.2",
        "--stage-seconds",
        "0.05",
        "--eval",
        "--quiet",
        "--plot",
        png.to_str().unwrap(),
    ]);
    let p = std::fs::read(&png).unwrap();
    assert!(p.len() > 1000 && p.starts_with(b"\x89PNG\r\n\x1a\n"));
}

#[test]
fn cold_run_drops_pages_and_reads_once() {
    let tmp = scratch("prof-cold");
    let dir = tmp.path();
    make_shards(dir, 1, 20);
    let shard = dir.join("train-00000.ddl");
    // Precondition: the shard is in the page cache, so a drop has something to drop.
    std::hint::black_box(std::fs::read(&shard).unwrap());
    let file_bytes = std::fs::metadata(&shard).unwrap().len();
    assert_eq!(cached_bytes(&shard).unwrap(), file_bytes);
    let json = dir.join("cold.json");
    run(&[
        dir.to_str().unwrap(),
        "--threads",
        "1",
        "--batch",
        "4",
        "--image-size",
        "48",
        "--seconds",
        "0.2",
        "--stage-seconds",
        "0.5",
        "--cold",
        "--quiet",
        "--json",
        json.to_str().unwrap(),
    ]);
    let v: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["config"]["cold"], true);
    let cold = &v["cold"];
    assert_eq!(cold["files"], 1);
    assert_eq!(cold["file_bytes"], file_bytes);
    // Every page was resident before the drop and none after it (mincore, not clamped).
    assert_eq!(cold["resident_bytes_before"], file_bytes);
    assert_eq!(cold["resident_bytes_after"], 0, "{cold}");
    let read = v["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["stage"] == "read")
        .unwrap()
        .clone();
    // Each record read at most once, whatever the timing.
    let images = read["images"].as_u64().unwrap();
    assert!((1..=20).contains(&images), "{read}");
    assert!(read["method"].as_str().unwrap().contains("cold"));
    // What the stage read came from storage, not from the page cache.
    let bytes = read["bytes_per_s"].as_f64().unwrap() * read["seconds"].as_f64().unwrap();
    let storage = read["storage_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no storage_bytes (/proc/self/io) in {read}"));
    assert!(
        storage as f64 >= 0.99 * bytes && bytes > 0.0,
        "read {bytes} bytes but only {storage} from storage: {read}"
    );
}

#[test]
fn plot_training_metrics() {
    let tmp = scratch("prof-metrics");
    let dir = tmp.path();
    let metrics = dir.join("metrics.jsonl");
    let mut text = String::new();
    for step in 1..=30u32 {
        let epoch = (step - 1) / 10;
        text.push_str(&format!(
            "{{\"type\":\"step\",\"step\":{step},\"epoch\":{epoch},\"loss\":{},\"lr\":0.1,\"images_per_s\":{},\"data_wait_s\":0.01,\"compute_s\":0.2,\"allreduce_s\":0.04}}\n",
            3.0 / step as f64,
            900.0 + step as f64
        ));
        if step % 10 == 0 {
            text.push_str(&format!(
                "{{\"type\":\"epoch\",\"epoch\":{epoch},\"train_loss\":{},\"val_loss\":1.0,\"val_top1\":{},\"val_top5\":{},\"epoch_s\":3.0,\"images_per_s\":910.0,\"data_wait_frac\":0.04,\"allreduce_frac\":0.16,\"steps\":10}}\n",
                2.0 / (epoch + 1) as f64,
                0.2 * (epoch + 1) as f64,
                0.3 * (epoch + 1) as f64
            ));
        }
    }
    std::fs::write(&metrics, text).unwrap();
    let svg = dir.join("curves.svg");
    let out = run(&[
        "plot",
        metrics.to_str().unwrap(),
        "-o",
        svg.to_str().unwrap(),
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("30 step and 3 epoch points"));
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(s.contains("<svg") && s.contains("validation accuracy") && s.contains("data wait"));
    let png = dir.join("curves.png");
    run(&[
        "plot",
        metrics.to_str().unwrap(),
        "-o",
        png.to_str().unwrap(),
    ]);
    assert!(std::fs::read(&png).unwrap().starts_with(b"\x89PNG"));

    // A broken file is an error naming the line.
    std::fs::write(
        &metrics,
        "{\"type\":\"step\",\"step\":1,\"loss\":1}\n{oops\n",
    )
    .unwrap();
    let out = Command::new(PROF)
        .args([
            "plot",
            metrics.to_str().unwrap(),
            "-o",
            svg.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 2"));
}

#[test]
fn bad_arguments_are_clear_errors() {
    let tmp = scratch("prof-nosplit");
    let dir = tmp.path();
    make_shards(dir, 1, 4);
    let out = Command::new(PROF)
        .args([dir.to_str().unwrap(), "--split", "val", "--seconds", "0.1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no split \"val\"") && err.contains("train"),
        "{err}"
    );
    let out = Command::new(PROF)
        .args([dir.to_str().unwrap(), "--batch", "5", "--seconds", "0.1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("4 records of split train, fewer than one batch of 5"),
        "{err}"
    );
    let out = Command::new(PROF)
        .args([dir.to_str().unwrap(), "--plot", "curves.jpg"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("must end in .svg or .png"));
}

#[test]
fn mpirun_profiles_every_rank() {
    let tmp = scratch("prof-mpi");
    let dir = tmp.path();
    make_shards(dir, 4, 8);
    let json = dir.join("nodes.json");
    let out = launch::run(mpirun(2).arg(PROF).args([
        dir.to_str().unwrap(),
        "--threads",
        "1",
        "--batch",
        "4",
        "--image-size",
        "48",
        "--seconds",
        "0.2",
        "--stage-seconds",
        "0.05",
        "--json",
        json.to_str().unwrap(),
    ]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("slowest node:"), "{stdout}");
    let v: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let nodes = v["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 2);
    for (rank, n) in nodes.iter().enumerate() {
        assert_eq!(n["dataset"]["node"], rank);
        assert_eq!(n["dataset"]["nodes"], 2);
        // Shards 0, 2 on rank 0 and 1, 3 on rank 1: 16 records each.
        assert_eq!(n["dataset"]["records"], 16);
        positive(&n["verdict"], "node_images_per_s");
    }
}

#[test]
fn every_flag_is_checked_before_anything_is_measured() {
    let tmp = scratch("prof-flags");
    let dir = tmp.path();
    make_shards(dir, 1, 8);
    let d = dir.to_str().unwrap();
    let missing = dir.join("no-such-dir").join("prof.json");
    for (args, status, needle) in [
        (vec!["--prefetch", "0"], 2, "--prefetch"),
        (vec!["--seconds", "0"], 2, "--seconds"),
        (vec!["--stage-seconds=-1"], 2, "--stage-seconds"),
        (vec!["--batch", "0"], 2, "--batch"),
        (vec!["--threads", "1,0"], 2, "--threads"),
        (vec!["--gpu-rate", "nan"], 2, "--gpu-rate"),
        (vec!["--image-size", "8"], 2, "--image-size"),
        (vec!["--sample-records", "0"], 2, "--sample-records"),
        // The loader's limits and memory check, shared with ddl-train and ddl.Loader (just
        // above the limits: without them the run would be short, not a hang).
        (
            vec!["--threads", "1,1025"],
            1,
            "--threads: 1025 is above the limit of 1024",
        ),
        (
            vec!["--prefetch", "1025"],
            1,
            "--prefetch: 1025 is above the limit of 1024",
        ),
        (
            vec!["--image-size", "20000", "--batch", "64"],
            1,
            "MemAvailable",
        ),
        (vec!["--on-bad-record", "ignore"], 2, "--on-bad-record"),
        (
            vec!["--node", "2", "--nodes", "2"],
            1,
            "--node 2 must be below --nodes 2",
        ),
        (vec!["--json", missing.to_str().unwrap()], 1, "--json"),
    ] {
        // The small defaults of this test, but not those the case sets itself (clap refuses a
        // flag given twice, which would pass the case for the wrong reason).
        let base = [
            ("--threads", "1"),
            ("--batch", "4"),
            ("--image-size", "32"),
            ("--seconds", "0.2"),
            ("--stage-seconds", "0.05"),
        ];
        let given = |flag: &str| args.iter().any(|a| a.split('=').next() == Some(flag));
        let out = Command::new(PROF)
            .arg(d)
            .args(
                base.iter()
                    .filter(|(f, _)| !given(f))
                    .flat_map(|(f, v)| [*f, *v]),
            )
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(status), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        // Refused before the first measurement: no progress line ("STAGE threads T: R
        // images/s ...") was printed (the refusal itself may name images/s as a unit).
        let progress = err
            .lines()
            .any(|l| l.contains(" threads ") && l.contains(" images/s"));
        assert!(!progress, "{args:?} measured first: {err}");
    }
}

/// Flips a byte in the middle of record `record` of `shard`, so its checksum fails.
fn damage_record(shard: &Path, record: usize) {
    let r = ShardReader::open(shard).unwrap();
    let row = r.row(record);
    let at = (r.header().data_offset + row.offset) as usize + row.length as usize / 2;
    drop(r);
    let mut b = std::fs::read(shard).unwrap();
    b[at] ^= 0x5A;
    std::fs::write(shard, &b).unwrap();
}

#[test]
fn bad_records_are_reported_or_fail_as_the_flag_says() {
    let tmp = scratch("prof-bad");
    let dir = tmp.path();
    // Record 5 is not a JPEG (checksum valid); record 12 is damaged on disk.
    make_shards_with_junk(dir, 1, 24, &[5]);
    damage_record(&dir.join("train-00000.ddl"), 12);
    let d = dir.to_str().unwrap();
    let json = dir.join("bad.json");
    let args = [
        "--threads",
        "1",
        "--batch",
        "4",
        "--image-size",
        "32",
        "--seconds",
        "0.3",
        "--stage-seconds",
        "0.05",
        "--quiet",
    ];
    for mode in [None, Some("skip"), Some("replace")] {
        let mut cmd = Command::new(PROF);
        cmd.arg(d).args(args).arg("--json").arg(&json);
        if let Some(m) = mode {
            cmd.args(["--on-bad-record", m]);
        }
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{mode:?}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        assert_eq!(v["config"]["on_bad_record"], mode.unwrap_or("replace"));
        let bad = &v["bad_records"];
        assert_eq!(bad["count"], 2, "{mode:?}: {bad}");
        let mut named: Vec<(String, u64)> = bad["first"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| {
                (
                    b["file"].as_str().unwrap().to_string(),
                    b["record"].as_u64().unwrap(),
                )
            })
            .collect();
        named.sort_by_key(|n| n.1);
        assert_eq!(named.len(), 2, "{bad}");
        assert!(
            named.iter().all(|(f, _)| f.ends_with("train-00000.ddl")),
            "{bad}"
        );
        assert_eq!((named[0].1, named[1].1), (5, 12), "{bad}");
        assert!(stdout.contains("bad records: 2 met"), "{stdout}");
        assert!(
            stdout.contains("train-00000.ddl record 12: checksum mismatch"),
            "{stdout}"
        );
        assert!(
            stdout.contains("train-00000.ddl record 5: cannot decode"),
            "{stdout}"
        );
        // The verdict stays the last line.
        assert!(
            stdout.lines().last().unwrap().starts_with("verdict: "),
            "{stdout}"
        );
    }
    let out = Command::new(PROF)
        .arg(d)
        .args(args)
        .args(["--on-bad-record", "fail"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("train-00000.ddl: record ") && err.contains("ddl-pack --verify"),
        "{err}"
    );
}
