//! The shard reader never panics and never reads out of bounds, whatever the file holds: a
//! valid small shard damaged by bit flips, truncations, overwrites of header and index bytes
//! and arbitrary field values (with and without repaired checksums), plus thousands of random
//! byte strings. Every error names the file. This is the CI-speed counterpart of the cargo-fuzz
//! targets in `loader/fuzz/` (see "Robustness: fuzzing" in `loader/FORMAT.md`).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ddl_loader::format::{HEADER_CRC_SPAN, HEADER_LEN, INDEX_OFFSET, INDEX_ROW_LEN};
use ddl_loader::manifest::{ClassInfo, Manifest, ShardInfo, SplitInfo};
use ddl_loader::shard::{ShardReader, ShardWriter};
use proptest::prelude::*;
use proptest::sample::Index;

/// Record lengths of the valid shard: a 1-byte record, one just under and one exactly at the
/// 64-byte record alignment, and one spanning several alignment units.
const RECORD_LENS: [usize; 4] = [1, 63, 64, 130];

/// Bytes of header plus index of the valid shard: where damage is most interesting.
const META_LEN: usize = HEADER_LEN + RECORD_LENS.len() * INDEX_ROW_LEN;

thread_local! {
    /// This thread's scratch directory (removed when the thread ends).
    static SCRATCH: ddl_testkit::TempDir = ddl_testkit::scratch("robustness");
}

/// This thread's scratch directory.
fn scratch() -> PathBuf {
    SCRATCH.with(|d| d.path().to_path_buf())
}

/// Writes the valid shard with `ShardWriter` into `dir/name` and returns its bytes.
fn write_valid_shard(dir: &Path, name: &str) -> Vec<u8> {
    let path = dir.join(name);
    let mut w = ShardWriter::create(&path).unwrap();
    for (i, &len) in RECORD_LENS.iter().enumerate() {
        let bytes: Vec<u8> = (0..len).map(|j| (j * 7 + i * 31) as u8 | 1).collect();
        w.push(&bytes, i as u32, 8 + i as u16, 16 + i as u16)
            .unwrap();
    }
    w.finish().unwrap();
    std::fs::read(&path).unwrap()
}

/// The valid shard's bytes (written once per test binary).
fn valid() -> &'static [u8] {
    static VALID: OnceLock<Vec<u8>> = OnceLock::new();
    VALID.get_or_init(|| write_valid_shard(&scratch(), "valid.ddl"))
}

/// Recomputes the index checksum (when the rows lie within `bytes`) and then the header
/// checksum, as the fuzz targets' checksum-repair mode does, so that damage reaches the checks
/// behind the checksums.
fn fix_checksums(bytes: &mut [u8]) {
    if bytes.len() < HEADER_LEN {
        return;
    }
    let n = u64::from_le_bytes(bytes[16..24].try_into().unwrap());
    let end = n
        .checked_mul(INDEX_ROW_LEN as u64)
        .and_then(|x| x.checked_add(INDEX_OFFSET));
    if let Some(end) = end.filter(|&e| e <= bytes.len() as u64) {
        let crc = crc32c::crc32c(&bytes[INDEX_OFFSET as usize..end as usize]);
        bytes[48..52].copy_from_slice(&crc.to_le_bytes());
    }
    let crc = crc32c::crc32c(&bytes[..HEADER_CRC_SPAN]);
    bytes[HEADER_CRC_SPAN..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
}

/// Writes `bytes` as `dir/name`, opens it and, if it opens, reads every row and record and
/// runs `verify`. Panics (failing the test) only if the reader panics, an error does not name
/// the file, or an accepted record disagrees with its row. Returns whether the file opened.
fn exercise(dir: &Path, name: &str, bytes: &[u8]) -> bool {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    match ShardReader::open(&path) {
        Ok(r) => {
            assert_eq!(r.file_bytes(), bytes.len() as u64);
            let data_offset = r.header().data_offset;
            for i in 0..r.len() {
                let row = r.row(i);
                assert!(data_offset + row.offset + u64::from(row.length) <= bytes.len() as u64);
                match r.record(i) {
                    Ok(rec) => {
                        let start = (data_offset + row.offset) as usize;
                        assert_eq!(rec.bytes, &bytes[start..start + row.length as usize]);
                        assert_eq!(
                            (rec.label, rec.height, rec.width),
                            (row.label, row.height, row.width)
                        );
                    }
                    Err(e) => {
                        let msg = e.to_string();
                        assert!(
                            msg.contains(name) && msg.contains(&format!("record {i}")),
                            "{msg}"
                        );
                    }
                }
            }
            for e in r.verify() {
                assert!(e.to_string().contains(name), "{e}");
            }
            true
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains(name), "error does not name the file: {msg}");
            false
        }
    }
}

/// Field values that sit on the edges of the reader's checks.
fn edge_value() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(63),
        Just(64),
        Just(65),
        Just(4095),
        Just(4096),
        Just(4097),
        Just(u64::from(u32::MAX)),
        Just(u64::MAX),
        Just(u64::MAX - 63),
        Just(u64::MAX / 32),
        Just(valid().len() as u64),
        Just(valid().len() as u64 - 4096),
        any::<u64>(),
    ]
}

/// One way of damaging a shard image.
#[derive(Clone, Debug)]
enum Mutation {
    /// Flip one bit in the header or index (`meta`) or anywhere.
    Flip { at: Index, bit: u8, meta: bool },
    /// Cut the file to a length.
    Truncate { len: Index },
    /// Overwrite bytes in the header or index with random bytes.
    Overwrite { at: Index, bytes: Vec<u8> },
    /// Store a little-endian value of 1, 2, 4 or 8 bytes at an offset in the header or index.
    SetField { at: Index, width: u8, value: u64 },
    /// Append bytes to the file.
    Append { bytes: Vec<u8> },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<Index>(), 0u8..8, any::<bool>()).prop_map(|(at, bit, meta)| Mutation::Flip {
            at,
            bit,
            meta
        }),
        any::<Index>().prop_map(|len| Mutation::Truncate { len }),
        (any::<Index>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(at, bytes)| Mutation::Overwrite { at, bytes }),
        (
            any::<Index>(),
            prop::sample::select(vec![1u8, 2, 4, 8]),
            edge_value()
        )
            .prop_map(|(at, width, value)| Mutation::SetField { at, width, value }),
        prop::collection::vec(any::<u8>(), 1..100).prop_map(|bytes| Mutation::Append { bytes }),
    ]
}

/// Applies `m` to `b` (never panics: positions are reduced modulo the current length).
fn apply(b: &mut Vec<u8>, m: &Mutation) {
    let meta = b.len().min(META_LEN);
    match m {
        Mutation::Flip {
            at,
            bit,
            meta: in_meta,
        } => {
            let span = if *in_meta { meta } else { b.len() };
            if span > 0 {
                let i = at.index(span);
                b[i] ^= 1 << bit;
            }
        }
        Mutation::Truncate { len } => {
            let n = len.index(b.len() + 1);
            b.truncate(n);
        }
        Mutation::Overwrite { at, bytes } => {
            if meta > 0 {
                let i = at.index(meta);
                let n = bytes.len().min(b.len() - i);
                b[i..i + n].copy_from_slice(&bytes[..n]);
            }
        }
        Mutation::SetField { at, width, value } => {
            if meta > 0 {
                // Fields start at multiples of their width in both header and rows.
                let w = usize::from(*width);
                let i = at.index(meta) / w * w;
                let n = w.min(b.len() - i);
                b[i..i + n].copy_from_slice(&value.to_le_bytes()[..n]);
            }
        }
        Mutation::Append { bytes } => b.extend_from_slice(bytes),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1200))]

    /// One to four mutations of a valid shard, checksums repaired or not: the reader never
    /// panics and every error names the file.
    #[test]
    fn mutated_shards_never_panic(
        muts in prop::collection::vec(mutation(), 1..5),
        repair in any::<bool>(),
    ) {
        let mut b = valid().to_vec();
        for m in &muts {
            apply(&mut b, m);
        }
        if repair {
            fix_checksums(&mut b);
        }
        exercise(&scratch(), "mutated.ddl", &b);
    }

    /// Arbitrary short byte strings.
    #[test]
    fn random_bytes_never_panic(b in prop::collection::vec(any::<u8>(), 0..300)) {
        prop_assert!(!exercise(&scratch(), "random.ddl", &b));
    }

    /// Random bytes behind a plausible version-1 header prefix, checksums repaired, so that the
    /// header's offset checks and the rows see arbitrary values.
    #[test]
    fn random_bytes_behind_valid_prefix_never_panic(
        tail in prop::collection::vec(any::<u8>(), 0..400),
        pad_to_page in any::<bool>(),
    ) {
        let mut b = b"DDLSHARD\x01\0\0\0\x40\0\0\0".to_vec();
        b.extend_from_slice(&tail);
        if pad_to_page && b.len() < 4096 + 64 {
            b.resize(4096 + 64, 0);
        }
        fix_checksums(&mut b);
        exercise(&scratch(), "prefixed.ddl", &b);
    }
}

/// Every single-bit flip in the header and index is rejected at open (checksums), truncation
/// to any of several hundred lengths is rejected (the header fixes the file length), and the
/// intact shard reads back completely.
#[test]
fn header_index_bit_flips_and_truncations_are_rejected() {
    let dir = scratch();
    let good = valid();
    assert!(exercise(&dir, "intact.ddl", good));
    for byte in 0..META_LEN {
        for bit in 0..8 {
            let mut b = good.to_vec();
            b[byte] ^= 1 << bit;
            assert!(
                !exercise(&dir, "flip.ddl", &b),
                "flip of byte {byte} bit {bit} accepted"
            );
        }
    }
    // Every length through the header and index and a little beyond, a sample of the padding,
    // and every length from just before the data region's start to one byte short of the end.
    let lens = (0..=META_LEN + 8)
        .chain((META_LEN + 8..4088).step_by(97))
        .chain(4088..good.len());
    for len in lens {
        assert!(
            !exercise(&dir, "trunc.ddl", &good[..len]),
            "truncation to {len} accepted"
        );
    }
}

/// Shards whose header or rows carry extreme values behind valid checksums (overflowing
/// offsets and lengths, huge record counts) are rejected with an error naming the file and,
/// for rows, the record.
#[test]
fn extreme_fields_behind_valid_checksums_are_rejected() {
    let dir = scratch();
    let good = valid();
    let field = |at: usize, value: u64| {
        let mut b = good.to_vec();
        b[at..at + 8].copy_from_slice(&value.to_le_bytes());
        fix_checksums(&mut b);
        b
    };
    for value in [u64::MAX, u64::MAX / 32, u64::MAX / 32 - 2, 1 << 40, 5] {
        assert!(
            !exercise(&dir, "count.ddl", &field(16, value)),
            "record_count {value}"
        );
    }
    for value in [0, 4095, u64::MAX - 4095, u64::MAX] {
        assert!(
            !exercise(&dir, "dataoff.ddl", &field(32, value)),
            "data_offset {value}"
        );
        assert!(
            !exercise(&dir, "datalen.ddl", &field(40, value)),
            "data_len {value}"
        );
    }
    for row in 0..RECORD_LENS.len() {
        let at = INDEX_OFFSET as usize + row * INDEX_ROW_LEN;
        for value in [u64::MAX - 63, u64::MAX, 1 << 32, 4096] {
            let path = dir.join("rowoff.ddl");
            std::fs::write(&path, field(at, value)).unwrap();
            let e = ShardReader::open(&path).unwrap_err().to_string();
            assert!(
                e.contains("rowoff.ddl") && e.contains(&format!("record {row}")),
                "{e}"
            );
        }
    }
}

/// The checked-in fuzz seeds (`loader/fuzz/seeds/`) are what this crate's writer produces, so
/// the fuzzers start from valid inputs. Run with `DDL_WRITE_FUZZ_SEEDS=1` to regenerate them
/// after a format change.
#[test]
fn fuzz_seeds_are_current() {
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    let dir = scratch();
    let shard = valid().to_vec();
    let empty = {
        let p = dir.join("empty.ddl");
        ShardWriter::create(&p).unwrap().finish().unwrap();
        std::fs::read(&p).unwrap()
    };
    let manifest_dir = dir.join("manifest");
    std::fs::create_dir_all(&manifest_dir).unwrap();
    Manifest {
        format_version: 1,
        classes: (0..RECORD_LENS.len() as u32)
            .map(|label| ClassInfo {
                wnid: format!("n{label:08}"),
                label,
            })
            .collect(),
        splits: [(
            "train".to_string(),
            SplitInfo {
                records: 2 * RECORD_LENS.len() as u64,
                shards: (0..2)
                    .map(|s| ShardInfo {
                        file: format!("train-{s:05}.ddl"),
                        records: RECORD_LENS.len() as u64,
                        bytes: shard.len() as u64,
                        crc32c: crc32c::crc32c(&shard),
                        node: s,
                    })
                    .collect(),
            },
        )]
        .into_iter()
        .collect(),
        pack: serde_json::json!({ "packer": "fuzz seed", "quality": 90 }),
        nodes: 2,
    }
    .save(&manifest_dir)
    .unwrap();
    let manifest = std::fs::read(manifest_dir.join("manifest.json")).unwrap();

    let with_prefix = |prefix: &[u8], body: &[u8]| [prefix, body].concat();
    let len8 = |b: &[u8]| (b.len() as u64).to_le_bytes();
    let expected: Vec<(&str, Vec<u8>)> = vec![
        ("shard_open/tiny", with_prefix(&[0], &shard)),
        ("shard_open/tiny-repair", with_prefix(&[3], &shard)),
        ("shard_open/empty-repair", with_prefix(&[3], &empty)),
        (
            "header_index/tiny",
            with_prefix(&[[0u8].as_slice(), &len8(&shard)].concat(), &shard),
        ),
        (
            "header_index/tiny-repair",
            with_prefix(&[[3u8].as_slice(), &len8(&shard)].concat(), &shard),
        ),
        (
            "header_index/empty-repair",
            with_prefix(&[[3u8].as_slice(), &len8(&empty)].concat(), &empty),
        ),
        ("manifest/valid.json", manifest),
    ];
    let write = std::env::var_os("DDL_WRITE_FUZZ_SEEDS").is_some();
    for (name, bytes) in expected {
        let path = seeds.join(name);
        if write {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        }
        let stored = std::fs::read(&path).unwrap_or_default();
        assert!(
            stored == bytes,
            "{} is stale or missing: rerun with DDL_WRITE_FUZZ_SEEDS=1",
            path.display()
        );
    }
    assert!(ShardReader::open(&dir.join("empty.ddl"))
        .unwrap()
        .is_empty());
    assert_eq!(
        Manifest::load(&manifest_dir).unwrap().num_classes(),
        RECORD_LENS.len()
    );
}

/// Regression: shard record counts whose sum overflows a u64 are rejected with an error naming
/// the manifest (the unchecked sum panicked with overflow checks on and, without them, wrapped
/// around to a total that could match `records`).
#[test]
fn manifest_record_count_overflow_is_rejected() {
    let dir = scratch().join("overflow");
    std::fs::create_dir_all(&dir).unwrap();
    let shard = |s: usize, records: u64| {
        format!(
            r#"{{"file": "train-{s:05}.ddl", "records": {records}, "bytes": 4096, "crc32c": 0, "node": {s}}}"#
        )
    };
    let json = format!(
        r#"{{"format_version": 1, "classes": [], "pack": {{}}, "nodes": 2,
            "splits": {{"train": {{"records": 4, "shards": [{}, {}]}}}}}}"#,
        shard(0, u64::MAX - 1),
        shard(1, 6)
    );
    std::fs::write(dir.join("manifest.json"), json).unwrap();
    let e = Manifest::load(&dir).unwrap_err().to_string();
    assert!(e.contains("manifest.json") && e.contains("overflow"), "{e}");
}
