//! `ddl-synth` writes the ILSVRC layout of real, decodable, deterministic JPEGs.

use std::fs;

use ddl_tests::{command, printed, run, run_ok, scratch};

fn synth(out: &std::path::Path, seed: u64) {
    run_ok(command("ddl-synth").arg(out).args([
        "--classes",
        "3",
        "--per-class",
        "4",
        "--val-per-class",
        "2",
        "--seed",
        &seed.to_string(),
    ]));
}

fn files(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((
                    p.strip_prefix(dir).unwrap().display().to_string(),
                    fs::read(&p).unwrap(),
                ));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn writes_ilsvrc_layout_with_labels() {
    let tmp = scratch("synth");
    let out = tmp.path().join("tree");
    synth(&out, 7);
    let all = files(&out);
    let train: Vec<_> = all
        .iter()
        .filter(|(p, _)| p.starts_with("train/"))
        .collect();
    let val: Vec<_> = all
        .iter()
        .filter(|(p, _)| p.starts_with("val/ILSVRC2012_val_"))
        .collect();
    assert_eq!(train.len(), 12);
    assert_eq!(val.len(), 6);
    for (path, bytes) in train.iter().chain(val.iter()) {
        assert!(path.ends_with(".JPEG"), "{path}");
        assert_eq!(&bytes[..2], &[0xFF, 0xD8], "{path} is not a JPEG");
        let img = image::load_from_memory(bytes).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(
            (200..=500).contains(&img.width()) && (200..=500).contains(&img.height()),
            "{path}"
        );
    }
    // Training files sit in their class folder and are named after it.
    for (path, _) in &train {
        let parts: Vec<_> = path.split('/').collect();
        assert!(parts[2].starts_with(parts[1]), "{path}");
    }
    let csv = fs::read_to_string(out.join("LOC_val_solution.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("ImageId,PredictionString"));
    let rows: Vec<_> = lines.collect();
    assert_eq!(rows.len(), 6);
    let classes: std::collections::BTreeSet<_> = rows
        .iter()
        .map(|r| {
            r.split(',')
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap()
        })
        .collect();
    assert_eq!(classes.len(), 3, "every class has validation images");
}

#[test]
fn same_seed_same_bytes_other_seed_other_bytes() {
    let tmp = scratch("synth-det");
    synth(&tmp.path().join("a"), 3);
    synth(&tmp.path().join("b"), 3);
    synth(&tmp.path().join("c"), 4);
    let (a, b, c) = (
        files(&tmp.path().join("a")),
        files(&tmp.path().join("b")),
        files(&tmp.path().join("c")),
    );
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn tars_layout_is_22k_style_and_packs_with_its_odd_members_handled() {
    let tmp = scratch("synth-tars");
    let out = tmp.path().join("tars");
    let synth = run_ok(command("ddl-synth").arg(&out).args([
        "--layout",
        "tars",
        "--classes",
        "4",
        "--per-class",
        "6",
        "--min-side",
        "40",
        "--max-side",
        "60",
    ]));
    // It says what packing its deliberately damaged member takes (the pack below uses it).
    let note = printed(&synth);
    assert!(
        note.contains("n10001000_truncated.JPEG is cut short on purpose")
            && note.contains("pack this tree with --max-skip-fraction 0.1"),
        "{note}"
    );
    let all = files(&out);
    let names: Vec<&str> = all.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        names,
        [
            "n10000000.tar",
            "n10001000.tar",
            "n10002000.tar",
            "n10003000.tar"
        ],
        "one tar per synset, no val split"
    );
    let mut sizes = Vec::new();
    for (name, bytes) in &all {
        let mut members = Vec::new();
        for e in tar::Archive::new(bytes.as_slice()).entries().unwrap() {
            members.push(e.unwrap().path().unwrap().display().to_string());
        }
        sizes.push(members.iter().filter(|m| m.ends_with(".JPEG")).count());
        let wnid = name.trim_end_matches(".tar");
        assert!(members.iter().all(|m| m.starts_with(wnid)), "{members:?}");
    }
    // Uneven class sizes around --per-class (odd members included: a PNG and a cut-short JPEG
    // named .JPEG, and one text file).
    assert!(sizes.iter().all(|n| (3..=11).contains(n)), "{sizes:?}");
    assert!(sizes.iter().any(|&n| n != sizes[0]), "{sizes:?}");

    let r = run_ok(
        command("ddl-pack")
            .arg(&out)
            .arg("-o")
            .arg(tmp.path().join("shards"))
            .args(["--shards", "1", "--val-per-class", "1"])
            .args(["--max-short-side", "32", "--max-skip-fraction", "0.1"]),
    );
    let report: serde_json::Value =
        serde_json::from_slice(&fs::read(tmp.path().join("shards/pack-report.json")).unwrap())
            .unwrap();
    let skipped = report["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 1, "{}", printed(&r));
    assert!(skipped[0]["path"]
        .as_str()
        .unwrap()
        .ends_with("_truncated.JPEG"));
    let ignored = report["ignored_files"].as_array().unwrap();
    assert_eq!(ignored.len(), 1);
    assert!(ignored[0]["path"].as_str().unwrap().ends_with("_notes.txt"));
    let images: u64 = sizes.iter().map(|&n| n as u64).sum();
    let records = report["splits"]["train"]["records"].as_u64().unwrap()
        + report["splits"]["val"]["records"].as_u64().unwrap();
    assert_eq!(
        records,
        images - 1,
        "the PNG is converted, the cut JPEG skipped"
    );
    assert_eq!(report["val_split"]["val_inputs"], 4, "one per class");

    let r = run(command("ddl-synth").arg(tmp.path().join("x")).args([
        "--layout",
        "tars",
        "--val-per-class",
        "2",
    ]));
    assert!(!r.status.success());
    assert!(printed(&r).contains("--val-per-class"), "{}", printed(&r));
}
