//! A corrupt record under `mpirun -np 2 ddl-train` is never silent: each bad record is named
//! once (shard and record), counted per epoch in the epoch line and the metrics, listed at the
//! end; training replaces it (the default), evaluation never scores it, and `--on-bad-record
//! fail` stops the run naming it: the rank that met it first, then the other, told by it.
//! Nothing printed carries colour codes when stderr is a pipe.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ddl_loader::shard::ShardReader;
use ddl_tests::{mpirun_train, printed, run, run_ok, scratch, synth_and_pack, SynthSpec};
use serde_json::Value;

/// Flips a byte in the middle of record `record` of `shard`; returns the shard's path.
fn damage(shard: PathBuf, record: usize) -> PathBuf {
    let at = {
        let r = ShardReader::open(&shard).unwrap();
        let row = r.row(record);
        (r.header().data_offset + row.offset + u64::from(row.length) / 2) as usize
    };
    let mut bytes = fs::read(&shard).unwrap();
    bytes[at] ^= 0x5a;
    fs::write(&shard, bytes).unwrap();
    shard
}

fn train(shards: &Path, extra: &[&str]) -> std::process::Command {
    let mut cmd = mpirun_train(2, shards);
    cmd.args([
        "--image-size",
        "32",
        "--batch",
        "8",
        "--devices",
        "cpu:1",
        "--warmup-epochs",
        "0",
    ])
    .args(extra)
    // Warnings of the loader's own log show too, so that their colour can be checked.
    .env("RUST_LOG", "warn");
    cmd
}

#[test]
fn bad_records_are_named_counted_and_never_scored() {
    let tmp = scratch("bad-record");
    // 64 train records = 4 steps of 2 ranks x 8, so every record is used in every epoch; 16
    // val records = one batch of 8 per rank.
    let shards = synth_and_pack(
        tmp.path(),
        &SynthSpec {
            classes: 4,
            per_class: 16,
            val_per_class: 4,
            seed: 3,
            shards: 2,
            max_short_side: 40,
        },
    );
    let bad_train = damage(shards.join("train-00000.ddl"), 3);
    let bad_val = damage(shards.join("val-00001.ddl"), 1);

    let metrics = tmp.path().join("metrics.jsonl");
    let out = run_ok(
        train(&shards, &["--epochs", "2"])
            .arg("--metrics")
            .arg(&metrics),
    );
    let text = printed(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains('\x1b'), "colour codes in a pipe: {text}");
    for (shard, record) in [(&bad_train, 3), (&bad_val, 1)] {
        let named = format!("bad record: shard {} record {record}:", shard.display());
        assert_eq!(
            stderr.matches(&named).count(),
            1,
            "{named:?} must be printed exactly once: {text}"
        );
    }
    let epoch_lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with("epoch")).collect();
    assert_eq!(epoch_lines.len(), 2, "{text}");
    for l in &epoch_lines {
        assert!(
            l.contains("bad records: 1 in training, 1 left out of val"),
            "{l}\n{text}"
        );
    }
    assert!(
        stdout.contains("bad records: 2 distinct, met 2 time(s) in training and left out of evaluation 2 time(s)"),
        "no end-of-run summary: {text}"
    );
    let epochs: Vec<Value> = fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["type"] == "epoch")
        .collect();
    assert_eq!(epochs.len(), 2);
    for e in &epochs {
        assert_eq!(e["bad_records"], 1, "{e}");
        assert_eq!(e["val_bad_records"], 1, "{e}");
        // 16 val records, the bad one left out rather than scored through a stand-in.
        assert_eq!(e["val_images"], 15, "{e}");
    }

    // --on-bad-record fail: the run stops, naming the record.
    let begun = Instant::now();
    let out = run(&mut train(
        &shards,
        &[
            "--epochs",
            "1",
            "--no-eval",
            "--on-bad-record",
            "fail",
            "--comm-timeout",
            "60",
        ],
    ));
    let text = printed(&out);
    assert!(!out.status.success(), "{text}");
    let why = format!("{}: record 3: checksum mismatch", bad_train.display());
    assert!(
        text.contains(&why),
        "the failure must name the shard and record: {text}"
    );
    // The rank that met it tells the other, which stops at once naming it and the record
    // (before: it was killed without a word, or waited out --comm-timeout).
    let error_of = |rank: usize| {
        let head = format!("ddl-train (rank {rank}): error: ");
        text.lines().find_map(|l| l.strip_prefix(head.as_str()))
    };
    let failed = (0..2)
        .find(|&r| error_of(r).is_some_and(|e| e.contains(&why) && !e.contains("failed,")))
        .unwrap_or_else(|| panic!("no rank failed on its own: {text}"));
    let told =
        error_of(1 - failed).unwrap_or_else(|| panic!("the other rank said nothing: {text}"));
    assert!(
        told.contains(&format!("rank {failed} failed, and the job stops: ")) && told.contains(&why),
        "{text}"
    );
    assert!(
        begun.elapsed() < Duration::from_secs(45),
        "{:?}",
        begun.elapsed()
    );
}
