//! ImageNet as people download it, packed in one call and every record read back: image-net.org's
//! archives (as downloaded, extracted, and mixed), Kaggle's CSV, Hugging Face's parquet files and
//! timm's WebDataset shards. Each replica has real wnids, a devkit whose `meta.mat` gives the
//! ILSVRC ids in a shuffled order with inner synsets as the real one has, and images small
//! enough to be stored byte for byte, so that each packed record is matched to its source image
//! by its bytes and its label compared with the reference: torchvision's (a class's label is
//! the position of its wnid in sorted order; a val image's class is its ground-truth line's id
//! mapped through meta.mat). A packer that labelled by sorted ids or by position fails here.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use ddl_loader::manifest::Manifest;
use ddl_loader::pack::split::{ValRule, ValSplit};
use ddl_loader::pack::{self, NoProgress, PackOptions, PackReport, ShardOrder};
use ddl_loader::shard::ShardReader;
use ddl_loader::LoaderError;

use crate::common::tar_of;

/// Ten real ImageNet-1k wnids, not in sorted order.
pub(crate) const WNIDS: [&str; 10] = [
    "n01518878",
    "n01440764",
    "n01496331",
    "n01443537",
    "n01514859",
    "n01484850",
    "n01491361",
    "n01514668",
    "n01494475",
    "n01498041",
];
/// The ILSVRC2012_ID of each of [`WNIDS`]: neither the sorted nor the listed order.
const IDS: [u32; 10] = [3, 7, 10, 1, 5, 9, 2, 8, 4, 6];
/// Inner synsets of the hierarchy, listed in meta.mat after the leaves as in the real one.
const INNER: [(&str, u32); 2] = [("n00001740", 11), ("n01503061", 12)];
const TRAIN_PER_CLASS: usize = 4;
const VAL_PER_CLASS: usize = 2;

/// One source image and the class it belongs to.
pub(crate) struct Image {
    pub(crate) wnid: &'static str,
    pub(crate) jpeg: Vec<u8>,
}

/// The replica: training images per class and validation images by number (1-based).
pub(crate) struct Replica {
    pub(crate) train: Vec<(String, Image)>,
    pub(crate) val: Vec<Image>,
}

pub(crate) fn jpeg(seed: usize) -> Vec<u8> {
    ddl_testkit::jpeg(20 + seed % 7, 18 + seed % 5, seed)
}

impl Replica {
    pub(crate) fn new() -> Replica {
        let mut train = Vec::new();
        let mut val = Vec::new();
        for (c, &wnid) in WNIDS.iter().enumerate() {
            for i in 0..TRAIN_PER_CLASS {
                let file = format!("{wnid}_{}.JPEG", 1000 + i);
                train.push((
                    file,
                    Image {
                        wnid,
                        jpeg: jpeg(100 * c + i),
                    },
                ));
            }
        }
        // Val images interleave the classes as the real ground truth does.
        for k in 0..WNIDS.len() * VAL_PER_CLASS {
            let wnid = WNIDS[(k * 3) % WNIDS.len()];
            val.push(Image {
                wnid,
                jpeg: jpeg(5000 + k),
            });
        }
        Replica { train, val }
    }

    pub(crate) fn val_name(k: usize) -> String {
        format!("ILSVRC2012_val_{:08}.JPEG", k + 1)
    }

    /// The ground truth's lines: the ILSVRC id of each val image.
    fn ground_truth(&self) -> String {
        self.val
            .iter()
            .map(|im| format!("{}\n", id_of(im.wnid)))
            .collect()
    }

    /// Class folders `train/<wnid>/`.
    fn write_train_tree(&self, dir: &Path) {
        for (file, im) in &self.train {
            write(&dir.join(im.wnid).join(file), &im.jpeg);
        }
    }

    /// `<wnid>.tar`: one class's training images.
    fn class_tar(&self, wnid: &str) -> Vec<u8> {
        let members: Vec<(String, Vec<u8>)> = self
            .train
            .iter()
            .filter(|(_, im)| im.wnid == wnid)
            .map(|(f, im)| (f.clone(), im.jpeg.clone()))
            .collect();
        tar_of(&members)
    }

    /// `ILSVRC2012_img_train.tar`: a tar of per-class tars.
    fn train_tar(&self) -> Vec<u8> {
        let inner: Vec<(String, Vec<u8>)> = WNIDS
            .iter()
            .map(|w| (format!("{w}.tar"), self.class_tar(w)))
            .collect();
        tar_of(&inner)
    }

    /// `ILSVRC2012_img_val.tar`: flat, its members not in number order (nothing promises
    /// an order: labels must follow the numbers in the names).
    fn val_tar(&self) -> Vec<u8> {
        let n = self.val.len();
        let members: Vec<(String, Vec<u8>)> = (0..n)
            .map(|i| (i * 7) % n)
            .map(|k| (Replica::val_name(k), self.val[k].jpeg.clone()))
            .collect();
        tar_of(&members)
    }

    /// A flat `val/` folder.
    fn write_val_folder(&self, dir: &Path) {
        for (k, im) in self.val.iter().enumerate() {
            write(&dir.join(Replica::val_name(k)), &im.jpeg);
        }
    }

    /// The expected (label, wnid) of every image, by its bytes.
    fn expected(&self) -> HashMap<Vec<u8>, (u32, &'static str)> {
        let mut sorted = WNIDS.to_vec();
        sorted.sort_unstable();
        let label = |w: &str| sorted.iter().position(|s| *s == w).unwrap() as u32;
        self.train
            .iter()
            .map(|(_, im)| im)
            .chain(&self.val)
            .map(|im| (im.jpeg.clone(), (label(im.wnid), im.wnid)))
            .collect()
    }
}

fn id_of(wnid: &str) -> u32 {
    IDS[WNIDS.iter().position(|w| *w == wnid).unwrap()]
}

pub(crate) fn write(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// `meta.mat` as the devkit has it: the `synsets` struct array, leaves then inner synsets.
fn meta_mat(path: &Path, compress: bool) {
    use matrw::{matvar, MatFile, MatVariable};
    let leaves = WNIDS.iter().map(|w| (*w, id_of(w), 0.0));
    let inner = INNER.iter().map(|&(w, id)| (w, id, 2.0));
    let mut rows: Vec<(&str, u32, f64)> = leaves.chain(inner).collect();
    rows.sort_by_key(|r| r.1);
    let synsets: Vec<MatVariable> = rows
        .into_iter()
        .map(|(wnid, id, children)| {
            matvar!({
                ILSVRC2012_ID: id as f64,
                WNID: wnid,
                words: "a synset",
                gloss: "its gloss",
                num_children: children,
                wordnet_height: 0.0,
                num_train_images: 4.0,
            })
        })
        .collect();
    let mut mat = MatFile::new();
    mat.insert("synsets", synsets.into());
    matrw::save_matfile_v7(path.to_str().unwrap(), mat, compress).unwrap();
}

/// `ILSVRC2012_devkit_t12.tar.gz` holding `ground_truth` and a meta.mat.
fn devkit_tar_gz(dir: &Path, ground_truth: &str) -> Vec<u8> {
    let mat = dir.join("meta.mat");
    meta_mat(&mat, true);
    let members = vec![
        (
            "ILSVRC2012_devkit_t12/COPYING".to_string(),
            b"text".to_vec(),
        ),
        (
            "ILSVRC2012_devkit_t12/data/meta.mat".to_string(),
            std::fs::read(&mat).unwrap(),
        ),
        (
            "ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt".to_string(),
            ground_truth.as_bytes().to_vec(),
        ),
    ];
    std::fs::remove_file(&mat).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar_of(&members)).unwrap();
    gz.finish().unwrap()
}

/// The extracted devkit folder `ILSVRC2012_devkit_t12/`.
fn write_devkit_folder(dir: &Path, ground_truth: &str) {
    let data = dir.join("ILSVRC2012_devkit_t12").join("data");
    std::fs::create_dir_all(&data).unwrap();
    meta_mat(&data.join("meta.mat"), false);
    write(
        &data.join("ILSVRC2012_validation_ground_truth.txt"),
        ground_truth.as_bytes(),
    );
}

/// image-net.org's three downloads, as they land in one folder.
fn write_downloads(dir: &Path, r: &Replica) {
    write(&dir.join("ILSVRC2012_img_train.tar"), &r.train_tar());
    write(&dir.join("ILSVRC2012_img_val.tar"), &r.val_tar());
    write(
        &dir.join("ILSVRC2012_devkit_t12.tar.gz"),
        &devkit_tar_gz(dir, &r.ground_truth()),
    );
}

pub(crate) fn opts(input: &Path, output: &Path) -> PackOptions {
    crate::common::small_pack(input, output, 3)
}

/// Every record of a split: (label, its class's wnid, bytes).
fn records(out: &Path, split: &str) -> Vec<(u32, String, Vec<u8>)> {
    let m = Manifest::load(out).unwrap();
    let mut v = Vec::new();
    for sh in &m.splits[split].shards {
        let r = ShardReader::open(&out.join(&sh.file)).unwrap();
        for i in 0..r.len() {
            let rec = r.record(i).unwrap();
            let wnid = m.classes[rec.label as usize].wnid.clone();
            v.push((rec.label, wnid, rec.bytes.to_vec()));
        }
    }
    v
}

/// Checks that `split` holds exactly `count` records, each its source image's bytes with the
/// reference label and wnid.
pub(crate) fn assert_labels(out: &Path, split: &str, count: usize, r: &Replica) {
    let expected = r.expected();
    let recs = records(out, split);
    assert_eq!(recs.len(), count, "{split}");
    let mut seen = std::collections::HashSet::new();
    for (label, wnid, bytes) in recs {
        let Some(&(want_label, want_wnid)) = expected.get(&bytes) else {
            panic!("{split}: a record that is no source image (label {label})");
        };
        assert_eq!(
            (label, wnid.as_str()),
            (want_label, want_wnid),
            "{split}: wrong label"
        );
        assert!(seen.insert(bytes), "{split}: an image packed twice");
    }
}

fn pack_ok(input: &Path, out: &Path) -> PackReport {
    pack::pack(&opts(input, out), &NoProgress).unwrap()
}

pub(crate) fn refused(o: &PackOptions) -> String {
    match pack::pack(o, &NoProgress) {
        Ok(_) => panic!("{} was packed", o.input.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn image_net_downloads_are_labelled_by_the_devkit() {
    let tmp = ddl_testkit::scratch("pack-downloads");
    let (input, out) = (tmp.path().join("imagenet"), tmp.path().join("out"));
    let r = Replica::new();
    write_downloads(&input, &r);
    // Beside them, as a user's folder may hold: the task-3 subset, the test images, the boxes.
    let dogs = tar_of(&[(
        "n01440764.tar".into(),
        tar_of(&[("n01440764_1000.JPEG".into(), r.train[4].1.jpeg.clone())]),
    )]);
    write(&input.join("ILSVRC2012_img_train_t3.tar"), &dogs);
    let test = tar_of(&[("ILSVRC2012_test_00000001.JPEG".into(), jpeg(1))]);
    write(&input.join("ILSVRC2012_img_test_v10102019.tar"), &test);
    let boxes = tar_of(&[("val/ILSVRC2012_val_00000001.xml".into(), b"<a/>".to_vec())]);
    write(&input.join("ILSVRC2012_bbox_val_v3.tgz"), &gz(&boxes));
    let rep = pack_ok(&input, &out);
    assert_labels(&out, "train", WNIDS.len() * TRAIN_PER_CLASS, &r);
    assert_labels(&out, "val", r.val.len(), &r);
    let m = Manifest::load(&out).unwrap();
    let mut sorted = WNIDS.to_vec();
    sorted.sort_unstable();
    let classes: Vec<&str> = m.classes.iter().map(|c| c.wnid.as_str()).collect();
    assert_eq!(classes, sorted);
    let val = rep.splits["val"].labels.as_ref().unwrap();
    assert!(
        val.files[0].ends_with("ILSVRC2012_validation_ground_truth.txt")
            && val.files[1].ends_with("data/meta.mat")
            && val.files[0].contains("ILSVRC2012_devkit_t12.tar.gz:"),
        "{val:?}"
    );
    assert!(rep.splits["train"]
        .labels
        .as_ref()
        .unwrap()
        .rule
        .contains("<wnid>.tar"));
    assert_eq!(m.pack["labels"]["val"]["files"][1], val.files[1].as_str());
    for not_packed in ["train_t3.tar", "img_test_v10102019.tar", "bbox_val_v3.tgz"] {
        assert!(
            rep.ignored_files
                .iter()
                .any(|f| f.path.ends_with(not_packed)),
            "{not_packed} is not listed as ignored: {:?}",
            rep.ignored_files
        );
    }
}

#[test]
fn extracted_and_mixed_forms_pack_the_same_records() {
    let tmp = ddl_testkit::scratch("pack-extracted");
    let r = Replica::new();
    let (downloads, extracted, mixed) = (
        tmp.path().join("downloads"),
        tmp.path().join("extracted"),
        tmp.path().join("mixed"),
    );
    write_downloads(&downloads, &r);
    r.write_train_tree(&extracted.join("train"));
    r.write_val_folder(&extracted.join("val"));
    write_devkit_folder(&extracted, &r.ground_truth());
    // The train tar as downloaded, val extracted, the devkit archive.
    write(&mixed.join("ILSVRC2012_img_train.tar"), &r.train_tar());
    r.write_val_folder(&mixed.join("val"));
    write(
        &mixed.join("ILSVRC2012_devkit_t12.tar.gz"),
        &devkit_tar_gz(&mixed, &r.ground_truth()),
    );
    let out = |n: &str| tmp.path().join(n);
    pack_ok(&downloads, &out("a"));
    pack_ok(&extracted, &out("b"));
    pack_ok(&mixed, &out("c"));
    for o in ["b", "c"] {
        assert_labels(&out(o), "train", WNIDS.len() * TRAIN_PER_CLASS, &r);
        assert_labels(&out(o), "val", r.val.len(), &r);
        for split in ["train", "val"] {
            assert_eq!(
                records(&out("a"), split),
                records(&out(o), split),
                "{o} {split}"
            );
        }
    }

    // A synset list beside the devkit must agree with its meta.mat: Kaggle's
    // LOC_synset_mapping.txt has the same lines, sorted by wnid instead of ILSVRC id order.
    let mut sorted = WNIDS.to_vec();
    sorted.sort_unstable();
    let kaggle = tmp.path().join("LOC_synset_mapping.txt");
    let lines: String = sorted.iter().map(|w| format!("{w} a synset\n")).collect();
    write(&kaggle, lines.as_bytes());
    let mut o = opts(&extracted, &out("d"));
    o.synsets = Some(kaggle.clone());
    let e = refused(&o);
    let mut by_id = WNIDS.to_vec();
    by_id.sort_by_key(|w| id_of(w));
    let first = (0..10).find(|&k| sorted[k] != by_id[k]).unwrap();
    let line = format!("line {}: {}", first + 1, sorted[first]);
    assert!(
        e.contains("LOC_synset_mapping.txt") && e.contains(&line) && e.contains("meta.mat"),
        "{e}"
    );
    let ilsvrc = tmp.path().join("synsets.txt");
    let lines: String = by_id.iter().map(|w| format!("{w}\n")).collect();
    write(&ilsvrc, lines.as_bytes());
    o.synsets = Some(ilsvrc);
    pack::pack(&o, &NoProgress).unwrap();
    assert_labels(&out("d"), "val", r.val.len(), &r);
}

#[test]
fn ground_truth_that_does_not_match_the_images_is_refused() {
    let tmp = ddl_testkit::scratch("pack-groundtruth");
    let r = Replica::new();
    let case = |name: &str, gt: &str, extra: Option<usize>| -> String {
        let input = tmp.path().join(name);
        r.write_train_tree(&input.join("train"));
        r.write_val_folder(&input.join("val"));
        if let Some(k) = extra {
            write(&input.join("val").join(Replica::val_name(k)), &jpeg(9999));
        }
        write_devkit_folder(&input, gt);
        refused(&opts(&input, &tmp.path().join(format!("out-{name}"))))
    };
    let gt = r.ground_truth();
    let lines: Vec<&str> = gt.lines().collect();

    // One line missing: the last image has no line; lines are never matched by position.
    let short = lines[..lines.len() - 1].join("\n");
    let e = case("short", &short, None);
    let last = Replica::val_name(lines.len() - 1);
    assert!(e.contains(&last) && e.contains("no line"), "{e}");
    // A line without its image.
    let e = case("long", &format!("{gt}1\n"), None);
    assert!(
        e.contains("ILSVRC2012_validation_ground_truth.txt")
            && e.contains(&format!("line {}", lines.len() + 1)),
        "{e}"
    );
    // An inner synset's id is not a class.
    let inner = gt.replacen(lines[0], &INNER[0].1.to_string(), 1);
    let e = case("inner", &inner, None);
    assert!(e.contains("line 1:") && e.contains(INNER[0].0), "{e}");
    // An id meta.mat does not have.
    let e = case("unknown", &gt.replacen(lines[0], "999", 1), None);
    assert!(e.contains("line 1:") && e.contains("999"), "{e}");

    // The val tar alone, as a file or in a folder without the devkit: no labels.
    let alone = tmp.path().join("alone");
    write(&alone.join("ILSVRC2012_img_val.tar"), &r.val_tar());
    let e = refused(&opts(
        &alone.join("ILSVRC2012_img_val.tar"),
        &tmp.path().join("o1"),
    ));
    assert!(e.contains("devkit"), "{e}");
    let e = refused(&opts(&alone, &tmp.path().join("o2")));
    assert!(
        e.contains("ILSVRC2012_img_val.tar") && e.contains("ILSVRC2012_devkit_t12.tar.gz"),
        "{e}"
    );
    // A flat val folder beside the train tar, with no label source.
    let flat = tmp.path().join("flat");
    write(&flat.join("ILSVRC2012_img_train.tar"), &r.train_tar());
    r.write_val_folder(&flat.join("val"));
    let e = refused(&opts(&flat, &tmp.path().join("o3")));
    assert!(e.contains("without labels") && e.contains("val"), "{e}");
}

#[test]
fn tars_that_state_no_label_are_refused() {
    let tmp = ddl_testkit::scratch("pack-unlabelled-tars");
    let images = |n: usize| -> Vec<u8> {
        let m: Vec<(String, Vec<u8>)> = (0..n).map(|i| (format!("img{i}.jpg"), jpeg(i))).collect();
        tar_of(&m)
    };
    // A folder of tars named after something other than a synset.
    let pets = tmp.path().join("pets");
    write(&pets.join("cats.tar"), &images(2));
    write(&pets.join("dogs.tar"), &images(3));
    let e = refused(&opts(&pets, &tmp.path().join("o1")));
    assert!(
        e.contains("cats.tar") && e.contains("states no label"),
        "{e}"
    );
    // An outer tar whose inner tar is not named by a wnid.
    let outer = tmp.path().join("outer");
    write(
        &outer.join("whole.tar"),
        &tar_of(&[("cats.tar".into(), images(2))]),
    );
    let e = refused(&opts(&outer, &tmp.path().join("o2")));
    assert!(
        e.contains("whole.tar:cats.tar") && e.contains("WordNet id"),
        "{e}"
    );
    // A class in two training sources: the same images would be packed twice.
    let twice = tmp.path().join("twice");
    let synset = tar_of(&[("n01440764_1.JPEG".into(), jpeg(1))]);
    write(&twice.join("n01440764.tar"), &synset);
    write(
        &twice.join("fall11_whole.tar"),
        &tar_of(&[("n01440764.tar".into(), synset.clone())]),
    );
    let e = refused(&opts(&twice, &tmp.path().join("o3")));
    assert!(
        e.contains("n01440764") && e.contains("fall11_whole.tar") && e.contains("twice"),
        "{e}"
    );
}

/// Kaggle's `LOC_val_solution.csv` for the first `rows` val images; the row of image `wrong`
/// names another class.
fn kaggle_csv(r: &Replica, rows: usize, wrong: Option<usize>) -> String {
    let mut csv = String::from("ImageId,PredictionString\n");
    for (k, im) in r.val.iter().enumerate().take(rows) {
        let id = Replica::val_name(k).replace(".JPEG", "");
        let wnid = if wrong == Some(k) {
            another(im.wnid)
        } else {
            im.wnid
        };
        csv.push_str(&format!("{id},{wnid} 1 2 3 4\n"));
    }
    csv
}

/// A class other than `wnid`: the next one of [`WNIDS`].
fn another(wnid: &str) -> &'static str {
    let i = WNIDS.iter().position(|w| *w == wnid).unwrap();
    WNIDS[(i + 1) % WNIDS.len()]
}

#[test]
fn val_labels_are_checked_against_every_source_beside_them() {
    let tmp = ddl_testkit::scratch("pack-val-sources");
    let r = Replica::new();
    let (gt_file, csv_file) = (
        "ILSVRC2012_validation_ground_truth.txt",
        "LOC_val_solution.csv",
    );
    let bad = 3;
    let (right, wrong) = (r.val[bad].wnid, another(r.val[bad].wnid));
    let names_both = |e: &str, by: &str, checker: &str| {
        assert!(
            e.contains(&Replica::val_name(bad))
                && e.contains(&format!("{by} labels it {right}"))
                && e.contains(checker)
                && e.contains(&format!("labels it {wrong}")),
            "{e}"
        );
    };

    // A flat val/ beside the devkit and Kaggle's CSV: labelled by the devkit, each label
    // checked against the CSV's row.
    let flat = |name: &str, wrong: Option<usize>| {
        let input = tmp.path().join(name);
        r.write_train_tree(&input.join("train"));
        r.write_val_folder(&input.join("val"));
        write_devkit_folder(&input, &r.ground_truth());
        let csv = kaggle_csv(&r, r.val.len(), wrong);
        write(&input.join(csv_file), csv.as_bytes());
        input
    };
    let input = flat("flat", None);
    let out = tmp.path().join("out-flat");
    let rep = pack_ok(&input, &out);
    assert_labels(&out, "val", r.val.len(), &r);
    let val = rep.splits["val"].labels.as_ref().unwrap();
    let csv = input.join(csv_file).display().to_string();
    assert!(
        val.files[0].ends_with(gt_file) && val.checked == [csv.clone()],
        "{val:?}"
    );
    assert_eq!(
        Manifest::load(&out).unwrap().pack["labels"]["val"]["checked"][0],
        csv.as_str()
    );
    // Read, so not listed as ignored.
    assert!(
        !rep.ignored_files.iter().any(|f| f.path == csv),
        "{:?}",
        rep.ignored_files
    );
    // One row that disagrees: refused, naming the image, both files and both wnids.
    let input = flat("flat-wrong", Some(bad));
    let e = refused(&opts(&input, &tmp.path().join("out-flat-wrong")));
    names_both(&e, gt_file, csv_file);

    // Val sorted into class folders beside the devkit: labelled by the folders, each checked
    // against the ground truth.
    let sorted = |name: &str, misfiled: Option<usize>| {
        let input = tmp.path().join(name);
        r.write_train_tree(&input.join("train"));
        for (k, im) in r.val.iter().enumerate() {
            let folder = if misfiled == Some(k) {
                another(im.wnid)
            } else {
                im.wnid
            };
            write(
                &input.join("val").join(folder).join(Replica::val_name(k)),
                &im.jpeg,
            );
        }
        write_devkit_folder(&input, &r.ground_truth());
        input
    };
    let input = sorted("sorted", None);
    let out = tmp.path().join("out-sorted");
    let rep = pack_ok(&input, &out);
    assert_labels(&out, "val", r.val.len(), &r);
    let val = rep.splits["val"].labels.as_ref().unwrap();
    assert!(
        val.files == [input.join("val").display().to_string()]
            && val.checked[0].ends_with(gt_file)
            && val.checked[1].ends_with("meta.mat"),
        "{val:?}"
    );
    // One image in another class's folder: refused. Its folder names the wrong class here;
    // the message cannot tell which source is wrong, and says so.
    let input = sorted("sorted-wrong", Some(bad));
    let e = refused(&opts(&input, &tmp.path().join("out-sorted-wrong")));
    let (right, wrong) = (wrong, right);
    assert!(
        e.contains(&Replica::val_name(bad))
            && e.contains(&format!("its class folder labels it {right}"))
            && e.contains(gt_file)
            && e.contains(&format!("labels it {wrong}"))
            && e.contains("either may be wrong"),
        "{e}"
    );
}

#[test]
fn an_extraction_that_stopped_part_way_packs_every_class_or_is_refused() {
    let tmp = ddl_testkit::scratch("pack-part-extracted");
    let r = Replica::new();
    let all = WNIDS.len() * TRAIN_PER_CLASS;
    // train/ with the per-class tars of ILSVRC2012_img_train.tar, half of them extracted into
    // their folders and removed; the class being extracted when it stopped has both, its
    // folder partial: that class is read from its tar.
    let input = tmp.path().join("imagenet");
    let train = input.join("train");
    r.write_train_tree(&train);
    let (tarred, partial) = (&WNIDS[..5], WNIDS[4]);
    for w in tarred {
        write(&train.join(format!("{w}.tar")), &r.class_tar(w));
        std::fs::remove_dir_all(train.join(w)).unwrap();
    }
    let (file, image) = r.train.iter().find(|(_, im)| im.wnid == partial).unwrap();
    write(&train.join(partial).join(file), &image.jpeg);
    r.write_val_folder(&input.join("val"));
    write_devkit_folder(&input, &r.ground_truth());
    let out = tmp.path().join("out");
    let rep = pack_ok(&input, &out);
    assert_labels(&out, "train", all, &r);
    assert_labels(&out, "val", r.val.len(), &r);
    let folder = train.join(partial).display().to_string();
    let reason = format!(
        "not read: {} holds the same class",
        train.join(format!("{partial}.tar")).display()
    );
    assert!(
        rep.ignored_files
            .iter()
            .any(|f| f.path == folder && f.reason == reason),
        "{:?}",
        rep.ignored_files
    );

    // ImageNet-22k's per-synset tars in the input itself, some extracted into wnid folders.
    let synsets = tmp.path().join("fall11");
    for (i, w) in WNIDS.iter().enumerate() {
        match i % 2 {
            0 => write(&synsets.join(format!("{w}.tar")), &r.class_tar(w)),
            _ => r
                .train
                .iter()
                .filter(|(_, im)| im.wnid == *w)
                .for_each(|(f, im)| {
                    write(&synsets.join(w).join(f), &im.jpeg);
                }),
        }
    }
    write(&synsets.join("notes").join("README"), b"not a class");
    let out = tmp.path().join("out-22k");
    let rep = pack_ok(&synsets, &out);
    assert_labels(&out, "train", all, &r);
    let not_class = synsets.join("notes").display().to_string();
    assert!(
        rep.ignored_files.iter().any(|f| f.path == not_class),
        "{:?}",
        rep.ignored_files
    );

    // val/ sorted into class folders part way: refused, since the images beside the
    // folders would be left out.
    let sorting = tmp.path().join("sorting");
    r.write_train_tree(&sorting.join("train"));
    for (k, im) in r.val.iter().enumerate() {
        let name = Replica::val_name(k);
        let at = match k < 5 {
            true => sorting.join("val").join(im.wnid).join(name),
            false => sorting.join("val").join(name),
        };
        write(&at, &im.jpeg);
    }
    write_devkit_folder(&sorting, &r.ground_truth());
    let e = refused(&opts(&sorting, &tmp.path().join("out-sorting")));
    let beside = format!("{} images beside them", r.val.len() - 5);
    assert!(e.contains(&beside) && e.contains("stopped part way"), "{e}");
}

#[test]
fn kaggle_images_without_a_csv_row_count_toward_the_skip_limit() {
    let tmp = ddl_testkit::scratch("pack-kaggle");
    let r = Replica::new();
    let root = tmp.path().join("imagenet-object-localization-challenge");
    let cls_loc = root.join("ILSVRC").join("Data").join("CLS-LOC");
    r.write_train_tree(&cls_loc.join("train"));
    r.write_val_folder(&cls_loc.join("val"));
    write(
        &cls_loc.join("test").join("ILSVRC2012_test_00000001.JPEG"),
        &jpeg(3),
    );
    let rows = |keep: usize| kaggle_csv(&r, keep, None);
    write(
        &root.join("LOC_val_solution.csv"),
        rows(r.val.len()).as_bytes(),
    );
    // Given the download's own root, as a user would.
    let rep = pack_ok(&root, &tmp.path().join("out"));
    assert_labels(&tmp.path().join("out"), "val", r.val.len(), &r);
    assert!(rep.ignored_files.iter().any(|f| f.path.ends_with("test")));

    // Half of the rows missing: a damaged download, refused by the default skip limit.
    write(
        &root.join("LOC_val_solution.csv"),
        rows(r.val.len() / 2).as_bytes(),
    );
    let out = tmp.path().join("out-half");
    let e = pack::pack(&opts(&root, &out), &NoProgress).unwrap_err();
    let LoaderError::SkipFraction {
        skipped, inputs, ..
    } = e
    else {
        panic!("{e}")
    };
    let total = (WNIDS.len() * TRAIN_PER_CLASS + r.val.len()) as u64;
    assert_eq!((skipped, inputs), (r.val.len() as u64 / 2, total));
    let report: PackReport =
        serde_json::from_slice(&std::fs::read(out.join(pack::REPORT_FILE)).unwrap()).unwrap();
    assert!(report.skipped.iter().all(|s| s.reason == "no label"));
}

/// One parquet row as Hugging Face writes it: image bytes (None: null), image path, label.
type Row = (Option<Vec<u8>>, Option<String>, Option<i64>);

/// A parquet file in Hugging Face's layout (`image` struct of `bytes` and `path`, `label`),
/// snappy-compressed, row groups of `group` rows and small pages (so that a row is reached by
/// skipping pages), with the `huggingface` metadata naming the classes when `names` is given.
fn hf_parquet(path: &Path, rows: &[Row], group: usize, names: Option<&[&str]>) {
    use parquet::basic::Compression;
    use parquet::data_type::Int64Type;
    use parquet::file::metadata::KeyValue;
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    let schema = parquet::schema::parser::parse_message_type(
        "message hf { optional group image { optional binary bytes; optional binary path \
         (STRING); } optional int64 label; }",
    )
    .unwrap();
    let meta = names.map(|n| {
        let json = serde_json::json!({"info": {"features": {
            "image": {"_type": "Image"},
            "label": {"names": n, "_type": "ClassLabel"}}}});
        vec![KeyValue::new("huggingface".into(), json.to_string())]
    });
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_data_page_size_limit(1024)
        .set_dictionary_page_size_limit(1024)
        .set_write_batch_size(1)
        .set_key_value_metadata(meta)
        .build();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let file = std::fs::File::create(path).unwrap();
    let mut w = SerializedFileWriter::new(file, Arc::new(schema), Arc::new(props)).unwrap();
    for chunk in rows.chunks(group) {
        let mut rg = w.next_row_group().unwrap();
        write_binary(&mut rg, chunk.iter().map(|r| r.0.as_deref()));
        write_binary(
            &mut rg,
            chunk.iter().map(|r| r.1.as_deref().map(str::as_bytes)),
        );
        let mut col = rg.next_column().unwrap().unwrap();
        let defs: Vec<i16> = chunk.iter().map(|r| i16::from(r.2.is_some())).collect();
        let values: Vec<i64> = chunk.iter().filter_map(|r| r.2).collect();
        col.typed::<Int64Type>()
            .write_batch(&values, Some(&defs), None)
            .unwrap();
        col.close().unwrap();
        rg.close().unwrap();
    }
    w.close().unwrap();
}

#[test]
fn hugging_face_parquet_keeps_each_rows_label() {
    let tmp = ddl_testkit::scratch("pack-parquet");
    let r = Replica::new();
    let mut sorted = WNIDS.to_vec();
    sorted.sort_unstable();
    let label = |w: &str| sorted.iter().position(|s| *s == w).unwrap() as i64;
    let repo = tmp.path().join("imagenet-1k");
    let classes: String = sorted
        .iter()
        .map(|w| format!("        \"{w}\": \"a synset, its words\",\n"))
        .collect();
    let py = format!(
        "from collections import OrderedDict\n\nIMAGENET2012_CLASSES = OrderedDict(\n    {{\n{classes}    }}\n)\n"
    );
    write(&repo.join("classes.py"), py.as_bytes());
    // Hugging Face's rows are shuffled; one train row has no image.
    let mut train: Vec<Row> = r
        .train
        .iter()
        .map(|(f, im)| (Some(im.jpeg.clone()), Some(f.clone()), Some(label(im.wnid))))
        .collect();
    train.reverse();
    train.swap(3, 17);
    train.push((
        None,
        Some("n01440764_broken.JPEG".into()),
        Some(label("n01440764")),
    ));
    let val: Vec<Row> = (0..r.val.len())
        .map(|k| {
            let im = &r.val[k];
            (
                Some(im.jpeg.clone()),
                Some(Replica::val_name(k)),
                Some(label(im.wnid)),
            )
        })
        .collect();
    let data = repo.join("data");
    let half = train.len() / 2;
    hf_parquet(
        &data.join("train-00000-of-00002.parquet"),
        &train[..half],
        7,
        None,
    );
    hf_parquet(
        &data.join("train-00001-of-00002.parquet"),
        &train[half..],
        7,
        None,
    );
    hf_parquet(
        &data.join("validation-00000-of-00001.parquet"),
        &val,
        6,
        None,
    );
    let test: Vec<Row> = vec![(Some(jpeg(1)), None, Some(-1))];
    hf_parquet(&data.join("test-00000-of-00001.parquet"), &test, 6, None);
    let out = tmp.path().join("out");
    let mut o = opts(&repo, &out);
    o.max_skip_fraction = 0.05;
    let rep = pack::pack(&o, &NoProgress).unwrap();
    assert_labels(&out, "train", WNIDS.len() * TRAIN_PER_CLASS, &r);
    assert_labels(&out, "val", r.val.len(), &r);
    assert_eq!(rep.skipped.len(), 1);
    assert!(
        rep.skipped[0].path.contains("n01440764_broken.JPEG"),
        "{:?}",
        rep.skipped
    );
    assert!(rep
        .ignored_files
        .iter()
        .any(|f| f.path.ends_with("test-00000-of-00001.parquet")));
    assert!(rep.splits["val"]
        .labels
        .as_ref()
        .unwrap()
        .rule
        .contains("classes.py"));
    // The split is in the files' order (train-00000's rows, then train-00001's): record i of
    // that order in shard i % 3.
    for s in 0..3 {
        let r = ShardReader::open(&out.join(format!("train-{s:05}.ddl"))).unwrap();
        let got: Vec<Vec<u8>> = (0..r.len())
            .map(|i| r.record(i).unwrap().bytes.to_vec())
            .collect();
        let want: Vec<Vec<u8>> = train
            .iter()
            .skip(s)
            .step_by(3)
            .filter_map(|row| row.0.clone())
            .collect();
        assert_eq!(got, want, "train shard {s}");
    }
    // Rows are read in their files' order, a row group at a time, every shard at once: the
    // same bytes on one thread as on two.
    let one = tmp.path().join("out-one-thread");
    o.output = one.clone();
    o.threads = 1;
    pack::pack(&o, &NoProgress).unwrap();
    for split in ["train", "val"] {
        assert_eq!(records(&one, split), records(&out, split), "{split}");
    }
    // After a crash (a shard missing, one damaged) the rerun redoes those two alone, reading
    // only their rows.
    let want = records(&out, "train");
    std::fs::remove_file(out.join("train-00001.ddl")).unwrap();
    let damaged = out.join("train-00002.ddl");
    let mut bytes = std::fs::read(&damaged).unwrap();
    let n = bytes.len();
    bytes[n - 5] ^= 0xFF;
    std::fs::write(&damaged, bytes).unwrap();
    o.output = out.clone();
    o.threads = 2;
    let rep = pack::pack(&o, &NoProgress).unwrap();
    assert_eq!(rep.splits["train"].shards_kept, 1);
    assert_eq!(records(&out, "train"), want);

    // Without classes.py, the ClassLabel names of the metadata name the classes, in their
    // order (here reversed: the labels stay the rows' own).
    let bare = tmp.path().join("bare");
    let mut names = sorted.clone();
    names.reverse();
    let relabel = |rows: &[Row]| -> Vec<Row> {
        rows.iter()
            .map(|(b, p, l)| (b.clone(), p.clone(), l.map(|l| WNIDS.len() as i64 - 1 - l)))
            .collect()
    };
    hf_parquet(
        &bare.join("train-00000-of-00001.parquet"),
        &relabel(&train[..half]),
        5,
        Some(&names),
    );
    hf_parquet(
        &bare.join("validation-00000-of-00001.parquet"),
        &relabel(&val),
        5,
        Some(&names),
    );
    let out = tmp.path().join("out-bare");
    pack_ok(&bare, &out);
    let m = Manifest::load(&out).unwrap();
    let classes: Vec<&str> = m.classes.iter().map(|c| c.wnid.as_str()).collect();
    assert_eq!(classes, names);
    let expected = r.expected();
    for (label, wnid, bytes) in records(&out, "val") {
        assert_eq!(wnid, expected[&bytes].1);
        assert_eq!(label, WNIDS.len() as u32 - 1 - expected[&bytes].0);
    }
    // classes.py beside metadata that names each class by its words there, as Hugging Face's
    // does: packed. A classes.py in another order would rename every class: refused.
    let classes_py = |order: &[&str]| -> String {
        let entries: String = order
            .iter()
            .map(|w| format!("    \"{w}\": \"words of {w}\",\n"))
            .collect();
        format!("IMAGENET2012_CLASSES = OrderedDict(\n{{\n{entries}}}\n)\n")
    };
    let worded = tmp.path().join("worded");
    let words: Vec<String> = names.iter().map(|w| format!("words of {w}")).collect();
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    let rows = relabel(&train[..half]);
    hf_parquet(
        &worded.join("train-00000-of-00001.parquet"),
        &rows,
        5,
        Some(&words),
    );
    write(&worded.join("classes.py"), classes_py(&names).as_bytes());
    pack_ok(&worded, &tmp.path().join("out-worded"));
    let m = Manifest::load(&tmp.path().join("out-worded")).unwrap();
    let classes: Vec<&str> = m.classes.iter().map(|c| c.wnid.as_str()).collect();
    assert_eq!(classes, names);
    write(&worded.join("classes.py"), classes_py(&sorted).as_bytes());
    let e = refused(&opts(&worded, &tmp.path().join("out-reordered")));
    assert!(
        e.contains(&format!("names label 0 {}", sorted[0])) && e.contains(words[0]),
        "{e}"
    );
    // A train split alone, shuffled: a held-out val split takes N of each class wherever its
    // rows are, and class order sorts the rows by label.
    let only = tmp.path().join("train-only");
    let rows = &train[..train.len() - 1];
    hf_parquet(
        &only.join("data/train-00000-of-00001.parquet"),
        rows,
        6,
        None,
    );
    write(&only.join("classes.py"), py.as_bytes());
    let mut o = opts(&only, &tmp.path().join("out-held"));
    o.val_split = Some(ValSplit {
        rule: ValRule::PerClass(1),
        seed: 3,
    });
    let rep = pack::pack(&o, &NoProgress).unwrap();
    let per_class = &rep.splits["val"].classes;
    assert!(per_class.iter().all(|c| c.records == 1), "{per_class:?}");
    let mut o = opts(&only, &tmp.path().join("out-class"));
    o.order = ShardOrder::Class;
    pack::pack(&o, &NoProgress).unwrap();
    let labels: Vec<u32> = records(&tmp.path().join("out-class"), "train")
        .into_iter()
        .map(|r| r.0)
        .collect();
    assert!(labels.windows(2).all(|w| w[0] <= w[1]), "{labels:?}");

    // Neither: the labels have no names.
    let nameless = tmp.path().join("nameless");
    hf_parquet(
        &nameless.join("train-00000-of-00001.parquet"),
        &train[..4],
        5,
        None,
    );
    let e = refused(&opts(&nameless, &tmp.path().join("o")));
    assert!(e.contains("classes.py") && e.contains("ClassLabel"), "{e}");
}

#[test]
fn a_hugging_face_cache_folder_is_read_at_its_one_snapshot() {
    let tmp = ddl_testkit::scratch("pack-hf-cache");
    let r = Replica::new();
    let mut sorted = WNIDS.to_vec();
    sorted.sort_unstable();
    let label = |w: &str| sorted.iter().position(|s| *s == w).unwrap() as i64;
    let row = |name: String, im: &Image| (Some(im.jpeg.clone()), Some(name), Some(label(im.wnid)));
    let train: Vec<Row> = r.train.iter().map(|(f, im)| row(f.clone(), im)).collect();
    let val: Vec<Row> = (0..r.val.len())
        .map(|k| row(Replica::val_name(k), &r.val[k]))
        .collect();
    // `huggingface-cli download ILSVRC/imagenet-1k --repo-type dataset`: the files in blobs/,
    // named by their hash, linked from snapshots/REVISION/data/.
    let cache = tmp.path().join("datasets--ILSVRC--imagenet-1k");
    let snapshot = cache
        .join("snapshots")
        .join("4603483700ee984ea9debe3ddbfdeae86f6489eb");
    for (name, rows) in [
        ("train-00000-of-00001.parquet", &train),
        ("validation-00000-of-00001.parquet", &val),
    ] {
        let blob = cache.join("blobs").join(format!("blob-of-{name}"));
        hf_parquet(&blob, rows, 7, Some(&sorted));
        let link = snapshot.join("data").join(name);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&blob, &link).unwrap();
    }
    write(
        &cache.join("refs").join("main"),
        b"4603483700ee984ea9debe3ddbfdeae86f6489eb",
    );
    let out = tmp.path().join("out");
    pack_ok(&cache, &out);
    assert_labels(&out, "train", r.train.len(), &r);
    assert_labels(&out, "val", r.val.len(), &r);
    // Two revisions: which one is meant is the user's to say.
    std::fs::create_dir_all(cache.join("snapshots").join("0123abcd")).unwrap();
    let e = refused(&opts(&cache, &tmp.path().join("o1")));
    assert!(e.contains("2 revisions") && e.contains("0123abcd"), "{e}");
}

/// Writes the next column of `rg`, an optional binary field of the optional `image` group.
fn write_binary<'a>(
    rg: &mut parquet::file::writer::SerializedRowGroupWriter<'_, std::fs::File>,
    cells: impl Iterator<Item = Option<&'a [u8]>>,
) {
    use parquet::data_type::{ByteArray, ByteArrayType};
    let cells: Vec<Option<&[u8]>> = cells.collect();
    let defs: Vec<i16> = cells
        .iter()
        .map(|c| if c.is_some() { 2 } else { 1 })
        .collect();
    let values: Vec<ByteArray> = cells.into_iter().flatten().map(ByteArray::from).collect();
    let mut col = rg.next_column().unwrap().unwrap();
    col.typed::<ByteArrayType>()
        .write_batch(&values, Some(&defs), None)
        .unwrap();
    col.close().unwrap();
}

/// A WebDataset sample: key, image, class number; `None` leaves a member out.
type Sample = (String, Option<Vec<u8>>, Option<u32>);

/// A WebDataset shard of `samples` (each also with a `.json`).
fn wds_shard(samples: &[Sample]) -> Vec<u8> {
    let mut members = Vec::new();
    for (key, image, class) in samples {
        if let Some(im) = image {
            members.push((format!("{key}.jpg"), im.clone()));
        }
        if let Some(c) = class {
            members.push((format!("{key}.cls"), format!("{c}").into_bytes()));
        }
        members.push((format!("{key}.json"), b"{}".to_vec()));
    }
    tar_of(&members)
}

#[test]
fn webdataset_shards_are_labelled_by_their_cls() {
    let tmp = ddl_testkit::scratch("pack-wds");
    let r = Replica::new();
    let mut sorted = WNIDS.to_vec();
    sorted.sort_unstable();
    let cls = |w: &str| sorted.iter().position(|s| *s == w).unwrap() as u32;
    let dir = tmp.path().join("imagenet-1k-wds");
    let train: Vec<_> = r
        .train
        .iter()
        .map(|(f, im)| {
            (
                f.replace(".JPEG", ""),
                Some(im.jpeg.clone()),
                Some(cls(im.wnid)),
            )
        })
        .collect();
    let (a, b) = train.split_at(train.len() / 2);
    write(&dir.join("imagenet1k-train-0000.tar"), &wds_shard(a));
    write(&dir.join("imagenet1k-train-0001.tar"), &wds_shard(b));
    let mut val: Vec<_> = (0..r.val.len())
        .map(|k| {
            let key = Replica::val_name(k).replace(".JPEG", "");
            (key, Some(r.val[k].jpeg.clone()), Some(cls(r.val[k].wnid)))
        })
        .collect();
    val.push(("ILSVRC2012_val_00009999".into(), Some(jpeg(77)), None));
    write(&dir.join("imagenet1k-validation-00.tar"), &wds_shard(&val));
    write(
        &dir.join("imagenet1k-test-00.tar"),
        &wds_shard(&[("t".into(), Some(jpeg(8)), None)]),
    );
    let out = tmp.path().join("out");
    let mut o = opts(&dir, &out);
    o.max_skip_fraction = 0.05;
    let rep = pack::pack(&o, &NoProgress).unwrap();
    assert_labels(&out, "train", train.len(), &r);
    assert_labels(&out, "val", r.val.len(), &r);
    assert_eq!(rep.skipped.len(), 1);
    assert_eq!(rep.skipped[0].reason, "no label");
    assert!(rep
        .ignored_files
        .iter()
        .any(|f| f.path.ends_with("imagenet1k-test-00.tar")));

    // A key whose synset disagrees with its .cls is refused, naming both samples.
    let mut wrong = a.to_vec();
    wrong[0].2 = Some(cls(WNIDS[5]));
    write(&dir.join("imagenet1k-train-0000.tar"), &wds_shard(&wrong));
    let e = refused(&opts(&dir, &tmp.path().join("o1")));
    assert!(
        e.contains(&wrong[0].0) && e.contains(&format!(".cls {}", cls(WNIDS[5]))),
        "{e}"
    );
    write(&dir.join("imagenet1k-train-0000.tar"), &wds_shard(a));
    // Another kind of tar beside the shards.
    write(
        &dir.join("n01440764.tar"),
        &tar_of(&[("n01440764_1.JPEG".into(), jpeg(5))]),
    );
    let e = refused(&opts(&dir, &tmp.path().join("o2")));
    assert!(
        e.contains("n01440764.tar") && e.contains("WebDataset"),
        "{e}"
    );
}

#[test]
fn an_empty_synset_tar_in_an_outer_tar_is_a_class_without_images() {
    let tmp = ddl_testkit::scratch("pack-empty-synset");
    let whole = tmp.path().join("fall11_whole.tar");
    let full = tar_of(&[("n01440764_1.JPEG".into(), jpeg(1))]);
    write(
        &whole,
        &tar_of(&[
            ("n01440764.tar".into(), full),
            ("n01443537.tar".into(), tar_of(&[])),
        ]),
    );
    let e = pack::pack(&opts(&whole, &tmp.path().join("out")), &NoProgress).unwrap_err();
    let LoaderError::EmptyClasses { classes, .. } = &e else {
        panic!("{e}")
    };
    assert_eq!(classes, &["n01443537"]);
}

/// Where the last member's header of the tar `bytes` starts: the tar cut there ends at a
/// member's end, as an interrupted copy can.
fn last_member_start(bytes: &[u8]) -> usize {
    let mut tar = tar::Archive::new(bytes);
    let entries = tar
        .entries()
        .unwrap()
        .map(|e| e.unwrap().raw_header_position());
    entries.last().unwrap() as usize
}

#[test]
fn tars_cut_at_a_member_boundary_are_refused() {
    let tmp = ddl_testkit::scratch("pack-cut-tars");
    let r = Replica::new();
    // ImageNet-1k's train tar cut before its last class's tar: that class would be missing.
    let input = tmp.path().join("imagenet");
    write_downloads(&input, &r);
    let train = r.train_tar();
    let path = input.join("ILSVRC2012_img_train.tar");
    write(&path, &train[..last_member_start(&train)]);
    let e = refused(&opts(&input, &tmp.path().join("o1")));
    assert!(
        e.contains("ILSVRC2012_img_train.tar") && e.contains("cut short"),
        "{e}"
    );
    // ImageNet-22k's per-synset tars, one cut before its last image (no val split to notice).
    let input = tmp.path().join("imagenet22k");
    for w in WNIDS {
        write(&input.join(format!("{w}.tar")), &r.class_tar(w));
    }
    let class = r.class_tar(WNIDS[3]);
    let cut = &class[..last_member_start(&class)];
    write(&input.join(format!("{}.tar", WNIDS[3])), cut);
    let mut o = opts(&input, &tmp.path().join("o2"));
    o.val_split = Some(ValSplit {
        rule: ValRule::Fraction(0.2),
        seed: 0,
    });
    let e = refused(&o);
    assert!(
        e.contains(&format!("{}.tar", WNIDS[3])) && e.contains("cut short"),
        "{e}"
    );
    // The same bytes inside an outer tar: its member's size bounds the inner tar.
    let mut inner: Vec<(String, Vec<u8>)> = WNIDS
        .iter()
        .map(|w| (format!("{w}.tar"), r.class_tar(w)))
        .collect();
    inner[3].1 = cut.to_vec();
    let whole = tmp.path().join("fall11_whole.tar");
    write(&whole, &tar_of(&inner));
    o.input = whole;
    o.output = tmp.path().join("o3");
    let e = refused(&o);
    assert!(
        e.contains(&format!("{}.tar", WNIDS[3])) && e.contains("cut short"),
        "{e}"
    );
}

/// `bytes` gzip-compressed, as `tar czf` writes a tar.
fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

/// A name as Hugging Face's imagenet-1k tars give it: the file name, `_`, its wnid.
fn hf_name(name: &str, wnid: &str) -> String {
    let (stem, ext) = name.rsplit_once('.').unwrap();
    format!("{stem}_{wnid}.{ext}")
}

/// Hugging Face's imagenet-1k before its parquet conversion: `data/train_images_{0,1}.tar.gz`
/// (each class spread over both), `val_images.tar.gz`, `test_images.tar.gz`, `classes.py`;
/// val image `wrong` (if any) named with another class's wnid.
fn write_hf_tars(dir: &Path, r: &Replica, wrong: Option<usize>) {
    let mut parts = [Vec::new(), Vec::new()];
    for (i, (file, im)) in r.train.iter().enumerate() {
        parts[i % 2].push((hf_name(file, im.wnid), im.jpeg.clone()));
    }
    for (i, part) in parts.iter().enumerate() {
        write(
            &dir.join(format!("data/train_images_{i}.tar.gz")),
            &gz(&tar_of(part)),
        );
    }
    let val: Vec<(String, Vec<u8>)> = r
        .val
        .iter()
        .enumerate()
        .map(|(k, im)| {
            let wnid = match wrong == Some(k) {
                true => another(im.wnid),
                false => im.wnid,
            };
            (hf_name(&Replica::val_name(k), wnid), im.jpeg.clone())
        })
        .collect();
    write(&dir.join("data/val_images.tar.gz"), &gz(&tar_of(&val)));
    let test = tar_of(&[("ILSVRC2012_test_00000001.JPEG".into(), jpeg(1))]);
    write(&dir.join("data/test_images.tar.gz"), &gz(&test));
    write(&dir.join("classes.py"), b"IMAGENET2012_CLASSES = {}\n");
}

#[test]
fn gzip_compressed_tars_are_read_as_downloaded() {
    let tmp = ddl_testkit::scratch("pack-gzip");
    let r = Replica::new();
    let train = WNIDS.len() * TRAIN_PER_CLASS;
    // ImageNet-22k as image-net.org ships it today: winter21_whole.tar.gz, a gzip-compressed
    // outer tar of winter21_whole/<wnid>.tar; given as the input, and in a folder beside
    // ImageNet's bounding boxes (a gzip-compressed tar without images).
    let inner: Vec<(String, Vec<u8>)> = WNIDS
        .iter()
        .map(|w| (format!("winter21_whole/{w}.tar"), r.class_tar(w)))
        .collect();
    let whole = tmp.path().join("22k/winter21_whole.tar.gz");
    write(&whole, &gz(&tar_of(&inner)));
    let boxes = tar_of(&[("val/ILSVRC2012_val_00000001.xml".into(), b"<a/>".to_vec())]);
    write(
        &tmp.path().join("22k/ILSVRC2012_bbox_val_v3.tgz"),
        &gz(&boxes),
    );
    for (input, out) in [(whole.clone(), "o1"), (tmp.path().join("22k"), "o2")] {
        let out = tmp.path().join(out);
        let rep = pack_ok(&input, &out);
        assert_labels(&out, "train", train, &r);
        let labels = rep.splits["train"].labels.as_ref().unwrap();
        assert!(labels.rule.contains("inside the outer tar"), "{labels:?}");
    }
    // An extraction that stopped part way: half the classes in the stream, half in folders.
    let mixed = tmp.path().join("22k-mixed");
    write(
        &mixed.join("winter21_whole.tar.gz"),
        &gz(&tar_of(&inner[..5])),
    );
    for (file, im) in r
        .train
        .iter()
        .filter(|(_, im)| !WNIDS[..5].contains(&im.wnid))
    {
        write(&mixed.join(im.wnid).join(file), &im.jpeg);
    }
    pack_ok(&mixed, &tmp.path().join("mixed"));
    assert_labels(&tmp.path().join("mixed"), "train", train, &r);
    // With a held-out val split, both splits come from one pass over the stream: each shard's
    // bytes are the same for any thread count, and a rerun redoes only a shard that is gone.
    let held = |threads: usize, out: &str| {
        let mut o = opts(&whole, &tmp.path().join(out));
        o.threads = threads;
        o.val_split = Some(ValSplit {
            rule: ValRule::PerClass(1),
            seed: 5,
        });
        pack::pack(&o, &NoProgress).unwrap()
    };
    let rep = held(1, "held1");
    assert_eq!(rep.splits["val"].records, WNIDS.len() as u64);
    held(3, "held3");
    let shards = |out: &str| -> Vec<(String, Vec<u8>)> {
        let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(tmp.path().join(out))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "ddl"))
            .map(|p| {
                (
                    p.file_name().unwrap().to_string_lossy().into(),
                    std::fs::read(&p).unwrap(),
                )
            })
            .collect();
        v.sort();
        v
    };
    let first = shards("held1");
    assert_eq!(first.len(), 6);
    assert!(
        first == shards("held3"),
        "the shards depend on the thread count"
    );
    std::fs::remove_file(tmp.path().join("held1/train-00001.ddl")).unwrap();
    let rep = held(2, "held1");
    assert_eq!(rep.splits["train"].shards_kept, 2);
    assert_eq!(rep.splits["val"].shards_kept, 3);
    assert!(first == shards("held1"), "a rerun wrote other bytes");
    // Hugging Face's imagenet-1k tars, as `huggingface-cli download` leaves them.
    let hf = tmp.path().join("imagenet-1k");
    write_hf_tars(&hf, &r, None);
    let out = tmp.path().join("o3");
    let rep = pack_ok(&hf, &out);
    assert_labels(&out, "train", train, &r);
    assert_labels(&out, "val", r.val.len(), &r);
    assert!(rep
        .ignored_files
        .iter()
        .any(|f| f.path.ends_with("test_images.tar.gz")));
    let val = rep.splits["val"].labels.as_ref().unwrap();
    assert!(val.rule.contains("ends each image's file name") && val.checked.is_empty());
    // Beside the devkit, every val name's wnid is checked against its ground truth.
    write(
        &hf.join("data/ILSVRC2012_devkit_t12.tar.gz"),
        &devkit_tar_gz(&hf, &r.ground_truth()),
    );
    let out = tmp.path().join("o4");
    let rep = pack_ok(&hf, &out);
    assert_labels(&out, "val", r.val.len(), &r);
    let val = rep.splits["val"].labels.as_ref().unwrap();
    assert!(
        val.checked[0].ends_with("ILSVRC2012_validation_ground_truth.txt"),
        "{val:?}"
    );
    write_hf_tars(&hf, &r, Some(5));
    let e = refused(&opts(&hf, &tmp.path().join("o5")));
    assert!(
        e.contains("val_images.tar.gz:ILSVRC2012_val_00000006_")
            && e.contains("its file name labels it")
            && e.contains("ILSVRC2012_validation_ground_truth.txt labels it"),
        "{e}"
    );
}

#[test]
fn gzip_compressed_tars_that_cannot_be_trusted_are_refused() {
    let tmp = ddl_testkit::scratch("pack-gzip-refused");
    let r = Replica::new();
    let class = |w: &str| gz(&tar_of(&[(format!("{w}.tar"), r.class_tar(w))]));
    // A download cut short: the gzip stream ends early.
    let whole = class(WNIDS[0]);
    let cut = tmp.path().join("cut/winter21_whole.tar.gz");
    write(&cut, &whole[..whole.len() / 2]);
    let e = refused(&opts(&cut, &tmp.path().join("o1")));
    assert!(
        e.contains("winter21_whole.tar.gz") && e.contains("cut short"),
        "{e}"
    );
    // A training image whose name states two classes.
    let two = tar_of(&[(hf_name("n01440764_1.JPEG", "n01443537"), jpeg(1))]);
    let input = tmp.path().join("two/train_images_0.tar.gz");
    write(&input, &gz(&two));
    let e = refused(&opts(&input, &tmp.path().join("o2")));
    assert!(
        e.contains("n01440764_1_n01443537.JPEG") && e.contains("two classes"),
        "{e}"
    );
    // The class order reads inputs out of a gzip stream's order.
    let whole = tmp.path().join("order/winter21_whole.tar.gz");
    write(&whole, &class(WNIDS[0]));
    let mut o = opts(&whole, &tmp.path().join("o3"));
    o.order = ShardOrder::Class;
    let e = refused(&o);
    assert!(e.contains("order class") && e.contains("gunzip"), "{e}");
}

#[test]
fn hugging_face_tars_extracted_are_labelled_by_their_names() {
    let tmp = ddl_testkit::scratch("pack-hf-extracted");
    let r = Replica::new();
    // `tar xzf train_images_*.tar.gz -C train`: flat folders of names ending in the wnid.
    let input = tmp.path().join("imagenet-1k");
    for (file, im) in &r.train {
        write(&input.join("train").join(hf_name(file, im.wnid)), &im.jpeg);
    }
    for (k, im) in r.val.iter().enumerate() {
        let name = hf_name(&Replica::val_name(k), im.wnid);
        write(&input.join("val").join(name), &im.jpeg);
    }
    let out = tmp.path().join("o1");
    let rep = pack_ok(&input, &out);
    assert_labels(&out, "train", WNIDS.len() * TRAIN_PER_CLASS, &r);
    assert_labels(&out, "val", r.val.len(), &r);
    assert!(rep.splits["val"]
        .labels
        .as_ref()
        .unwrap()
        .checked
        .is_empty());
    // Beside the devkit's folder, each val name is checked against the ground truth.
    write_devkit_folder(&input, &r.ground_truth());
    let out = tmp.path().join("o2");
    let rep = pack_ok(&input, &out);
    assert_labels(&out, "val", r.val.len(), &r);
    let val = rep.splits["val"].labels.as_ref().unwrap();
    assert!(
        val.checked[0].ends_with("ILSVRC2012_validation_ground_truth.txt"),
        "{val:?}"
    );
    let first = input
        .join("val")
        .join(hf_name(&Replica::val_name(0), r.val[0].wnid));
    let renamed = hf_name(&Replica::val_name(0), another(r.val[0].wnid));
    std::fs::rename(&first, input.join("val").join(&renamed)).unwrap();
    let e = refused(&opts(&input, &tmp.path().join("o3")));
    assert!(
        e.contains(&renamed) && e.contains("its file name labels it"),
        "{e}"
    );
    std::fs::rename(input.join("val").join(&renamed), &first).unwrap();
    // A training name that states two classes.
    let two = hf_name("n01440764_77.JPEG", "n01443537");
    write(&input.join("train").join(&two), &jpeg(77));
    let e = refused(&opts(&input, &tmp.path().join("o4")));
    assert!(e.contains(&two) && e.contains("two classes"), "{e}");
}

/// Kaggle's `imagenet-object-localization-challenge.zip`: `ILSVRC/Data/CLS-LOC/{train,val,test}`
/// (the training images deflated but for every third, stored), the annotations, the CSVs; and
/// the folder of a class without images, `empty`, if given.
fn kaggle_zip(r: &Replica, csv: Option<String>, empty: Option<&str>) -> Vec<u8> {
    use zip::write::FileOptions;
    use zip::CompressionMethod;
    let mut z = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let deflated = FileOptions::default().compression_method(CompressionMethod::Deflated);
    let stored = FileOptions::default().compression_method(CompressionMethod::Stored);
    let root = "ILSVRC/Data/CLS-LOC";
    let mut add = |name: String, bytes: &[u8], o: FileOptions| {
        z.start_file(name, o).unwrap();
        z.write_all(bytes).unwrap();
    };
    for (i, (file, im)) in r.train.iter().enumerate() {
        let o = if i % 3 == 0 { stored } else { deflated };
        add(format!("{root}/train/{}/{file}", im.wnid), &im.jpeg, o);
        let xml = format!("ILSVRC/Annotations/CLS-LOC/train/{}/{file}.xml", im.wnid);
        add(xml, b"<annotation/>", deflated);
    }
    for (k, im) in r.val.iter().enumerate() {
        add(
            format!("{root}/val/{}", Replica::val_name(k)),
            &im.jpeg,
            deflated,
        );
    }
    add(
        format!("{root}/test/ILSVRC2012_test_00000001.JPEG"),
        &jpeg(3),
        deflated,
    );
    add(
        "LOC_synset_mapping.txt".into(),
        b"n01440764 tench, Tinca tinca\n",
        deflated,
    );
    if let Some(csv) = csv {
        add("LOC_val_solution.csv".into(), csv.as_bytes(), deflated);
    }
    if let Some(wnid) = empty {
        z.add_directory(format!("{root}/train/{wnid}/"), deflated)
            .unwrap();
    }
    z.finish().unwrap().into_inner()
}

#[test]
fn kaggles_zip_is_read_as_downloaded() {
    let tmp = ddl_testkit::scratch("pack-kaggle-zip");
    let r = Replica::new();
    let zip = tmp
        .path()
        .join("imagenet-object-localization-challenge.zip");
    let csv = || Some(kaggle_csv(&r, r.val.len(), None));
    write(&zip, &kaggle_zip(&r, csv(), None));
    let out = tmp.path().join("o1");
    let rep = pack_ok(&zip, &out);
    assert_labels(&out, "train", WNIDS.len() * TRAIN_PER_CLASS, &r);
    assert_labels(&out, "val", r.val.len(), &r);
    let val = rep.splits["val"].labels.as_ref().unwrap();
    assert!(
        val.files[0].ends_with(".zip:LOC_val_solution.csv"),
        "{val:?}"
    );
    for ignored in [
        "ILSVRC/Annotations/ (40 files)",
        "CLS-LOC/test/ (1 files)",
        "LOC_synset_mapping.txt",
    ] {
        assert!(
            rep.ignored_files.iter().any(|f| f.path.ends_with(ignored)),
            "{ignored} is not listed: {:?}",
            rep.ignored_files
        );
    }
    // A damaged member is skipped and reported, naming it; the others pack.
    let mut bytes = std::fs::read(&zip).unwrap();
    let member = &r.train[1].1.jpeg;
    let at = bytes
        .windows(member.len())
        .position(|w| w == member.as_slice());
    assert!(at.is_none(), "member 1 is deflated");
    let stored = &r.train[3].1.jpeg;
    let at = bytes
        .windows(stored.len())
        .position(|w| w == stored.as_slice())
        .unwrap();
    bytes[at + stored.len() / 2] ^= 0x55;
    write(&zip, &bytes);
    let mut o = opts(&zip, &tmp.path().join("o2"));
    o.max_skip_fraction = 0.5;
    let rep = pack::pack(&o, &NoProgress).unwrap();
    assert_eq!(rep.skipped.len(), 1, "{:?}", rep.skipped);
    assert!(
        rep.skipped[0].path.ends_with(&r.train[3].0) && rep.skipped[0].detail.contains("CRC-32"),
        "{:?}",
        rep.skipped
    );
    // Without the CSV, the val images have no label source.
    write(&zip, &kaggle_zip(&r, None, None));
    let e = refused(&opts(&zip, &tmp.path().join("o3")));
    assert!(
        e.contains("CLS-LOC/val") && e.contains("without labels"),
        "{e}"
    );
    // A class folder without images is a class, which the class check refuses.
    write(&zip, &kaggle_zip(&r, csv(), Some("n09999999")));
    let e = refused(&opts(&zip, &tmp.path().join("o4")));
    assert!(e.contains("n09999999"), "{e}");
}

#[test]
fn classes_named_by_numbers_are_labelled_by_their_number() {
    // ImageNetV2 as extracted: imagenetv2-matched-frequency-format-val/<0..999>/<hash>.jpeg,
    // folder k holding class k (sorted as strings, "10" would come before "2").
    let tmp = ddl_testkit::scratch("pack-numbered");
    let input = tmp.path().join("imagenetv2-matched-frequency-format-val");
    let mut class_of = HashMap::new();
    for class in 0..12u32 {
        for i in 0..2 {
            let bytes = jpeg(100 * class as usize + i);
            write(
                &input.join(class.to_string()).join(format!("{i}abc.jpeg")),
                &bytes,
            );
            class_of.insert(bytes, class);
        }
    }
    let out = tmp.path().join("out");
    pack_ok(&input, &out);
    let recs = records(&out, "train");
    assert_eq!(recs.len(), 24);
    for (label, name, bytes) in recs {
        assert_eq!(
            (label, name),
            (class_of[&bytes], class_of[&bytes].to_string())
        );
    }
}

#[test]
fn splits_extracted_into_folders_named_after_their_tars_are_refused() {
    // `tar xf ILSVRC2012_img_train.tar -C ILSVRC2012_img_train` and the same for val: read as
    // the input's own class folders, the val folder was a class of its own, and with
    // --min-per-class 1 (which the empty-class refusal offered) the pack went through.
    let tmp = ddl_testkit::scratch("pack-named-splits");
    let r = Replica::new();
    let input = tmp.path().join("imagenet");
    r.write_train_tree(&input.join("ILSVRC2012_img_train"));
    r.write_val_folder(&input.join("ILSVRC2012_img_val"));
    write_devkit_folder(&input, &r.ground_truth());
    for min in [0, 1] {
        let mut o = opts(&input, &tmp.path().join(format!("o{min}")));
        o.min_per_class = min;
        let e = refused(&o);
        assert!(
            e.contains("ILSVRC2012_img_train") && e.contains("no images") && e.contains("train/"),
            "{e}"
        );
    }
}

#[test]
fn tars_of_class_folders_are_read_by_their_folders() {
    let tmp = ddl_testkit::scratch("pack-tar-tree");
    let r = Replica::new();
    // image-net.org's ImageNet-21K-P: imagenet21k_resized.tar.gz.
    let root = "imagenet21k_resized";
    let mut members: Vec<(String, Vec<u8>)> = Vec::new();
    for (file, im) in &r.train {
        let name = format!("{root}/imagenet21k_train/{}/{file}", im.wnid);
        members.push((name, im.jpeg.clone()));
    }
    for (k, im) in r.val.iter().enumerate() {
        let name = format!("{root}/imagenet21k_val/{0}/{0}_{k}.JPEG", im.wnid);
        members.push((name, im.jpeg.clone()));
    }
    members.push((
        format!("{root}/imagenet21k_small_classes/n09999999/a.JPEG"),
        jpeg(9),
    ));
    let p = tmp.path().join("imagenet21k_resized.tar.gz");
    write(&p, &gz(&tar_of(&members)));
    let out = tmp.path().join("o1");
    let rep = pack_ok(&p, &out);
    assert_labels(&out, "train", WNIDS.len() * TRAIN_PER_CLASS, &r);
    assert_labels(&out, "val", r.val.len(), &r);
    assert!(
        rep.ignored_files
            .iter()
            .any(|f| f.path.ends_with("imagenet21k_small_classes/ (1 images)")),
        "{:?}",
        rep.ignored_files
    );
    // In a folder, it is to be given itself.
    let e = refused(&opts(tmp.path(), &tmp.path().join("o2")));
    assert!(
        e.contains("imagenet21k_resized.tar.gz") && e.contains("as the input itself"),
        "{e}"
    );
    // image-net.org's face-blurred ImageNet: a tar of class folders per split, in one folder.
    let blurred = tmp.path().join("blurred");
    let train: Vec<(String, Vec<u8>)> = r
        .train
        .iter()
        .map(|(f, im)| (format!("train_blurred/{}/{f}", im.wnid), im.jpeg.clone()))
        .collect();
    write(&blurred.join("train_blurred.tar.gz"), &gz(&tar_of(&train)));
    let val: Vec<(String, Vec<u8>)> = (0..r.val.len())
        .map(|k| {
            let name = Replica::val_name(k);
            (
                format!("val_blurred/{}/{name}", r.val[k].wnid),
                r.val[k].jpeg.clone(),
            )
        })
        .collect();
    write(&blurred.join("val_blurred.tar.gz"), &gz(&tar_of(&val)));
    let out = tmp.path().join("o-blurred");
    pack_ok(&blurred, &out);
    assert_labels(&out, "train", r.train.len(), &r);
    assert_labels(&out, "val", r.val.len(), &r);
    // Beside the devkit, each val image's folder is checked against its ground truth.
    let devkit = blurred.join("ILSVRC2012_devkit_t12.tar.gz");
    write(&devkit, &devkit_tar_gz(&blurred, &r.ground_truth()));
    let rep = pack_ok(&blurred, &tmp.path().join("o-checked"));
    let labels = rep.splits["val"].labels.as_ref().unwrap();
    assert!(
        labels.checked.iter().any(|f| f.contains("devkit")),
        "{labels:?}"
    );
    let mut missorted = val.clone();
    missorted[0].0 = format!(
        "val_blurred/{}/{}",
        another(r.val[0].wnid),
        Replica::val_name(0)
    );
    write(
        &blurred.join("val_blurred.tar.gz"),
        &gz(&tar_of(&missorted)),
    );
    let e = refused(&opts(&blurred, &tmp.path().join("o-missorted")));
    assert!(
        e.contains(&Replica::val_name(0)) && e.contains(another(r.val[0].wnid)),
        "{e}"
    );
    write(&blurred.join("val_blurred.tar.gz"), &gz(&tar_of(&val)));
    // A split from two tars would pack its images twice.
    write(&blurred.join("train_more.tar"), &tar_of(&train));
    let e = refused(&opts(&blurred, &tmp.path().join("o-twice")));
    assert!(e.contains("two tars of one split"), "{e}");
    // ImageNetV2: folder k holds class k, a validation split.
    let mut members = Vec::new();
    let mut class_of = HashMap::new();
    for class in 0..12u32 {
        let bytes = jpeg(300 + class as usize);
        let name = format!("imagenetv2-matched-frequency-format-val/{class}/ab{class}.jpeg");
        members.push((name, bytes.clone()));
        class_of.insert(bytes, class);
    }
    let p = tmp.path().join("v2/imagenetv2-matched-frequency.tar.gz");
    write(&p, &gz(&tar_of(&members)));
    let out = tmp.path().join("o3");
    pack_ok(&p, &out);
    let recs = records(&out, "val");
    assert_eq!(recs.len(), 12);
    for (label, name, bytes) in recs {
        assert_eq!(
            (label, name),
            (class_of[&bytes], class_of[&bytes].to_string())
        );
    }
    // One folder of images states no class.
    let one = tar_of(&[
        ("images/a.jpg".into(), jpeg(1)),
        ("images/b.jpg".into(), jpeg(2)),
    ]);
    let p = tmp.path().join("one/photos.tar");
    write(&p, &one);
    let e = refused(&opts(&p, &tmp.path().join("o4")));
    assert!(e.contains("states no label"), "{e}");
}

#[test]
fn images_in_train_without_a_class_folder_are_refused() {
    // train/ holding the images flat (no class folders, names without a wnid) beside a sorted
    // val/: the train images were left out and val packed alone, with exit 0.
    let tmp = ddl_testkit::scratch("pack-flat-train");
    let r = Replica::new();
    let input = tmp.path().join("imagenet");
    for (file, im) in &r.train {
        write(&input.join("train").join(file), &im.jpeg);
    }
    r.write_train_tree(&input.join("val"));
    let e = refused(&opts(&input, &tmp.path().join("o")));
    assert!(
        e.contains("train") && e.contains("40 images") && e.contains("no class folders"),
        "{e}"
    );
}
