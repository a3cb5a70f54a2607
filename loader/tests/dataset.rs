//! Node residency: which shards a node opens, staging, populate/lock, failures naming files.

use crate::common;

use common::{disk_scratch, evict, solid_dataset, solid_record, write_dataset, TestRecord};
use ddl_loader::dataset::{Dataset, OpenOptions, Residency};
use ddl_loader::manifest::Manifest;
use ddl_loader::shard::ShardReader;
use ddl_loader::LoaderError;
use ddl_testkit::scratch;

#[test]
fn nodes_own_shards_modulo_node_count() {
    let dir = scratch("residency");
    // 5 shards of 6, 6, 6, 6, 2 records.
    let records: Vec<TestRecord> = (0..26).map(solid_record).collect();
    write_dataset(dir.path(), "train", &records, 5, 2);
    let m = Manifest::load(dir.path()).unwrap();
    assert_eq!(Dataset::records_per_node(&m, "train", 2), vec![14, 12]);
    assert_eq!(Dataset::records_per_node(&m, "train", 3), vec![12, 8, 6]);
    assert_eq!(Dataset::records_per_node(&m, "nope", 2), vec![0, 0]);
    let opts = OpenOptions::default();
    let n0 = Dataset::open(dir.path(), "train", Residency { node: 0, nodes: 2 }, &opts).unwrap();
    let n1 = Dataset::open(dir.path(), "train", Residency { node: 1, nodes: 2 }, &opts).unwrap();
    assert_eq!((n0.len(), n1.len()), (14, 12));
    let names = |d: &Dataset| -> Vec<String> {
        d.shard_paths()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect()
    };
    assert_eq!(
        names(&n0),
        ["train-00000.ddl", "train-00002.ddl", "train-00004.ddl"]
    );
    assert_eq!(names(&n1), ["train-00001.ddl", "train-00003.ddl"]);
    // Global ids: node 0 holds records 0-5, 12-17 and 24-25.
    let ids: Vec<u64> = (0..n0.len()).map(|i| n0.global_id(i)).collect();
    let want: Vec<u64> = (0..6).chain(12..18).chain(24..26).collect();
    assert_eq!(ids, want);
    for (i, id) in ids.iter().enumerate() {
        // Label of record k is k % 4.
        assert_eq!(n0.record(i).unwrap().label as u64, id % 4);
        assert_eq!(n0.row(i).label as u64, id % 4);
    }
    // A different node count than at pack time is recomputed, not read from the manifest.
    let n2 = Dataset::open(dir.path(), "train", Residency { node: 2, nodes: 3 }, &opts).unwrap();
    assert_eq!(n2.len(), 6);
    // More nodes than shards: the idle node is told so.
    let e = Dataset::open(dir.path(), "train", Residency { node: 5, nodes: 6 }, &opts).unwrap_err();
    assert!(e.to_string().contains("none of them for node 5"), "{e}");
    assert!(Dataset::open(dir.path(), "train", Residency { node: 2, nodes: 2 }, &opts).is_err());
    assert!(Dataset::open(dir.path(), "val", Residency { node: 0, nodes: 1 }, &opts).is_err());
}

#[test]
fn missing_or_truncated_shard_fails_at_open_naming_the_file() {
    let dir = scratch("missing");
    solid_dataset(dir.path(), 20, 2);
    let one = Residency { node: 0, nodes: 1 };
    let shard = dir.path().join("train-00001.ddl");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() - 100]).unwrap();
    let e = Dataset::open(dir.path(), "train", one, &OpenOptions::default()).unwrap_err();
    assert!(e.to_string().contains("train-00001.ddl"), "{e}");
    std::fs::remove_file(&shard).unwrap();
    let e = Dataset::open(dir.path(), "train", one, &OpenOptions::default()).unwrap_err();
    assert!(matches!(e, LoaderError::Io { .. }));
    assert!(e.to_string().contains("train-00001.ddl"), "{e}");
    // Node 0 of 2 does not need shard 1.
    assert!(Dataset::open(
        dir.path(),
        "train",
        Residency { node: 0, nodes: 2 },
        &OpenOptions::default()
    )
    .is_ok());
}

#[test]
fn staging_copies_once_and_repairs_bad_copies() {
    let dir = scratch("stage-src");
    let stage = scratch("stage-dst");
    solid_dataset(dir.path(), 20, 3);
    let opts = OpenOptions {
        populate: true,
        lock: false,
        stage: Some(stage.path().join("shm")),
    };
    let res = Residency { node: 1, nodes: 2 };
    let ds = Dataset::open(dir.path(), "train", res, &opts).unwrap();
    assert_eq!(
        ds.shard_paths(),
        [stage.path().join("shm").join("train-00001.ddl")]
    );
    assert!(!stage.path().join("shm").join("train-00000.ddl").exists());
    drop(ds);
    let staged = stage.path().join("shm").join("train-00001.ddl");
    let mtime = std::fs::metadata(&staged).unwrap().modified().unwrap();
    // A second open reuses the good copy.
    Dataset::open(dir.path(), "train", res, &opts).unwrap();
    assert_eq!(
        std::fs::metadata(&staged).unwrap().modified().unwrap(),
        mtime
    );
    // A damaged copy is replaced.
    let mut bytes = std::fs::read(&staged).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&staged, &bytes).unwrap();
    let ds = Dataset::open(dir.path(), "train", res, &opts).unwrap();
    assert_eq!(ds.len(), 7);
    assert_eq!(
        std::fs::read(&staged).unwrap(),
        std::fs::read(dir.path().join("train-00001.ddl")).unwrap()
    );
    // A damaged source is refused, naming it.
    drop(ds);
    std::fs::remove_file(&staged).unwrap();
    let src = dir.path().join("train-00001.ddl");
    let mut bytes = std::fs::read(&src).unwrap();
    bytes[5000] ^= 1;
    std::fs::write(&src, &bytes).unwrap();
    let e = Dataset::open(dir.path(), "train", res, &opts).unwrap_err();
    assert!(
        e.to_string().contains("train-00001.ddl") && e.to_string().contains("crc32c"),
        "{e}"
    );
    assert!(!staged.exists());
}

/// One shard of 32 MiB of pseudo-random records (never decoded here): far larger than the
/// kernel's mmap read-around (`read_ahead_kb`, 8 MiB on some disks), so opening it brings in
/// only a part. Returns the shard's path.
fn big_dataset(dir: &std::path::Path) -> std::path::PathBuf {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let records: Vec<TestRecord> = (0..128)
        .map(|k| {
            let mut bytes = Vec::with_capacity(256 << 10);
            for _ in 0..(256 << 10) / 8 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                bytes.extend_from_slice(&x.to_le_bytes());
            }
            (bytes, (k % 4) as u32, 100, 100)
        })
        .collect();
    write_dataset(dir, "train", &records, 1, 1);
    dir.join("train-00000.ddl")
}

fn open_with(dir: &std::path::Path, populate: bool, lock: bool) -> Result<Dataset, LoaderError> {
    let opts = OpenOptions {
        populate,
        lock,
        stage: None,
    };
    Dataset::open(dir, "train", Residency { node: 0, nodes: 1 }, &opts)
}

/// Evicts `shard` and checks that a plain open leaves most of it on disk (the control that
/// makes "every page resident" after populate or lock mean something); returns its size.
fn evict_and_check_plain_open(dir: &std::path::Path, shard: &std::path::Path) -> u64 {
    evict(shard);
    let ds = open_with(dir, false, false).unwrap();
    let (file, resident) = (ds.file_bytes(), ds.resident_bytes().unwrap());
    assert!(
        resident < file / 2,
        "{resident} of {file} bytes resident after a plain open of an evicted shard"
    );
    drop(ds);
    evict(shard);
    file
}

#[test]
fn populate_brings_every_page_in_after_eviction() {
    let dir = disk_scratch("populate");
    let shard = big_dataset(dir.path());
    let file = evict_and_check_plain_open(dir.path(), &shard);
    let ds = open_with(dir.path(), true, false).unwrap();
    assert_eq!(ds.resident_bytes().unwrap(), file);
    drop(ds);
    // The same through ShardReader::populate.
    evict(&shard);
    let r = ShardReader::open(&shard).unwrap();
    assert!(r.resident_bytes().unwrap() < file / 2);
    r.populate().unwrap();
    assert_eq!(r.resident_bytes().unwrap(), file);
}

#[test]
fn lock_brings_every_page_in_or_names_the_memlock_limit() {
    let dir = disk_scratch("lock");
    let shard = big_dataset(dir.path());
    let file = evict_and_check_plain_open(dir.path(), &shard);
    match open_with(dir.path(), false, true) {
        // mlock faults every page in and keeps it.
        Ok(ds) => assert_eq!(ds.resident_bytes().unwrap(), file),
        // Without CAP_IPC_LOCK and with a limit below 32 MiB the error must say what to raise.
        Err(e) => {
            let s = e.to_string();
            assert!(
                s.contains("RLIMIT_MEMLOCK") && s.contains("train-00000.ddl"),
                "{s}"
            );
        }
    }
    evict(&shard);
    let r = ShardReader::open(&shard).unwrap();
    assert!(r.resident_bytes().unwrap() < file / 2);
    match r.lock() {
        Ok(()) => assert_eq!(r.resident_bytes().unwrap(), file),
        Err(e) => assert!(e.to_string().contains("RLIMIT_MEMLOCK"), "{e}"),
    }
}
