//! ImageNet as TensorFlow users hold it, TFRecord files of `tf.train.Example` records, packed in
//! one call and every record matched to its source image and torchvision's label
//! (`pack_downloads.rs`'s replica): TensorFlow Datasets' `imagenet2012` and the TPU reference's
//! `imagenet_to_gcs.py` output. The records are encoded here by hand from TensorFlow's
//! `feature.proto` and `record_writer.cc`, not by ddl's decoder.

use std::path::Path;

use ddl_loader::pack::{self, NoProgress};

use crate::pack_downloads::{assert_labels, jpeg, opts, refused, write, Image, Replica, WNIDS};

/// A feature's value.
enum Value {
    Bytes(Vec<u8>),
    Int(i64),
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A length-delimited protobuf field (wire type 2).
fn field(tag: u64, bytes: &[u8], out: &mut Vec<u8>) {
    varint(tag << 3 | 2, out);
    varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

/// A `tf.train.Example` of `features`: `Example.features` (1) holds `Features.feature` (1), a map
/// whose entries are key (1) and `Feature` (2); a `Feature` is `bytes_list` (1) or `int64_list`
/// (3), each a packed `value` (1).
fn example(features: &[(&str, Value)]) -> Vec<u8> {
    let mut map = Vec::new();
    for (key, value) in features {
        let (mut list, mut feature, mut entry) = (Vec::new(), Vec::new(), Vec::new());
        match value {
            Value::Bytes(b) => {
                field(1, b, &mut list);
                field(1, &list, &mut feature);
            }
            Value::Int(i) => {
                let mut packed = Vec::new();
                varint(*i as u64, &mut packed);
                field(1, &packed, &mut list);
                field(3, &list, &mut feature);
            }
        }
        field(1, key.as_bytes(), &mut entry);
        field(2, &feature, &mut entry);
        field(1, &entry, &mut map);
    }
    let mut ex = Vec::new();
    field(1, &map, &mut ex);
    ex
}

fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// A TFRecord file of `records`: length, its masked CRC, data, its masked CRC.
fn tfrecord(records: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in records {
        let len = (r.len() as u64).to_le_bytes();
        out.extend_from_slice(&len);
        out.extend_from_slice(&masked_crc(&len).to_le_bytes());
        out.extend_from_slice(r);
        out.extend_from_slice(&masked_crc(r).to_le_bytes());
    }
    out
}

fn sorted_index(wnid: &str) -> i64 {
    let mut sorted = WNIDS.to_vec();
    sorted.sort_unstable();
    sorted.iter().position(|w| *w == wnid).unwrap() as i64
}

/// `record(file name, image)` of each image of `r`: (train, validation).
fn by_split(
    r: &Replica,
    record: impl Fn(String, &Image) -> Vec<u8>,
) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let train = r.train.iter().map(|(f, im)| record(f.clone(), im));
    let val = r.val.iter().enumerate();
    let val = val.map(|(k, im)| record(Replica::val_name(k), im));
    (train.collect(), val.collect())
}

/// TensorFlow Datasets' records of `r`: (train, validation), `label` by `labels` (sorted wnids,
/// as TFDS numbers them).
fn tfds_records(r: &Replica, labels: &[&str]) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let number = |w: &str| labels.iter().position(|l| *l == w).unwrap() as i64;
    let record = |name: String, im: &Image| {
        example(&[
            ("image", Value::Bytes(im.jpeg.clone())),
            ("label", Value::Int(number(im.wnid))),
            ("file_name", Value::Bytes(name.into_bytes())),
        ])
    };
    by_split(r, record)
}

/// `imagenet2012/5.1.0/` as `tfds.load("imagenet2012")` leaves it.
fn write_tfds(dir: &Path, train: &[Vec<u8>], val: &[Vec<u8>], labels: Option<&[&str]>) {
    let (a, b) = train.split_at(train.len() / 2);
    write(
        &dir.join("imagenet2012-train.tfrecord-00000-of-00002"),
        &tfrecord(a),
    );
    write(
        &dir.join("imagenet2012-train.tfrecord-00001-of-00002"),
        &tfrecord(b),
    );
    write(
        &dir.join("imagenet2012-validation.tfrecord-00000-of-00001"),
        &tfrecord(val),
    );
    let test = example(&[
        ("image", Value::Bytes(jpeg(9))),
        ("label", Value::Int(-1)),
        (
            "file_name",
            Value::Bytes(b"ILSVRC2012_test_00000001.JPEG".to_vec()),
        ),
    ]);
    write(
        &dir.join("imagenet2012-test.tfrecord-00000-of-00001"),
        &tfrecord(&[test]),
    );
    write(&dir.join("dataset_info.json"), b"{}");
    write(&dir.join("features.json"), b"{}");
    let txt = dir.join("label.labels.txt");
    match labels {
        Some(l) => write(
            &txt,
            l.iter()
                .map(|w| format!("{w}\n"))
                .collect::<String>()
                .as_bytes(),
        ),
        None => std::fs::remove_file(&txt).unwrap_or(()),
    }
}

#[test]
fn tensorflow_datasets_records_are_labelled_by_their_number() {
    let tmp = ddl_testkit::scratch("pack-tfds");
    let r = Replica::new();
    let mut sorted = WNIDS.to_vec();
    sorted.sort_unstable();
    let input = tmp.path().join("imagenet2012");
    let dir = input.join("5.1.0");
    let (train, val) = tfds_records(&r, &sorted);
    write_tfds(&dir, &train, &val, Some(&sorted));
    // The last record damaged after it was written: skipped and reported, the rest packed.
    let second = dir.join("imagenet2012-train.tfrecord-00001-of-00002");
    let mut bytes = std::fs::read(&second).unwrap();
    let n = bytes.len();
    bytes[n - 10] ^= 1;
    write(&second, &bytes);
    let out = tmp.path().join("out");
    let mut o = opts(&input, &out);
    o.max_skip_fraction = 0.05;
    let rep = pack::pack(&o, &NoProgress).unwrap();
    assert_labels(&out, "train", r.train.len() - 1, &r);
    assert_labels(&out, "val", r.val.len(), &r);
    assert_eq!(rep.skipped.len(), 1, "{:?}", rep.skipped);
    let last = train.len() - train.len() / 2 - 1;
    assert!(rep.skipped[0]
        .path
        .ends_with(&format!("00001-of-00002[record {last}]")));
    assert!(
        rep.skipped[0].reason.contains("CRC"),
        "{:?}",
        rep.skipped[0]
    );
    let ignored = |name: &str| rep.ignored_files.iter().any(|f| f.path.ends_with(name));
    assert!(ignored("imagenet2012-test.tfrecord-00000-of-00001") && ignored("features.json"));
    assert!(!ignored("label.labels.txt"), "read, not ignored");

    // TensorFlow Datasets' data folder holds one folder per dataset: which is not guessed.
    std::fs::create_dir_all(tmp.path().join("downloads").join("manual")).unwrap();
    let e = refused(&opts(tmp.path(), &tmp.path().join("o-data")));
    assert!(
        e.contains("data folder") && e.contains("imagenet2012"),
        "{e}"
    );

    // Without label.labels.txt the training file names name the numbers.
    let (train, val) = tfds_records(&r, &sorted);
    write_tfds(&dir, &train, &val, None);
    let out = tmp.path().join("out-names");
    pack::pack(&opts(&dir, &out), &NoProgress).unwrap();
    assert_labels(&out, "train", r.train.len(), &r);
    assert_labels(&out, "val", r.val.len(), &r);

    // A label list that disagrees with the training names is refused, naming record and line.
    let mut swapped = sorted.clone();
    swapped.swap(0, 1);
    write_tfds(&dir, &train, &val, Some(&swapped));
    let e = refused(&opts(&dir, &tmp.path().join("o1")));
    assert!(
        e.contains("[record ") && e.contains("label.labels.txt"),
        "{e}"
    );
    // Numbered by another list than the one beside them, and the names agree: the list
    // beside the files is the one ddl-pack reads, and it must match the class list given.
    let (train, val) = tfds_records(&r, &swapped);
    write_tfds(&dir, &train, &val, Some(&swapped));
    let mut o = opts(&dir, &tmp.path().join("o2"));
    let list = tmp.path().join("classes.txt");
    write(
        &list,
        sorted
            .iter()
            .map(|w| format!("{w}\n"))
            .collect::<String>()
            .as_bytes(),
    );
    o.classes = Some(list);
    let e = refused(&o);
    assert!(
        e.contains("classes.txt") && e.contains("label.labels.txt"),
        "{e}"
    );
}

/// The TPU reference's records of `r` (`imagenet_to_gcs.py`): label numbers from 1.
fn tpu_records(r: &Replica) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let record = |name: String, im: &Image| {
        example(&[
            ("image/class/label", Value::Int(sorted_index(im.wnid) + 1)),
            (
                "image/class/synset",
                Value::Bytes(im.wnid.as_bytes().to_vec()),
            ),
            ("image/format", Value::Bytes(b"JPEG".to_vec())),
            ("image/filename", Value::Bytes(name.into_bytes())),
            ("image/encoded", Value::Bytes(im.jpeg.clone())),
            ("image/height", Value::Int(20)),
        ])
    };
    by_split(r, record)
}

#[test]
fn tpu_reference_records_are_labelled_by_their_synset() {
    let tmp = ddl_testkit::scratch("pack-tpu-tfrecord");
    let r = Replica::new();
    let dir = tmp.path().join("imagenet-tfrecords");
    let (train, val) = tpu_records(&r);
    let (a, b) = train.split_at(7);
    write(&dir.join("train-00000-of-00002"), &tfrecord(a));
    write(&dir.join("train-00001-of-00002"), &tfrecord(b));
    write(&dir.join("validation-00000-of-00001"), &tfrecord(&val));
    let out = tmp.path().join("out");
    let rep = pack::pack(&opts(&dir, &out), &NoProgress).unwrap();
    assert_labels(&out, "train", r.train.len(), &r);
    assert_labels(&out, "val", r.val.len(), &r);
    assert!(rep.skipped.is_empty(), "{:?}", rep.skipped);

    // One synset with two numbers is refused, naming both records.
    let mut wrong = val.clone();
    let im = &r.val[0];
    wrong[0] = example(&[
        ("image/class/label", Value::Int(sorted_index(im.wnid) + 2)),
        (
            "image/class/synset",
            Value::Bytes(im.wnid.as_bytes().to_vec()),
        ),
        ("image/encoded", Value::Bytes(im.jpeg.clone())),
    ]);
    write(&dir.join("validation-00000-of-00001"), &tfrecord(&wrong));
    let e = refused(&opts(&dir, &tmp.path().join("o1")));
    assert!(e.contains("validation-00000-of-00001[record 0]"), "{e}");
    assert!(e.contains(&format!("states {}", im.wnid)), "{e}");

    // A file cut short (an interrupted copy) is refused, naming it: its last records would be
    // left out.
    let whole = tfrecord(&val);
    write(
        &dir.join("validation-00000-of-00001"),
        &whole[..whole.len() - 9],
    );
    let e = refused(&opts(&dir, &tmp.path().join("o2")));
    assert!(
        e.contains("validation-00000-of-00001") && e.contains("cut short"),
        "{e}"
    );

    // Compressed files are refused, saying so.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &whole).unwrap();
    write(
        &dir.join("validation-00000-of-00001"),
        &gz.finish().unwrap(),
    );
    let e = refused(&opts(&dir, &tmp.path().join("o3")));
    assert!(e.contains("gzip-compressed"), "{e}");
}
