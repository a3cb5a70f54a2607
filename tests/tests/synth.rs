//! `ddl-synth` writes the ILSVRC layout of real, decodable, deterministic JPEGs.

use std::fs;
use std::process::Command;

use ddl_tests::{bin, run_ok, scratch};

fn synth(out: &std::path::Path, seed: u64) {
    run_ok(Command::new(bin("ddl-synth")).arg(out).args([
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
