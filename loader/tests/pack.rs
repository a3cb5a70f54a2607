//! End-to-end tests of the packer on tiny generated inputs: every input layout, every kind of
//! bad input, determinism across thread counts, resume after an interrupted run, ownership of
//! the output directory, and verify.

use crate::common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use ddl_loader::manifest::Manifest;
use ddl_loader::pack::split::{ValRule, ValSplit};
use ddl_loader::pack::{
    self, NoProgress, OutputConflict, PackOption, PackOptions, PackReport, PackedBy, ShardCount,
    ShardOrder,
};
use ddl_loader::shard::ShardReader;
use ddl_loader::LoaderError;
use turbojpeg::{Colorspace, Image, PixelFormat, Subsamp};

use common::tar_of;

/// A fresh, empty directory under the system temp dir.
/// Deterministic smooth-plus-noise pixels.
fn pixels(w: usize, h: usize, channels: usize, seed: u32) -> Vec<u8> {
    let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(12345);
    let mut v = Vec::with_capacity(w * h * channels);
    for y in 0..h {
        for x in 0..w {
            for c in 0..channels {
                state = state.wrapping_mul(1_103_515_245).wrapping_add(12345);
                let noise = (state >> 27) as usize;
                v.push(((x * 7 + y * 3 + c * 60 + seed as usize * 13 + noise) % 256) as u8);
            }
        }
    }
    v
}

fn jpeg_with(
    w: usize,
    h: usize,
    seed: u32,
    format: PixelFormat,
    f: impl FnOnce(&mut turbojpeg::Compressor),
) -> Vec<u8> {
    let px = pixels(w, h, format.size(), seed);
    let mut c = turbojpeg::Compressor::new().unwrap();
    c.set_quality(90).unwrap();
    c.set_subsamp(if format == PixelFormat::GRAY {
        Subsamp::Gray
    } else {
        Subsamp::Sub2x2
    })
    .unwrap();
    f(&mut c);
    c.compress_to_vec(Image {
        pixels: px.as_slice(),
        width: w,
        pitch: w * format.size(),
        height: h,
        format,
    })
    .unwrap()
}

/// A baseline 4:2:0 RGB JPEG.
fn jpeg(w: usize, h: usize, seed: u32) -> Vec<u8> {
    jpeg_with(w, h, seed, PixelFormat::RGB, |_| {})
}

fn png_rgba(w: u32, h: u32) -> Vec<u8> {
    let px = pixels(w as usize, h as usize, 4, 99);
    let img = image::RgbaImage::from_raw(w, h, px).unwrap();
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

fn opts(input: &Path, output: &Path) -> PackOptions {
    let mut o = common::small_pack(input, output, 2);
    o.max_skip_fraction = 1.0;
    o
}

fn run(o: &PackOptions) -> PackReport {
    pack::pack(o, &NoProgress).unwrap()
}

/// Every (label, height, width) stored in a split, after checking each record decodes.
fn records(out: &Path, split: &str) -> Vec<(u32, u16, u16)> {
    let m = Manifest::load(out).unwrap();
    let mut v = Vec::new();
    for sh in &m.splits[split].shards {
        let r = ShardReader::open(&out.join(&sh.file)).unwrap();
        assert_eq!(r.len() as u64, sh.records);
        assert_eq!(r.file_crc32c(), sh.crc32c);
        for i in 0..r.len() {
            let rec = r.record(i).unwrap();
            let h = turbojpeg::read_header(rec.bytes).unwrap();
            assert_eq!(
                (h.width, h.height),
                (rec.width as usize, rec.height as usize)
            );
            assert_ne!(h.colorspace, Colorspace::CMYK);
            assert_ne!(h.colorspace, Colorspace::YCCK);
            turbojpeg::decompress(rec.bytes, PixelFormat::RGB).unwrap();
            v.push((rec.label, rec.height, rec.width));
        }
    }
    v
}

fn all_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| {
            let n = e.file_name().to_string_lossy().to_string();
            n.ends_with(".ddl") || n == "manifest.json"
        })
        .map(|e| {
            (
                e.file_name().to_string_lossy().to_string(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

/// train/<3 classes>, val/<class folders>; a clean tree of small and large JPEGs.
fn clean_tree(root: &Path) {
    let classes = ["n02000002", "n01000001", "n03000003"];
    for (c, wnid) in classes.iter().enumerate() {
        for i in 0..5 {
            let (w, h) = if i % 2 == 0 { (24, 20) } else { (80, 60) };
            write(
                &root
                    .join("train")
                    .join(wnid)
                    .join(format!("{wnid}_{i}.JPEG")),
                &jpeg(w, h, (c * 10 + i) as u32),
            );
        }
        write(
            &root.join("val").join(wnid).join(format!("v{c}.JPEG")),
            &jpeg(40, 30, 77 + c as u32),
        );
    }
}

/// A scratch directory with [`clean_tree`] in `in/`.
fn scratch_tree(name: &str) -> (ddl_testkit::TempDir, std::path::PathBuf) {
    let tmp = ddl_testkit::scratch(name);
    let input = tmp.path().join("in");
    clean_tree(&input);
    (tmp, input)
}

#[test]
fn folder_tree_roundtrip_balance_and_copy() {
    let tmp = ddl_testkit::scratch("pack-tree");
    let root = tmp.path();
    let input = root.join("in");
    clean_tree(&input);
    let out = root.join("out");
    let mut o = opts(&input, &out);
    o.shards = ShardCount::Count(4);
    o.nodes = 2;
    let rep = run(&o);
    let m = Manifest::load(&out).unwrap();
    let wnids: Vec<_> = m.classes.iter().map(|c| c.wnid.as_str()).collect();
    assert_eq!(wnids, ["n01000001", "n02000002", "n03000003"]);
    assert_eq!(m.nodes, 2);
    let train = &m.splits["train"];
    assert_eq!(train.records, 15);
    assert_eq!(train.shards.len(), 4);
    let counts: Vec<u64> = train.shards.iter().map(|s| s.records).collect();
    assert_eq!(counts, [4, 4, 4, 3]);
    for (s, sh) in train.shards.iter().enumerate() {
        assert_eq!(sh.file, format!("train-{s:05}.ddl"));
        assert_eq!(sh.node, s % 2);
    }
    // Each shard holds several classes (record i -> shard i % 4).
    let r0 = ShardReader::open(&out.join("train-00000.ddl")).unwrap();
    let labels: Vec<u32> = (0..r0.len()).map(|i| r0.row(i).label).collect();
    assert_eq!(labels, [0, 0, 1, 2]);
    assert_eq!(m.splits["val"].records, 3);
    assert_eq!(m.splits["val"].shards.len(), 3); // --shards 4 capped at 3 inputs

    let recs = records(&out, "train");
    let mut per_label = [0; 3];
    for (label, h, w) in &recs {
        per_label[*label as usize] += 1;
        assert!((*h).min(*w) <= 32, "{h}x{w}");
    }
    assert_eq!(per_label, [5, 5, 5]);
    // 24x20 baseline JPEGs fit and are copied byte for byte; 80x60 ones are resized to 43x32.
    let t = &rep.splits["train"];
    assert_eq!((t.copied, t.resized, t.reencoded, t.skipped), (9, 6, 0, 0));
    assert!(recs.contains(&(0, 32, 43)));
    let original = jpeg(24, 20, 10); // n01000001 is class index 1 in creation order -> seed 10
    let found = (0..r0.len()).any(|i| r0.record(i).unwrap().bytes == original.as_slice());
    assert!(
        found,
        "a fitting baseline JPEG was not copied byte for byte"
    );
    let v = pack::verify(&out).unwrap();
    assert!(v.problems.is_empty(), "{:?}", v.problems);
    assert_eq!(v.records, 18);
    assert!(out.join("pack-report.json").exists());

    // --reencode re-encodes everything.
    let out2 = root.join("out2");
    let mut o2 = opts(&input, &out2);
    o2.convert.reencode = true;
    let rep2 = run(&o2);
    assert_eq!(rep2.splits["train"].copied, 0);
    assert_eq!(rep2.splits["train"].reencoded, 9);
}

/// The labels of each shard of `split`, in shard order.
fn shard_labels(out: &Path, split: &str) -> Vec<Vec<u32>> {
    let m = Manifest::load(out).unwrap();
    m.splits[split]
        .shards
        .iter()
        .map(|sh| {
            let r = ShardReader::open(&out.join(&sh.file)).unwrap();
            (0..r.len()).map(|i| r.row(i).label).collect()
        })
        .collect()
}

#[test]
fn class_order_fills_consecutive_shards_with_consecutive_classes() {
    let (tmp, input) = scratch_tree("pack-class-order");
    // The default: input i of the (label, name) order in shard i % 2, every class in each.
    let interleaved = tmp.path().join("interleaved");
    run(&opts(&input, &interleaved));
    assert_eq!(
        shard_labels(&interleaved, "train"),
        [vec![0, 0, 0, 1, 1, 2, 2, 2], vec![0, 0, 1, 1, 1, 2, 2]]
    );
    let m = Manifest::load(&interleaved).unwrap();
    assert_eq!(
        m.pack["order"],
        "per split, inputs sorted by (label, name) (parquet rows: by file and row); input i \
         goes to shard i % shards"
    );
    // Class order: consecutive runs, the labels never decreasing from shard to shard.
    let out = tmp.path().join("class");
    let mut o = opts(&input, &out);
    o.order = ShardOrder::Class;
    run(&o);
    let shards = shard_labels(&out, "train");
    assert_eq!(
        shards,
        [vec![0, 0, 0, 0, 0, 1, 1], vec![1, 1, 1, 2, 2, 2, 2, 2]]
    );
    let all: Vec<u32> = shards.concat();
    assert!(all.windows(2).all(|w| w[0] <= w[1]), "{all:?}");
    assert_eq!(shard_labels(&out, "val"), [vec![0], vec![1, 2]]);
    let m = Manifest::load(&out).unwrap();
    assert!(m.pack["order"].as_str().unwrap().ends_with("(class order)"));
    assert!(pack::verify(&out).unwrap().problems.is_empty());
    // The same pack again resumes; the other order is another pack.
    let rep = run(&o);
    assert!(rep.splits.values().all(|s| s.shards_kept == s.shards));
    o.order = ShardOrder::Interleaved;
    let e = pack::pack(&o, &NoProgress).unwrap_err();
    assert!(matches!(e, LoaderError::OutputInUse { .. }), "{e}");
    assert!(e.to_string().contains("in class order"), "{e}");
}

#[test]
fn shard_size_is_estimated_from_converted_sample() {
    let tmp = ddl_testkit::scratch("pack-shardsize");
    let root = tmp.path();
    let input = root.join("in");
    clean_tree(&input);
    let one = root.join("one");
    let mut o = opts(&input, &one);
    o.shards = ShardCount::Count(1);
    let bytes = run(&o).splits["train"].output_bytes;
    for (parts, nodes) in [(3u64, 1usize), (3, 2)] {
        let out = root.join(format!("size-{parts}-{nodes}"));
        let mut o = opts(&input, &out);
        o.shards = ShardCount::Size(bytes / parts);
        o.nodes = nodes;
        let rep = run(&o);
        let s = rep.splits["train"].shards;
        // The estimate (all 15 inputs sampled) is within a few hundred bytes of the real size.
        assert!(
            (3..=4).contains(&s) && s % nodes == 0,
            "{s} shards for {parts} parts"
        );
    }
}

#[test]
fn bad_inputs_are_skipped_and_odd_images_converted() {
    let tmp = ddl_testkit::scratch("pack-bad");
    let root = tmp.path();
    let input = root.join("in");
    let a = input.join("train").join("n00000001");
    let b = input.join("train").join("n00000002");
    write(&a.join("good1.JPEG"), &jpeg(20, 20, 1));
    write(&a.join("good2.JPEG"), &jpeg(64, 48, 2));
    write(&a.join("zero.JPEG"), b"");
    let big = jpeg(64, 64, 3);
    write(&a.join("truncated.JPEG"), &big[..big.len() * 6 / 10]);
    write(&a.join("text.JPEG"), b"this is a text file, not a JPEG\n");
    write(&a.join("notes.txt"), b"ignored: not an image name");
    write(&b.join("png.JPEG"), &png_rgba(40, 30));
    write(
        &b.join("cmyk.JPEG"),
        &jpeg_with(40, 36, 4, PixelFormat::CMYK, |c| {
            c.set_subsamp(Subsamp::None).unwrap();
        }),
    );
    write(
        &b.join("gray.JPEG"),
        &jpeg_with(30, 20, 5, PixelFormat::GRAY, |_| {}),
    );
    write(
        &b.join("progressive.JPEG"),
        &jpeg_with(20, 16, 6, PixelFormat::RGB, |c| {
            c.set_progressive(true).unwrap();
        }),
    );
    let out = root.join("out");
    let rep = run(&opts(&input, &out));
    let skipped: BTreeMap<String, String> = rep
        .skipped
        .iter()
        .map(|s| {
            (
                Path::new(&s.path)
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .to_string(),
                s.reason.clone(),
            )
        })
        .collect();
    let want: BTreeMap<String, String> = [
        ("truncated.JPEG", "truncated"),
        ("text.JPEG", "not an image"),
        ("zero.JPEG", "zero-byte"),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(skipped, want);
    assert!(rep
        .skipped
        .iter()
        .all(|s| s.split == "train" && s.path.contains("n00000001")));
    assert_eq!(rep.ignored_files.len(), 1);
    assert!(rep.ignored_files[0].path.ends_with("notes.txt"));
    let t = &rep.splits["train"];
    assert_eq!((t.inputs, t.records, t.skipped), (9, 6, 3));
    assert_eq!((t.classes[0].records, t.classes[0].skipped), (2, 3));
    assert_eq!((t.classes[1].records, t.classes[1].skipped), (4, 0));
    // good1 copied; PNG, gray and progressive re-encoded; good2 and the 40x36 CMYK resized.
    assert_eq!((t.copied, t.reencoded, t.resized), (1, 3, 2));
    let mut dims: Vec<_> = records(&out, "train");
    dims.sort();
    assert_eq!(
        dims,
        [
            (0, 20, 20),
            (0, 32, 43),
            (1, 16, 20),
            (1, 20, 30),
            (1, 30, 40),
            (1, 32, 36)
        ]
    );
    let report_text = std::fs::read_to_string(out.join("pack-report.json")).unwrap();
    assert!(report_text.contains("truncated.JPEG") && report_text.contains("zero-byte"));

    // The default limit (0.001) fails after writing the report, without a manifest; a rerun
    // with a higher limit keeps all shards and writes the manifest.
    let out2 = root.join("out2");
    let mut o = opts(&input, &out2);
    o.max_skip_fraction = 0.001;
    let e = pack::pack(&o, &NoProgress).unwrap_err();
    assert!(
        matches!(
            e,
            LoaderError::SkipFraction {
                skipped: 3,
                inputs: 9,
                ..
            }
        ),
        "{e}"
    );
    assert!(out2.join("pack-report.json").exists());
    assert!(!out2.join("manifest.json").exists());
    o.max_skip_fraction = 0.5;
    let rep = run(&o);
    assert_eq!(rep.splits["train"].shards_kept, 2);
    assert_eq!(all_files(&out), all_files(&out2));
}

#[test]
fn flat_val_with_loc_csv() {
    // The Kaggle layout: images in ILSVRC/Data/CLS-LOC/{train,val}, the CSV three levels up.
    let tmp = ddl_testkit::scratch("pack-loccsv");
    let root = tmp.path();
    let kaggle = root.join("kaggle");
    let input = kaggle.join("ILSVRC").join("Data").join("CLS-LOC");
    clean_tree(&input);
    std::fs::remove_dir_all(input.join("val")).unwrap();
    let mut csv = String::from("ImageId,PredictionString\n");
    for (k, wnid) in ["n03000003", "n01000001", "n01000001", "n02000002"]
        .iter()
        .enumerate()
    {
        let id = format!("ILSVRC2012_val_{:08}", k + 1);
        write(
            &input.join("val").join(format!("{id}.JPEG")),
            &jpeg(20, 20, k as u32),
        );
        csv.push_str(&format!("{id},{wnid} 1 2 3 4 {wnid} 5 6 7 8\n"));
    }
    // An image without a CSV row is skipped, and counted toward the skip limit.
    write(
        &input.join("val").join("ILSVRC2012_val_00000099.JPEG"),
        &jpeg(20, 20, 9),
    );
    write(&input.join("LOC_val_solution.csv"), csv.as_bytes());
    let out = root.join("out");
    let rep = run(&opts(&input, &out));
    let mut labels: Vec<u32> = records(&out, "val").iter().map(|r| r.0).collect();
    labels.sort();
    assert_eq!(labels, [0, 0, 1, 2]);
    let first = all_files(&out);
    std::fs::rename(
        input.join("LOC_val_solution.csv"),
        kaggle.join("LOC_val_solution.csv"),
    )
    .unwrap();
    let out2 = root.join("out2");
    run(&opts(&input, &out2));
    // The same shards; the manifest names the CSV where it now is.
    let shards = |mut files: BTreeMap<String, Vec<u8>>| {
        files.remove("manifest.json");
        files
    };
    assert_eq!(shards(all_files(&out2)), shards(first));
    assert_eq!(rep.skipped.len(), 1);
    let unlabelled = &rep.skipped[0];
    assert!(
        unlabelled.path.ends_with("ILSVRC2012_val_00000099.JPEG")
            && unlabelled.reason == "no label"
            && unlabelled.detail.contains("LOC_val_solution.csv"),
        "{unlabelled:?}"
    );
    let val = &rep.splits["val"];
    assert_eq!((val.inputs, val.records, val.skipped), (5, 4, 1));
    assert!(val.labels.as_ref().unwrap().files[0].ends_with("LOC_val_solution.csv"));
}

#[test]
fn flat_val_with_devkit_and_synsets() {
    let tmp = ddl_testkit::scratch("pack-devkit");
    let root = tmp.path();
    let input = root.join("in");
    clean_tree(&input);
    std::fs::remove_dir_all(input.join("val")).unwrap();
    // ILSVRC ids are not in sorted-wnid order: id 1 = n03000003, 2 = n01000001, 3 = n02000002.
    let synsets = root.join("synsets.txt");
    write(
        &synsets,
        b"n03000003 third\nn01000001 first\nn02000002 second\n",
    );
    let gt = [1, 2, 3, 2, 1];
    for k in 0..gt.len() {
        write(
            &input
                .join("val")
                .join(format!("ILSVRC2012_val_{:08}.JPEG", k + 1)),
            &jpeg(20, 20, k as u32),
        );
    }
    let text: String = gt.iter().map(|g| format!("{g}\n")).collect();
    write(
        &input.join("ILSVRC2012_validation_ground_truth.txt"),
        text.as_bytes(),
    );
    let out = root.join("out");
    let e = pack::pack(&opts(&input, &out), &NoProgress).unwrap_err();
    assert!(
        matches!(&e, LoaderError::Option { source, .. }
            if source.option == PackOption::Synsets && source.value.is_none()),
        "{e}"
    );
    let mut o = opts(&input, &out);
    o.synsets = Some(synsets);
    o.shards = ShardCount::Count(1);
    run(&o);
    let labels: Vec<u32> = records(&out, "val").iter().map(|r| r.0).collect();
    // Sorted by (label, name): labels of images 2,4 (n01 -> 0), 3 (n02 -> 1), 1,5 (n03 -> 2).
    assert_eq!(labels, [0, 0, 1, 2, 2]);
}

fn synset_tar(wnid: &str, n: usize, seed: u32) -> Vec<u8> {
    let mut entries: Vec<(String, Vec<u8>)> = (0..n)
        .map(|i| {
            (
                format!("{wnid}_{i}.JPEG"),
                jpeg(20 + i * 20, 24, seed + i as u32),
            )
        })
        .collect();
    entries.push((format!("{wnid}_bad.JPEG"), Vec::new()));
    tar_of(&entries)
}

#[test]
fn imagenet22k_synset_tars_and_outer_tar_give_identical_shards() {
    let tmp = ddl_testkit::scratch("pack-tars");
    let root = tmp.path();
    let direct = root.join("direct");
    let nested = root.join("nested");
    let wnids = ["n09000009", "n01000001", "n05000005"];
    let mut inner = Vec::new();
    for (k, w) in wnids.iter().enumerate() {
        let t = synset_tar(w, 3, 10 * k as u32);
        write(&direct.join(format!("{w}.tar")), &t);
        inner.push((format!("{w}.tar"), t));
    }
    write(&nested.join("fall11_whole.tar"), &tar_of(&inner));
    let (out_a, out_b) = (root.join("out-a"), root.join("out-b"));
    let rep_a = run(&opts(&direct, &out_a));
    let rep_b = run(&opts(&nested, &out_b));
    for rep in [&rep_a, &rep_b] {
        let t = &rep.splits["train"];
        assert_eq!((t.inputs, t.records, t.skipped), (12, 9, 3));
        assert!(rep
            .skipped
            .iter()
            .all(|s| s.reason == "zero-byte" && s.path.contains(".tar:")));
    }
    assert!(rep_b.skipped[0]
        .path
        .contains("fall11_whole.tar:n01000001.tar/n01000001_bad.JPEG"));
    // Same records in the same order; only the manifests' plan fingerprints (which hash the
    // member names) differ.
    let shards = |d: &Path| {
        let mut f = all_files(d);
        f.remove("manifest.json");
        f
    };
    assert_eq!(shards(&out_a), shards(&out_b));
    let m = Manifest::load(&out_a).unwrap();
    assert_eq!(m.classes[0].wnid, "n01000001");
    let recs = records(&out_a, "train");
    assert_eq!(recs.len(), 9);
    // The 60x24 member fits (shorter side 24 <= 32) and is stored as is.
    assert!(recs.iter().any(|r| (r.1, r.2) == (24, 60)));

    // A gzip-compressed tar is refused with a clear message.
    let gz = root.join("gz");
    write(&gz.join("n01000001.tar"), &[0x1f, 0x8b, 8, 0, 0, 0, 0, 0]);
    let e = pack::pack(&opts(&gz, &root.join("out-gz")), &NoProgress)
        .unwrap_err()
        .to_string();
    assert!(e.contains("gzip") && e.contains("n01000001.tar"), "{e}");
}

#[test]
fn classes_file_restricts_and_orders() {
    let tmp = ddl_testkit::scratch("pack-classes");
    let root = tmp.path();
    let input = root.join("in");
    clean_tree(&input);
    let classes = root.join("classes.txt");
    write(
        &classes,
        b"# chosen classes\nn03000003 last-in-sorted-order\n\nn01000001\n",
    );
    let out = root.join("out");
    let mut o = opts(&input, &out);
    o.classes = Some(classes);
    let rep = run(&o);
    let m = Manifest::load(&out).unwrap();
    let wnids: Vec<_> = m.classes.iter().map(|c| c.wnid.as_str()).collect();
    assert_eq!(wnids, ["n03000003", "n01000001"]);
    assert_eq!(rep.ignored_classes.get("n02000002"), Some(&6));
    assert_eq!(m.splits["train"].records, 10);
    assert_eq!(m.splits["val"].records, 2);
}

#[test]
fn output_is_identical_for_any_thread_count() {
    let tmp = ddl_testkit::scratch("pack-determinism");
    let root = tmp.path();
    let input = root.join("in");
    clean_tree(&input);
    write(&input.join("train/n01000001/png.JPEG"), &png_rgba(50, 40));
    let mut outs = Vec::new();
    for threads in [1, 2, 3] {
        let out = root.join(format!("out-{threads}"));
        let mut o = opts(&input, &out);
        o.threads = threads;
        o.shards = ShardCount::Count(3);
        run(&o);
        outs.push(all_files(&out));
    }
    assert!(outs[0].len() >= 4);
    assert_eq!(outs[0], outs[1]);
    assert_eq!(outs[0], outs[2]);
}

#[test]
fn resume_after_interruption_matches_clean_run() {
    let tmp = ddl_testkit::scratch("pack-resume");
    let root = tmp.path();
    let input = root.join("in");
    clean_tree(&input);
    let clean = root.join("clean");
    let mut o = opts(&input, &clean);
    o.shards = ShardCount::Count(5);
    run(&o);
    let want = all_files(&clean);

    let out = root.join("out");
    o.output = out.clone();
    run(&o);
    // Simulate a crash: one shard missing, one truncated, one damaged in place, a leftover
    // temporary file of an unfinished shard, and no manifest; plus a shard-named file this pack
    // did not write.
    std::fs::remove_file(out.join("train-00001.ddl")).unwrap();
    let t2 = out.join("train-00002.ddl");
    let len = std::fs::metadata(&t2).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&t2)
        .unwrap()
        .set_len(len - 10)
        .unwrap();
    let t3 = out.join("train-00003.ddl");
    let mut b = std::fs::read(&t3).unwrap();
    let n = b.len();
    b[n - 3] ^= 0xFF;
    std::fs::write(&t3, &b).unwrap();
    std::fs::File::create(out.join("train-00004.ddl.tmp"))
        .unwrap()
        .write_all(b"partial")
        .unwrap();
    std::fs::remove_file(out.join("train-00004.ddl")).unwrap();
    std::fs::write(out.join("train-00009.ddl"), b"stale").unwrap();
    std::fs::remove_file(out.join("manifest.json")).unwrap();

    let rep = run(&o);
    assert_eq!(rep.splits["train"].shards_kept, 1); // only train-00000 survived intact
    assert_eq!(rep.splits["val"].shards_kept, 3);
    let mut got = all_files(&out);
    // The file this pack did not write is still there, untouched, and reported.
    assert_eq!(got.remove("train-00009.ddl").unwrap(), b"stale");
    assert_eq!(rep.left_in_place, ["train-00009.ddl"]);
    assert_eq!(got, want);
    assert!(!out.join("train-00004.ddl.tmp").exists());
    assert!(pack::verify(&out).unwrap().problems.is_empty());

    // A rerun with different parameters is another pack: refused, then redone with --force.
    o.convert.quality = 80;
    let e = pack::pack(&o, &NoProgress).unwrap_err();
    assert!(matches!(e, LoaderError::OutputInUse { .. }), "{e}");
    o.force = true;
    let rep = run(&o);
    assert_eq!(rep.splits["train"].shards_kept, 0);
    assert_eq!(
        std::fs::read(out.join("train-00009.ddl")).unwrap(),
        b"stale"
    );
}

/// Every file in `dir` with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| {
            (
                e.file_name().to_string_lossy().to_string(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

#[test]
fn the_packer_removes_or_replaces_only_files_it_wrote() {
    let tmp = ddl_testkit::scratch("pack-ownership");
    let root = tmp.path();
    let input = root.join("in");
    clean_tree(&input);
    let out = root.join("out");
    let mut o = opts(&input, &out);
    o.shards = ShardCount::Count(3);
    run(&o);
    // Files this pack did not write: a shard-named stray beyond the plan and a note.
    std::fs::write(out.join("train-00099.ddl"), b"not a shard").unwrap();
    std::fs::write(out.join("notes.txt"), b"mine").unwrap();

    // Resuming the same pack keeps them.
    let rep = run(&o);
    assert_eq!(rep.splits["train"].shards_kept, 3);
    assert_eq!(rep.left_in_place, ["notes.txt", "train-00099.ddl"]);
    assert_eq!(
        std::fs::read(out.join("train-00099.ddl")).unwrap(),
        b"not a shard"
    );

    // Another pack (other input, or other parameters) into it is refused, naming the directory
    // and what is there, and changes nothing.
    let other_input = root.join("in2");
    clean_tree(&other_input);
    std::fs::remove_dir_all(other_input.join("train/n03000003")).unwrap();
    std::fs::remove_dir_all(other_input.join("val/n03000003")).unwrap();
    let before = snapshot(&out);
    let mut other = opts(&other_input, &out);
    other.shards = ShardCount::Count(2);
    let e = pack::pack(&other, &NoProgress).unwrap_err();
    let LoaderError::OutputInUse { conflict, .. } = &e else {
        panic!("{e}")
    };
    assert!(
        matches!(&**conflict, OutputConflict::Occupied { occupant, .. }
            if occupant.unrelated.contains(&"notes.txt".to_string())),
        "{e}"
    );
    let e = e.to_string();
    assert!(
        e.contains(out.to_str().unwrap())
            && e.contains("another ddl dataset")
            && e.contains("manifest.json")
            && e.contains("notes.txt")
            && e.contains("force"),
        "{e}"
    );
    assert_eq!(snapshot(&out), before);

    // With --force it replaces the other pack's files it writes over; the old pack's third
    // shards, the stray and the note stay.
    other.force = true;
    let rep = run(&other);
    assert_eq!(
        rep.left_in_place,
        [
            "notes.txt",
            "train-00002.ddl",
            "train-00099.ddl",
            "val-00002.ddl"
        ]
    );
    assert_eq!(std::fs::read(out.join("notes.txt")).unwrap(), b"mine");
    assert_eq!(
        std::fs::read(out.join("train-00099.ddl")).unwrap(),
        b"not a shard"
    );
    assert_eq!(
        std::fs::read(out.join("train-00002.ddl")).unwrap(),
        before["train-00002.ddl"]
    );
    let m = Manifest::load(&out).unwrap();
    assert_eq!(m.classes.len(), 2);
    assert!(pack::verify(&out).unwrap().problems.is_empty());

    // A file in the way that ddl-pack cannot identify as its own is never replaced.
    let fresh = root.join("out-in-the-way");
    std::fs::create_dir_all(&fresh).unwrap();
    std::fs::write(fresh.join("train-00000.ddl"), b"my own file").unwrap();
    let mut o2 = opts(&input, &fresh);
    o2.force = true;
    let e = pack::pack(&o2, &NoProgress).unwrap_err().to_string();
    assert!(
        e.contains("train-00000.ddl is in the way") && e.contains("move it away"),
        "{e}"
    );
    assert_eq!(snapshot(&fresh).len(), 1);

    // A directory of unrelated files alone is refused too; --force packs beside them.
    let unrelated = root.join("out-unrelated");
    std::fs::create_dir_all(&unrelated).unwrap();
    std::fs::write(unrelated.join("README"), b"x").unwrap();
    let mut o3 = opts(&input, &unrelated);
    assert!(matches!(
        pack::pack(&o3, &NoProgress),
        Err(LoaderError::OutputInUse { .. })
    ));
    o3.force = true;
    let rep = run(&o3);
    assert_eq!(rep.left_in_place, ["README"]);
    assert_eq!(std::fs::read(unrelated.join("README")).unwrap(), b"x");
}

#[test]
fn unreadable_inputs_are_skipped_and_reported() {
    use std::os::unix::ffi::OsStrExt;
    let tmp = ddl_testkit::scratch("pack-unreadable");
    let root = tmp.path();
    let input = root.join("in");
    clean_tree(&input);
    let class = input.join("train/n01000001");
    std::os::unix::fs::symlink("/nonexistent/ddl-gone.JPEG", class.join("dangling.JPEG")).unwrap();
    std::os::unix::fs::symlink("loop-b.JPEG", class.join("loop-a.JPEG")).unwrap();
    std::os::unix::fs::symlink("loop-a.JPEG", class.join("loop-b.JPEG")).unwrap();
    let odd = class.join(std::ffi::OsStr::from_bytes(b"latin1-\xe9.JPEG"));
    std::fs::write(&odd, jpeg(30, 30, 5)).unwrap();
    let out = root.join("out");
    let rep = run(&opts(&input, &out));
    assert_eq!(rep.splits["train"].records, 15);
    assert_eq!(rep.splits["train"].skipped, 4);
    let skipped: BTreeMap<String, (String, String)> = rep
        .skipped
        .iter()
        .map(|s| {
            let name = s.path.rsplit('/').next().unwrap().to_string();
            (name, (s.reason.clone(), s.detail.clone()))
        })
        .collect();
    assert_eq!(skipped.len(), 4, "{skipped:?}");
    for (name, (reason, detail)) in &skipped {
        assert_eq!(reason, "unreadable", "{name}: {detail}");
    }
    assert!(skipped["dangling.JPEG"]
        .1
        .contains("symbolic link to /nonexistent/ddl-gone.JPEG"));
    assert!(skipped["loop-a.JPEG"]
        .1
        .contains("symbolic link to loop-b.JPEG"));
    assert!(skipped["latin1-\u{fffd}.JPEG"]
        .1
        .contains("not valid UTF-8"));

    // A class folder that cannot be examined or named stops the pack, naming it (leaving a
    // class out would shift every later label).
    let bad_class = input
        .join("train")
        .join(std::ffi::OsStr::from_bytes(b"n0\xff"));
    std::fs::create_dir_all(&bad_class).unwrap();
    let e = pack::pack(&opts(&input, &root.join("out2")), &NoProgress)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("n0\u{fffd}") && e.contains("not valid UTF-8"),
        "{e}"
    );
    std::fs::remove_dir(&bad_class).unwrap();
    std::os::unix::fs::symlink("/nonexistent/class", input.join("train/n09000009")).unwrap();
    let e = pack::pack(&opts(&input, &root.join("out3")), &NoProgress)
        .unwrap_err()
        .to_string();
    assert!(e.contains("n09000009") && e.contains("class folder"), "{e}");
}

#[test]
fn max_short_side_has_a_floor() {
    let tmp = ddl_testkit::scratch("pack-side");
    let root = tmp.path();
    let input = root.join("in");
    clean_tree(&input);
    let mut o = opts(&input, &root.join("out"));
    o.convert.max_short_side = 1;
    let e = pack::pack(&o, &NoProgress).unwrap_err();
    assert!(
        matches!(&e, LoaderError::Option { source, .. }
            if source.option == PackOption::MaxShortSide
                && source.value.as_deref() == Some("1")
                && source.problem.contains("16")),
        "{e}"
    );
    assert!(!root.join("out").exists());
}

#[test]
fn verify_names_shard_and_record_of_a_flipped_byte() {
    let tmp = ddl_testkit::scratch("pack-verify");
    let root = tmp.path();
    let input = root.join("in");
    clean_tree(&input);
    let out = root.join("out");
    run(&opts(&input, &out));
    assert!(pack::verify(&out).unwrap().problems.is_empty());
    let path = out.join("train-00001.ddl");
    let r = ShardReader::open(&path).unwrap();
    let row = r.row(2);
    let at = (r.header().data_offset + row.offset) as usize + row.length as usize / 2;
    drop(r);
    let mut b = std::fs::read(&path).unwrap();
    b[at] ^= 0x01;
    std::fs::write(&path, &b).unwrap();
    let v = pack::verify(&out).unwrap();
    let msgs: Vec<String> = v.problems.iter().map(|p| p.to_string()).collect();
    assert_eq!(msgs.len(), 2, "{msgs:?}");
    assert!(
        msgs.iter()
            .any(|m| m.contains("train-00001.ddl") && m.contains("record 2")),
        "{msgs:?}"
    );
    assert!(
        msgs.iter()
            .any(|m| m.contains("train-00001.ddl") && m.contains("whole-file crc32c")),
        "{msgs:?}"
    );

    // A damaged index is caught at open and named.
    let mut b = std::fs::read(&path).unwrap();
    b[64 + 5] ^= 0x10;
    std::fs::write(&path, &b).unwrap();
    let v = pack::verify(&out).unwrap();
    assert_eq!(v.problems.len(), 1);
    assert!(v.problems[0].to_string().contains("corrupt shard index"));
}

#[test]
fn missing_labels_are_a_clear_error() {
    let tmp = ddl_testkit::scratch("pack-nolabels");
    let root = tmp.path();
    let input = root.join("in");
    write(
        &input.join("val").join("ILSVRC2012_val_00000001.JPEG"),
        &jpeg(20, 20, 1),
    );
    let e = pack::pack(&opts(&input, &root.join("out")), &NoProgress)
        .unwrap_err()
        .to_string();
    assert!(e.contains("LOC_val_solution.csv"), "{e}");
    let empty = root.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let e = pack::pack(&opts(&empty, &root.join("out")), &NoProgress)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no images found"), "{e}");
}

#[test]
fn a_class_without_training_images_is_refused_or_kept_as_asked() {
    let (tmp, input) = scratch_tree("pack-empty-class");
    let root = tmp.path();
    // n02000002 keeps its val image but loses every training image: an empty folder.
    let emptied = input.join("train/n02000002");
    std::fs::remove_dir_all(&emptied).unwrap();
    std::fs::create_dir(&emptied).unwrap();
    let e = pack::pack(&opts(&input, &root.join("out")), &NoProgress).unwrap_err();
    match &e {
        LoaderError::EmptyClasses { classes, .. } => assert_eq!(classes, &["n02000002"]),
        other => panic!("expected EmptyClasses, got {other}"),
    }
    assert!(e.to_string().contains("another label"), "{e}");
    assert!(!root.join("out").join("manifest.json").exists());

    // Kept as a class without training records: every label stays, its val image too.
    let out = root.join("out-kept");
    let mut o = opts(&input, &out);
    o.keep_empty_classes = true;
    let rep = run(&o);
    let m = Manifest::load(&out).unwrap();
    let wnids: Vec<&str> = m.classes.iter().map(|c| c.wnid.as_str()).collect();
    assert_eq!(wnids, ["n01000001", "n02000002", "n03000003"]);
    assert!(rep.ignored_classes.is_empty());
    assert_eq!(m.splits["train"].records, 10);
    let mut val_labels: Vec<u32> = records(&out, "val").iter().map(|r| r.0).collect();
    val_labels.sort_unstable();
    assert_eq!(val_labels, [0, 1, 2]);
    assert!(records(&out, "train").iter().all(|r| r.0 != 1));

    // --min-per-class 1 drops it, as that flag says; n03 then is label 1 by the user's choice.
    let out = root.join("out-min");
    let mut o = opts(&input, &out);
    o.min_per_class = 1;
    let rep = run(&o);
    assert_eq!(rep.dropped_classes.get("n02000002"), Some(&0));
    assert!(rep.ignored_classes.is_empty());

    // A class whose images are all in val is a class without training images too.
    std::fs::remove_dir(&emptied).unwrap();
    let e = pack::pack(&opts(&input, &root.join("out-val-only")), &NoProgress).unwrap_err();
    assert!(
        matches!(&e, LoaderError::EmptyClasses { classes, .. } if classes == &["n02000002"]),
        "{e}"
    );
}

#[test]
fn a_class_whose_every_input_fails_stops_the_pack_naming_it() {
    let (tmp, input) = scratch_tree("pack-all-bad-class");
    let root = tmp.path();
    // n03000003 keeps its five files, each now a damaged JPEG: counted as usable inputs,
    // every one skipped when decoded.
    let class = input.join("train/n03000003");
    for e in std::fs::read_dir(&class).unwrap() {
        std::fs::write(e.unwrap().path(), b"\xFF\xD8\xFF\xE0 not really a jpeg").unwrap();
    }
    let out = root.join("out");
    let e = pack::pack(&opts(&input, &out), &NoProgress).unwrap_err();
    match &e {
        LoaderError::ClassesWithoutRecords { classes, .. } => {
            assert_eq!(classes, &BTreeMap::from([("n03000003".to_string(), 5)]))
        }
        other => panic!("expected ClassesWithoutRecords, got {other}"),
    }
    assert!(e.to_string().contains("--keep-empty-classes"), "{e}");
    assert!(
        !out.join("manifest.json").exists(),
        "an unusable pack got a manifest"
    );
    let report: PackReport =
        serde_json::from_slice(&std::fs::read(out.join(pack::REPORT_FILE)).unwrap()).unwrap();
    assert!(!report.ok);
    assert_eq!(report.empty_classes.get("n03000003"), Some(&5));

    // Kept as asked: the class stays, without training records.
    let out = root.join("out-kept");
    let mut o = opts(&input, &out);
    o.keep_empty_classes = true;
    let rep = run(&o);
    assert!(rep.ok && rep.empty_classes.is_empty());
    assert_eq!(Manifest::load(&out).unwrap().classes.len(), 3);
}

#[test]
fn a_file_among_the_class_folders_or_a_folder_in_one_is_reported_as_ignored() {
    let (tmp, input) = scratch_tree("pack-file-as-class");
    let stray = input.join("train/n10000500");
    write(&stray, &jpeg(24, 20, 5));
    // A folder inside a class folder: its image is not read, and the report says so.
    let nested = input.join("train/n01000001/more");
    write(&nested.join("n01000001_99.JPEG"), &jpeg(24, 20, 6));
    let rep = run(&opts(&input, &tmp.path().join("out")));
    assert_eq!(rep.classes, 3);
    let reason = |path: &Path| -> Vec<&str> {
        rep.ignored_files
            .iter()
            .filter(|f| f.path == path.display().to_string())
            .map(|f| f.reason.as_str())
            .collect()
    };
    assert_eq!(
        reason(&stray),
        ["a file among the class folders, not a class"],
        "{rep:?}"
    );
    assert_eq!(
        reason(&nested),
        ["a folder inside a class folder: its images are not read"],
        "{rep:?}"
    );
}

#[test]
fn labels_beyond_an_edited_manifests_classes_are_caught_at_open_and_by_verify() {
    let (tmp, input) = scratch_tree("pack-class-removed");
    let out = tmp.path().join("out");
    run(&opts(&input, &out));
    // The last class removed from manifest.json by hand: labels 0..2 stay in order.
    let path = out.join("manifest.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    m["classes"].as_array_mut().unwrap().pop();
    std::fs::write(&path, serde_json::to_vec_pretty(&m).unwrap()).unwrap();

    let v = pack::verify(&out).unwrap();
    assert!(
        v.problems.iter().any(|p| matches!(
            p,
            LoaderError::LabelOutOfRange {
                label: 2,
                classes: 2,
                ..
            }
        )),
        "{:?}",
        v.problems
    );
    let residency = ddl_loader::dataset::Residency { node: 0, nodes: 1 };
    let e = ddl_loader::dataset::Dataset::open(&out, "train", residency, &Default::default())
        .unwrap_err();
    assert!(
        matches!(
            e,
            LoaderError::LabelOutOfRange {
                label: 2,
                classes: 2,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains("manifest.json lists 2 classes"),
        "{e}"
    );
}

/// Where the identity-v1 fixture's input lay when ddl-pack at 959e01e packed it (v1 hashed the
/// canonical input path; see tests/data/pack-v1/NOTE.md).
const V1_ROOT: &str = "/tmp/ddl-pack-identity-v1";

/// Copies the directory `from` to `to` (created), files and folders.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// The options `ddl-pack` at 959e01e was given for the fixture's `out-a` and `out-b`.
fn v1_options(root: &Path, out: &Path, which: &str) -> PackOptions {
    let mut o = PackOptions::new(root.join("in"), out);
    o.threads = 2;
    if which == "out-a" {
        o.shards = ShardCount::Count(2);
        o.convert.max_short_side = 16;
        o.convert.quality = 85;
        o.min_per_class = 1;
        o.val_split = Some(ValSplit {
            rule: ValRule::PerClass(1),
            seed: 3,
        });
    } else {
        o.shards = ShardCount::Size(1 << 20);
        o.convert.reencode = true;
        o.classes = Some(root.join("classes.txt"));
        o.keep_empty_classes = true;
        o.val_split = Some(ValSplit {
            rule: ValRule::Fraction(0.5),
            seed: 0,
        });
        o.nodes = 2;
    }
    o
}

/// The pack fingerprint a directory's resume state records.
fn state_fingerprint(out: &Path) -> String {
    let text = std::fs::read(out.join(pack::STATE_FILE)).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&text).unwrap();
    v["pack"].as_str().unwrap().to_string()
}

#[test]
fn a_pack_written_by_identity_v1_is_resumed_as_the_same_pack() {
    use fs4::fs_std::FileExt;
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/pack-v1");
    let root = Path::new(V1_ROOT);
    std::fs::create_dir_all(root).unwrap();
    let lock = std::fs::File::create(root.join(".lock")).unwrap();
    lock.lock_exclusive().unwrap();
    let _ = std::fs::remove_dir_all(root.join("in"));
    copy_tree(&fixture.join("in"), &root.join("in"));
    std::fs::copy(fixture.join("classes.txt"), root.join("classes.txt")).unwrap();
    let tmp = ddl_testkit::scratch("pack-v1");
    for which in ["out-a", "out-b"] {
        let out = tmp.path().join(which);
        copy_tree(&fixture.join(which), &out);
        let v1 = state_fingerprint(&out);
        let shards_before: BTreeMap<String, Vec<u8>> = snapshot(&out)
            .into_iter()
            .filter(|(n, _)| n.ends_with(".ddl"))
            .collect();
        let o = v1_options(root, &out, which);
        // Recognised: every shard kept, none rewritten, and the state now carries identity v2.
        let rep = run(&o);
        for (split, s) in &rep.splits {
            assert_eq!(s.shards_kept, s.shards, "{which} {split}: every shard kept");
        }
        let after = snapshot(&out);
        for (name, bytes) in &shards_before {
            assert_eq!(&after[name], bytes, "{which} {name} unchanged");
        }
        let v2 = state_fingerprint(&out);
        assert_ne!(v2, v1, "{which}: the state is rewritten with identity v2");
        let rep = run(&o);
        assert!(rep.splits.values().all(|s| s.shards_kept == s.shards));
        assert_eq!(state_fingerprint(&out), v2);
        assert!(pack::verify(&out).unwrap().problems.is_empty());
    }
    // Other options are another pack, named in the words the v1 state recorded.
    let out = tmp.path().join("other");
    copy_tree(&fixture.join("out-a"), &out);
    let mut o = v1_options(root, &out, "out-a");
    o.convert.quality = 80;
    let e = pack::pack(&o, &NoProgress).unwrap_err();
    let LoaderError::OutputInUse { conflict, .. } = &e else {
        panic!("{e}")
    };
    assert!(
        matches!(&**conflict, OutputConflict::Occupied { occupant, .. }
            if matches!(&occupant.packed_by, Some(PackedBy::Words(w))
                if w.ends_with("--quality 85 --nodes 1 --min-per-class 1 --val-per-class 1 \
                                --val-seed 3"))),
        "{e}"
    ); // No v1 build wrote a pack in class order: its v1 fingerprint is not this one's.
    let out = tmp.path().join("class");
    copy_tree(&fixture.join("out-a"), &out);
    let mut o = v1_options(root, &out, "out-a");
    o.order = ShardOrder::Class;
    let e = pack::pack(&o, &NoProgress).unwrap_err();
    assert!(matches!(e, LoaderError::OutputInUse { .. }), "{e}");
}

#[test]
fn a_pack_into_a_directory_another_pack_is_writing_is_refused() {
    use ddl_loader::pack::PackProgress;
    use fs4::fs_std::FileExt;
    use std::path::PathBuf;
    use std::sync::Mutex;

    /// At the pack's first progress, while it writes: whether its output directory's lock was
    /// free, and what a second pack into that directory said.
    struct Intruder {
        input: PathBuf,
        out: PathBuf,
        seen: Mutex<Option<(bool, String)>>,
    }
    impl PackProgress for Intruder {
        fn advance(&self, _n: u64) {
            let mut seen = self.seen.lock().unwrap();
            if seen.is_none() {
                let dir = std::fs::File::open(&self.out).unwrap();
                let free = dir.try_lock_exclusive().unwrap();
                let second = pack::pack(&opts(&self.input, &self.out), &NoProgress);
                *seen = Some((
                    free,
                    second.map_or_else(|e| e.to_string(), |_| "packed".into()),
                ));
            }
        }
    }

    let (tmp, input) = scratch_tree("pack-busy");
    let out = tmp.path().join("out");
    let intruder = Intruder {
        input: input.clone(),
        out: out.clone(),
        seen: Mutex::new(None),
    };
    let rep = pack::pack(&opts(&input, &out), &intruder).unwrap();
    assert_eq!(rep.splits["train"].records, 15);
    let (free, second) = intruder
        .seen
        .into_inner()
        .unwrap()
        .expect("no progress reported");
    assert!(!free, "the running pack did not hold its directory's lock");
    assert!(second.contains("another ddl-pack is writing"), "{second}");
    // Once it is done, the lock is free and the directory whole: the same pack keeps it all.
    assert!(std::fs::File::open(&out)
        .unwrap()
        .try_lock_exclusive()
        .unwrap());
    let again = run(&opts(&input, &out));
    assert_eq!(
        again.splits["train"].shards_kept,
        again.splits["train"].shards
    );
}
