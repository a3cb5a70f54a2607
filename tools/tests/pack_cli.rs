//! Runs the `ddl-pack` binary: pack, verify, damage detection and exit statuses.

use std::path::Path;
use std::process::{Command, Output};

use ddl_testkit::{jpeg, scratch};

fn tree(root: &Path) {
    for (c, wnid) in ["n01000001", "n02000002"].iter().enumerate() {
        for i in 0..4u32 {
            let dir = root.join("train").join(wnid);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(
                dir.join(format!("{i}.JPEG")),
                jpeg(40 + i as usize * 30, 50, c * 10 + i as usize),
            )
            .unwrap();
        }
        let dir = root.join("val").join(wnid);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("v.JPEG"), jpeg(60, 60, 99)).unwrap();
    }
}

fn pack(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ddl-pack"))
        .args(args)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn pack_verify_and_detect_damage() {
    let tmp = scratch("pack-cli-ok");
    let root = tmp.path();
    let input = root.join("in");
    tree(&input);
    let out = root.join("out");
    let (i, o) = (input.to_str().unwrap(), out.to_str().unwrap());
    let r = pack(&[
        i,
        "-o",
        o,
        "--shards",
        "2",
        "--nodes",
        "2",
        "--max-short-side",
        "48",
    ]);
    assert!(r.status.success(), "{}", text(&r));
    assert!(
        text(&r).contains("train: 8 records in 2 shards"),
        "{}",
        text(&r)
    );
    let r = pack(&["--verify", o]);
    assert!(r.status.success(), "{}", text(&r));
    assert!(
        text(&r).contains("OK, 4 shards, 10 records"),
        "{}",
        text(&r)
    );

    // Flip one byte near the end of a shard (inside its last record).
    let shard = out.join("train-00001.ddl");
    let mut b = std::fs::read(&shard).unwrap();
    let n = b.len();
    b[n - 20] ^= 0x55;
    std::fs::write(&shard, &b).unwrap();
    let r = pack(&["--verify", o]);
    assert!(!r.status.success());
    let t = text(&r);
    assert!(
        t.contains("train-00001.ddl") && t.contains("record 3"),
        "{t}"
    );
}

#[test]
fn too_many_skips_fail_after_writing_the_report() {
    let tmp = scratch("pack-cli-skips");
    let root = tmp.path();
    let input = root.join("in");
    tree(&input);
    std::fs::write(input.join("train/n01000001/empty.JPEG"), b"").unwrap();
    let out = root.join("out");
    let (i, o) = (input.to_str().unwrap(), out.to_str().unwrap());
    let r = pack(&[i, "-o", o, "--shards", "1"]);
    assert!(!r.status.success());
    assert!(text(&r).contains("max-skip-fraction"), "{}", text(&r));
    let report = std::fs::read_to_string(out.join("pack-report.json")).unwrap();
    assert!(
        report.contains("empty.JPEG") && report.contains("zero-byte"),
        "{report}"
    );
    assert!(!out.join("manifest.json").exists());
    let r = pack(&[i, "-o", o, "--shards", "1", "--max-skip-fraction", "0.5"]);
    assert!(r.status.success(), "{}", text(&r));
    assert!(text(&r).contains("(1 kept)"), "{}", text(&r));
}

#[test]
fn an_empty_class_folder_is_refused_naming_it_and_kept_on_request() {
    let tmp = scratch("pack-cli-empty-class");
    let (root, input) = (tmp.path(), tmp.path().join("in"));
    tree(&input);
    // A third class, n03, sorts after the empty n02: it would have become label 1.
    for (split, name) in [("train", "0.JPEG"), ("val", "v.JPEG")] {
        let dir = input.join(split).join("n03000003");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), jpeg(50, 50, 3)).unwrap();
    }
    for f in std::fs::read_dir(input.join("train/n02000002")).unwrap() {
        std::fs::remove_file(f.unwrap().path()).unwrap();
    }
    let i = input.to_str().unwrap();
    let o = root.join("out");
    let r = pack(&[i, "-o", o.to_str().unwrap(), "--shards", "1"]);
    let all = text(&r);
    assert_eq!(r.status.code(), Some(1), "{all}");
    assert!(
        all.contains("n02000002") && all.contains("--keep-empty-classes"),
        "{all}"
    );
    assert!(!all.contains("not in --classes"), "{all}");
    let o = root.join("out-kept");
    let r = pack(&[
        i,
        "-o",
        o.to_str().unwrap(),
        "--shards",
        "1",
        "--keep-empty-classes",
    ]);
    let all = text(&r);
    assert!(r.status.success(), "{all}");
    assert!(
        all.contains("3 classes") && !all.contains("--classes"),
        "{all}"
    );
}

#[test]
fn bad_flags_are_refused() {
    let r = pack(&["in", "-o", "out", "--shards", "2", "--shard-size", "1GiB"]);
    assert_eq!(r.status.code(), Some(2), "{}", text(&r));
    let r = pack(&["in", "-o", "out", "--shard-size", "12 parsecs"]);
    assert_eq!(r.status.code(), Some(2), "{}", text(&r));
    let r = pack(&["in", "-o", "out", "--quality", "101"]);
    assert_eq!(r.status.code(), Some(2), "{}", text(&r));
    let r = pack(&["--verify", "/nonexistent-ddl-dir"]);
    assert!(!r.status.success());
    assert!(text(&r).contains("manifest.json"), "{}", text(&r));
}

#[test]
fn max_short_side_below_the_smallest_training_size_is_refused() {
    for side in ["1", "15"] {
        let r = pack(&["in", "-o", "out", "--max-short-side", side]);
        assert_eq!(r.status.code(), Some(2), "{}", text(&r));
        assert!(
            text(&r).contains("--max-short-side") && text(&r).contains("16"),
            "{}",
            text(&r)
        );
    }
}

#[test]
fn another_directory_is_refused_by_name_and_force_never_touches_foreign_files() {
    let tmp = scratch("pack-cli-foreign");
    let root = tmp.path();
    let input = root.join("in");
    tree(&input);
    let out = root.join("out");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("notes.txt"), b"my notes").unwrap();
    let (i, o) = (input.to_str().unwrap(), out.to_str().unwrap());
    let r = pack(&[i, "-o", o, "--shards", "1"]);
    assert_eq!(r.status.code(), Some(1), "{}", text(&r));
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(
        err.contains(o) && err.contains("notes.txt") && err.contains("pass --force"),
        "{err}"
    );
    // Refused before writing anything.
    let names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["notes.txt"]);
    let r = pack(&[i, "-o", o, "--shards", "1", "--force"]);
    assert!(r.status.success(), "{}", text(&r));
    assert!(
        text(&r).contains("left 1 file(s)") && text(&r).contains("notes.txt"),
        "{}",
        text(&r)
    );
    assert_eq!(std::fs::read(out.join("notes.txt")).unwrap(), b"my notes");
    let help = pack(&["--help"]);
    let h = String::from_utf8_lossy(&help.stdout);
    assert!(h.contains("--force") && h.contains("never touched"), "{h}");
}

#[test]
fn a_dangling_link_is_skipped_and_named() {
    let tmp = scratch("pack-cli-dangling");
    let root = tmp.path();
    let input = root.join("in");
    tree(&input);
    std::os::unix::fs::symlink(
        "/nonexistent/ddl-gone.JPEG",
        input.join("train/n01000001/gone.JPEG"),
    )
    .unwrap();
    let out = root.join("out");
    let (i, o) = (input.to_str().unwrap(), out.to_str().unwrap());
    let r = pack(&[i, "-o", o, "--shards", "1", "--max-skip-fraction", "0.2"]);
    assert!(r.status.success(), "{}", text(&r));
    let t = text(&r);
    assert!(
        t.contains("train: 8 records") && t.contains("gone.JPEG (unreadable: symbolic link to"),
        "{t}"
    );
}

#[test]
fn conflicting_or_bad_val_split_flags_are_refused_by_name() {
    let tmp = scratch("pack-cli-val-flags");
    let root = tmp.path();
    let input = root.join("in");
    tree(&input);
    let out = root.join("out");
    let (i, o) = (input.to_str().unwrap(), out.to_str().unwrap());
    for (args, code, flags) in [
        (
            &["--val-fraction", "0.1", "--val-per-class", "5"][..],
            2,
            &["--val-fraction", "--val-per-class"][..],
        ),
        (&["--val-seed", "3"], 2, &["--val-seed", "--val-fraction"]),
        (&["--val-fraction", "1.5"], 1, &["--val-fraction 1.5"]),
        (&["--val-per-class", "0"], 1, &["--val-per-class"]),
        // The input has a val split of its own.
        (&["--val-fraction", "0.1"], 1, &["--val-fraction", "val"]),
        (&["--min-per-class", "99"], 1, &["--min-per-class 99"]),
    ] {
        let r = pack(&[&[i, "-o", o][..], args].concat());
        assert_eq!(r.status.code(), Some(code), "{args:?}: {}", text(&r));
        for f in flags {
            assert!(text(&r).contains(f), "{args:?}: no {f:?} in {}", text(&r));
        }
    }
    assert!(!out.exists(), "a refused pack writes nothing");
}

#[test]
fn an_outer_tar_file_is_an_input_and_the_split_is_printed() {
    let tmp = scratch("pack-cli-outer-tar");
    let root = tmp.path();
    let mut outer = tar::Builder::new(Vec::new());
    for (c, wnid) in ["n01000001", "n02000002"].iter().enumerate() {
        let mut inner = tar::Builder::new(Vec::new());
        for k in 0..10 {
            let jpeg = jpeg(30, 30, c * 10 + k);
            let mut h = tar::Header::new_gnu();
            h.set_size(jpeg.len() as u64);
            h.set_cksum();
            inner
                .append_data(&mut h, format!("{wnid}_{k}.JPEG"), jpeg.as_slice())
                .unwrap();
        }
        let inner = inner.into_inner().unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_size(inner.len() as u64);
        h.set_cksum();
        outer
            .append_data(&mut h, format!("{wnid}.tar"), inner.as_slice())
            .unwrap();
    }
    let whole = root.join("fall11_whole.tar");
    std::fs::write(&whole, outer.into_inner().unwrap()).unwrap();
    let out = root.join("out");
    let (i, o) = (whole.to_str().unwrap(), out.to_str().unwrap());
    let r = pack(&[i, "-o", o, "--shards", "1", "--val-per-class", "3"]);
    assert!(r.status.success(), "{}", text(&r));
    let t = text(&r);
    assert!(
        t.contains("train: 14 records") && t.contains("val: 6 records"),
        "{t}"
    );
    assert!(t.contains("6 inputs to val, 14 to train"), "{t}");
}

#[test]
fn a_rerun_with_other_flags_is_refused_naming_both_packs_flags() {
    let tmp = scratch("pack-cli-other-flags");
    tree(&tmp.path().join("in"));
    let with_quality = |q: &str| {
        let dir = tmp.path();
        let (i, o) = (dir.join("in"), dir.join("out"));
        let args = [
            i.to_str().unwrap(),
            "-o",
            o.to_str().unwrap(),
            "--shards",
            "1",
        ];
        pack(&[&args[..], &["--quality", q]].concat())
    };
    let r = with_quality("90");
    assert!(r.status.success(), "{}", text(&r));
    let r = with_quality("80");
    assert_eq!(r.status.code(), Some(1), "{}", text(&r));
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(
        err.contains("packed from")
            && err.contains("--shards 1 --max-short-side 256 --quality 90 --nodes 1")
            && err.contains("--shards 1 --max-short-side 256 --quality 80 --nodes 1")
            && err.contains("pass --force"),
        "{err}"
    );
}

#[test]
fn order_class_fills_shards_class_by_class_and_is_another_pack() {
    let tmp = scratch("pack-cli-order");
    tree(&tmp.path().join("in"));
    let (i, o) = (tmp.path().join("in"), tmp.path().join("out"));
    let with = |extra: &[&str]| {
        let args = [
            i.to_str().unwrap(),
            "-o",
            o.to_str().unwrap(),
            "--shards",
            "2",
        ];
        pack(&[&args[..], extra].concat())
    };
    let r = with(&["--order", "class"]);
    assert!(r.status.success(), "{}", text(&r));
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(o.join("manifest.json")).unwrap()).unwrap();
    let order = manifest["pack"]["order"].as_str().unwrap();
    assert!(order.ends_with("(class order)"), "{order}");
    for (s, label) in [(0, 0), (1, 1)] {
        let shard =
            ddl_loader::shard::ShardReader::open(&o.join(format!("train-0000{s}.ddl"))).unwrap();
        assert!(
            (0..shard.len()).all(|r| shard.row(r).label == label),
            "shard {s}"
        );
    }
    // The default order is another pack, named by its flags.
    let r = with(&[]);
    assert_eq!(r.status.code(), Some(1), "{}", text(&r));
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(
        err.contains("--shards 2 --order class --max-short-side"),
        "{err}"
    );
    let r = with(&["--order", "sorted"]);
    assert_eq!(r.status.code(), Some(2), "{}", text(&r));
}
