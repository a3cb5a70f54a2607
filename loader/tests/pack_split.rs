//! ImageNet-22k packing on tiny generated per-synset tars: the held-out split
//! (`--val-fraction`, `--val-per-class`), `--min-per-class`, and an outer tar given as the input
//! file. Which image went to which split is read back from the shards themselves: every member
//! is a distinct small JPEG that the packer stores byte for byte.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use ddl_loader::manifest::Manifest;
use ddl_loader::pack::split::{ValRule, ValSplit};
use ddl_loader::pack::{
    self, NoProgress, OutputConflict, PackOption, PackOptions, PackReport, PackedBy, ShardCount,
};
use ddl_loader::shard::ShardReader;
use ddl_loader::LoaderError;

use common::tar_of;

/// Synsets of the test input and their sizes (uneven, one below the `--min-per-class` used).
const SYNSETS: [(&str, usize); 5] = [
    ("n04000004", 40),
    ("n01000001", 25),
    ("n03000003", 4),
    ("n02000002", 33),
    ("n05000005", 18),
];

/// Member bytes -> (wnid, member name), for every member generated.
type Members = BTreeMap<Vec<u8>, (String, String)>;

/// The tar of synset `k` (`n` < 50 distinct 20x24 JPEGs), recording its members in `members`.
fn synset_tar(k: usize, wnid: &str, n: usize, members: &mut Members) -> Vec<u8> {
    let entries: Vec<(String, Vec<u8>)> = (0..n)
        .map(|i| {
            let jpeg = ddl_testkit::jpeg(20, 24, k * 50 + i);
            let name = format!("{wnid}_{i}.JPEG");
            members.insert(jpeg.clone(), (wnid.to_string(), name.clone()));
            (name, jpeg)
        })
        .collect();
    tar_of(&entries)
}

/// Writes `synsets` as `<wnid>.tar` files in `dir`, and as one outer tar holding them in the
/// reverse order (returned).
fn write_input(dir: &Path, synsets: &[(&str, usize)], members: &mut Members) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let mut inner = Vec::new();
    for (k, (wnid, n)) in synsets.iter().enumerate() {
        let t = synset_tar(k, wnid, *n, members);
        std::fs::write(dir.join(format!("{wnid}.tar")), &t).unwrap();
        inner.push((format!("{wnid}.tar"), t));
    }
    inner.reverse();
    let outer = dir.with_extension("whole.tar");
    std::fs::write(&outer, tar_of(&inner)).unwrap();
    outer
}

fn opts(input: &Path, output: &Path, rule: ValRule) -> PackOptions {
    let mut o = crate::common::small_pack(input, output, 2);
    o.val_split = Some(ValSplit { rule, seed: 7 });
    o
}

fn run(o: &PackOptions) -> PackReport {
    pack::pack(o, &NoProgress).unwrap()
}

/// Split -> the (wnid, member name) of every record stored, checked against its label.
fn splits_of(out: &Path, members: &Members) -> BTreeMap<String, BTreeSet<(String, String)>> {
    let m = Manifest::load(out).unwrap();
    let mut got = BTreeMap::new();
    for (split, info) in &m.splits {
        let set: &mut BTreeSet<_> = got.entry(split.clone()).or_default();
        for sh in &info.shards {
            let r = ShardReader::open(&out.join(&sh.file)).unwrap();
            for i in 0..r.len() {
                let rec = r.record(i).unwrap();
                let (wnid, name) = members
                    .get(rec.bytes)
                    .expect("a record stored byte for byte");
                assert_eq!(m.classes[rec.label as usize].wnid, *wnid, "{name}");
                assert!(set.insert((wnid.clone(), name.clone())), "{name} twice");
            }
        }
    }
    got
}

#[test]
fn held_out_split_ignores_threads_shards_tar_order_and_the_outer_tar() {
    let tmp = ddl_testkit::scratch("split-determinism");
    let mut members = Members::new();
    let dir = tmp.path().join("tars");
    let outer = write_input(&dir, &SYNSETS, &mut members);
    let all: BTreeSet<(String, String)> = members.values().cloned().collect();
    for rule in [ValRule::Fraction(0.25), ValRule::PerClass(5)] {
        let mut seen = Vec::new();
        for (k, (input, threads, shards)) in [(&dir, 1, 2), (&dir, 2, 5), (&outer, 2, 3)]
            .into_iter()
            .enumerate()
        {
            let out = tmp.path().join(format!("out-{k}-{rule:?}"));
            let mut o = opts(input, &out, rule);
            o.threads = threads;
            o.shards = ShardCount::Count(shards);
            let rep = run(&o);
            let got = splits_of(&out, &members);
            let (train, val) = (&got["train"], &got["val"]);
            assert!(train.is_disjoint(val));
            assert_eq!(train.union(val).cloned().collect::<BTreeSet<_>>(), all);
            let v = rep.val_split.as_ref().unwrap();
            assert_eq!(
                (v.train_inputs, v.val_inputs),
                (train.len() as u64, val.len() as u64)
            );
            let m = Manifest::load(&out).unwrap();
            assert_eq!(m.pack["val_split"]["seed"], 7);
            assert_eq!(m.pack["val_split"]["val_inputs"], val.len());
            seen.push(got);
        }
        assert_eq!(seen[0], seen[1], "{rule:?}: threads and --shards");
        assert_eq!(seen[0], seen[2], "{rule:?}: outer tar in reverse order");
        let val = &seen[0]["val"];
        match rule {
            ValRule::Fraction(_) => assert!((20..=36).contains(&val.len()), "{}", val.len()),
            ValRule::PerClass(n) => {
                for (wnid, size) in SYNSETS {
                    let held = val.iter().filter(|(w, _)| w == wnid).count();
                    assert_eq!(held, (n as usize).min(size - 1), "{wnid}");
                }
            }
        }
    }
}

#[test]
fn adding_a_synset_moves_no_other_image() {
    let tmp = ddl_testkit::scratch("split-stable");
    let mut members = Members::new();
    let small = tmp.path().join("small");
    write_input(&small, &SYNSETS[..4], &mut members);
    let big = tmp.path().join("big");
    write_input(&big, &SYNSETS, &mut members);
    for rule in [ValRule::Fraction(0.3), ValRule::PerClass(3)] {
        let a = tmp.path().join(format!("a-{rule:?}"));
        let b = tmp.path().join(format!("b-{rule:?}"));
        run(&opts(&small, &a, rule));
        run(&opts(&big, &b, rule));
        let (a, b) = (splits_of(&a, &members), splits_of(&b, &members));
        for split in ["train", "val"] {
            let old: BTreeSet<_> = b[split]
                .iter()
                .filter(|(w, _)| *w != SYNSETS[4].0)
                .cloned()
                .collect();
            assert_eq!(a[split], old, "{rule:?} {split}");
        }
        assert!(b["val"].iter().any(|(w, _)| w == SYNSETS[4].0));
    }
}

#[test]
fn min_per_class_drops_small_synsets_and_classes_still_orders() {
    let tmp = ddl_testkit::scratch("split-min");
    let mut members = Members::new();
    let dir = tmp.path().join("tars");
    write_input(&dir, &SYNSETS, &mut members);
    let out = tmp.path().join("out");
    let mut o = opts(&dir, &out, ValRule::Fraction(0.2));
    o.min_per_class = 20;
    let rep = run(&o);
    let m = Manifest::load(&out).unwrap();
    let wnids: Vec<&str> = m.classes.iter().map(|c| c.wnid.as_str()).collect();
    assert_eq!(wnids, ["n01000001", "n02000002", "n04000004"]);
    let dropped: Vec<(&str, u64)> = rep
        .dropped_classes
        .iter()
        .map(|(w, n)| (w.as_str(), *n))
        .collect();
    assert_eq!(dropped, [("n03000003", 4), ("n05000005", 18)]);
    assert!(rep.ignored_classes.is_empty());
    assert_eq!(m.pack["min_per_class"], 20);
    let got = splits_of(&out, &members);
    assert_eq!(got["train"].len() + got["val"].len(), 25 + 33 + 40);

    // --classes restricts and orders; a listed class below the minimum is dropped too.
    let list = tmp.path().join("classes.txt");
    std::fs::write(&list, "n05000005\nn03000003\nn04000004\n").unwrap();
    let out = tmp.path().join("out-listed");
    o.output = out.clone();
    o.classes = Some(list);
    o.min_per_class = 10;
    let rep = run(&o);
    let m = Manifest::load(&out).unwrap();
    let wnids: Vec<&str> = m.classes.iter().map(|c| c.wnid.as_str()).collect();
    assert_eq!(wnids, ["n05000005", "n04000004"]);
    assert_eq!(
        rep.dropped_classes.keys().collect::<Vec<_>>(),
        ["n03000003"]
    );
    assert_eq!(rep.ignored_classes.len(), 2);
}

#[test]
fn a_split_is_refused_where_the_input_has_one_or_the_value_is_bad() {
    let tmp = ddl_testkit::scratch("split-refused");
    let input = tmp.path().join("in");
    for split in ["train", "val"] {
        let d = input.join(split).join("n01000001");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("a.JPEG"), ddl_testkit::jpeg(20, 20, 1)).unwrap();
    }
    let out = tmp.path().join("out");
    let e = pack::pack(&opts(&input, &out, ValRule::PerClass(1)), &NoProgress).unwrap_err();
    assert!(
        matches!(&e, LoaderError::Option { source, .. }
            if source.option == PackOption::ValPerClass
                && source.problem.contains("this input has one")),
        "{e}"
    );
    for (rule, option) in [
        (ValRule::Fraction(0.0), PackOption::ValFraction),
        (ValRule::Fraction(1.0), PackOption::ValFraction),
        (ValRule::PerClass(0), PackOption::ValPerClass),
    ] {
        let e = pack::pack(&opts(&input, &out, rule), &NoProgress).unwrap_err();
        assert!(
            matches!(&e, LoaderError::Option { source, .. } if source.option == option),
            "{rule:?}: {e}"
        );
    }
    assert!(!out.exists(), "nothing written for a refused pack");
    // An input file that is not a tar.
    let e = pack::pack(
        &opts(
            &input.join("train/n01000001/a.JPEG"),
            &out,
            ValRule::PerClass(1),
        ),
        &NoProgress,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("neither a directory, a tar"), "{e}");
}

#[test]
fn a_rerun_resumes_and_other_split_flags_are_another_pack() {
    let tmp = ddl_testkit::scratch("split-resume");
    let mut members = Members::new();
    let dir = tmp.path().join("tars");
    let outer = write_input(&dir, &SYNSETS, &mut members);
    let out = tmp.path().join("out");
    let mut o = opts(&outer, &out, ValRule::Fraction(0.25));
    o.min_per_class = 5;
    let first = run(&o);
    let want = splits_of(&out, &members);
    let rep = run(&o);
    for split in ["train", "val"] {
        let s = &rep.splits[split];
        assert_eq!(s.shards_kept, s.shards, "{split}: every shard kept");
    }
    assert_eq!(rep.val_split, first.val_split);
    assert_eq!(splits_of(&out, &members), want);

    // Another fraction or seed is another pack: refused, naming the options of both packs.
    o.val_split = Some(ValSplit {
        rule: ValRule::Fraction(0.5),
        seed: 7,
    });
    let e = pack::pack(&o, &NoProgress).unwrap_err();
    let LoaderError::OutputInUse { conflict, .. } = &e else {
        panic!("{e}")
    };
    let OutputConflict::Occupied {
        occupant,
        this_pack,
    } = &**conflict
    else {
        panic!("{e}")
    };
    let Some(PackedBy::Options(first)) = &occupant.packed_by else {
        panic!("{e}")
    };
    assert_eq!(first.val_split.unwrap().rule, ValRule::Fraction(0.25));
    assert_eq!(this_pack.val_split, o.val_split);
    o.force = true;
    let rep = run(&o);
    assert_eq!(rep.val_split.unwrap().fraction, Some(0.5));
    assert!(splits_of(&out, &members)["val"].len() > want["val"].len());
}
