//! Shared helpers: tiny packed datasets of generated JPEGs in a scratch directory.

use std::path::Path;

use ddl_loader::pack::convert::ConvertOptions;
use ddl_loader::pack::{PackOptions, ShardCount};
use ddl_loader::sampler::{Sampler, SamplerConfig, Tail};
use ddl_testkit::{write_manifest, write_shards, Record, TempDir};

/// RGB colour of each class in the solid-colour datasets.
pub const PALETTE: [[u8; 3]; 4] = [[220, 30, 30], [30, 200, 40], [40, 60, 210], [230, 220, 40]];

/// A scratch directory under the build's own temporary directory (`CARGO_TARGET_TMPDIR`, on
/// the disk of `target/`), for tests that evict files from the page cache: a tmpfs `/tmp`
/// keeps every page.
pub fn disk_scratch(name: &str) -> TempDir {
    ddl_testkit::scratch_in(Path::new(env!("CARGO_TARGET_TMPDIR")), name)
}

/// Drops `path` from the page cache (`fdatasync`, a full read, then
/// `posix_fadvise(POSIX_FADV_DONTNEED)`) and asserts, with `mincore`, that none of it is
/// resident any more: the precondition of a test that then expects pages to come back.
///
/// DONTNEED skips pages under I/O, and read-ahead started by an earlier mapping of the file
/// may still be in flight: the read waits for every page first, and the whole sequence is
/// tried up to three times before the file system is blamed.
pub fn evict(path: &Path) {
    use std::os::fd::AsRawFd;
    let mut left = 0;
    for _ in 0..3 {
        let mut f = std::fs::File::open(path).unwrap();
        f.sync_data().unwrap();
        std::io::copy(&mut f, &mut std::io::sink()).unwrap();
        // SAFETY: plain syscall on a descriptor we own; offset 0, length 0 = the whole file.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0, "posix_fadvise {}", path.display());
        left = ddl_loader::shard::cached_bytes(path).unwrap();
        if left == 0 {
            return;
        }
    }
    panic!(
        "{} keeps {left} bytes in the page cache after POSIX_FADV_DONTNEED: its file system \
         does not evict (a tmpfs?), so residency cannot be tested there",
        path.display()
    );
}

/// Pack options for the tests' tiny inputs: `shards` shards per split, two threads, shorter
/// side at most 32 (so that the tests' small JPEGs are stored as they are), quality 90.
pub fn small_pack(input: &Path, output: &Path, shards: usize) -> PackOptions {
    let mut o = PackOptions::new(input, output);
    o.shards = ShardCount::Count(shards);
    o.threads = 2;
    o.convert = ConvertOptions {
        max_short_side: 32,
        quality: 90,
        reencode: false,
    };
    o
}

/// Encodes a `w` x `h` RGB image as a JPEG (4:4:4, quality 95).
pub fn jpeg(rgb: &[u8], w: usize, h: usize) -> Vec<u8> {
    ddl_testkit::encode_jpeg(rgb, w, h, 95, ddl_testkit::Subsamp::None)
}

/// A solid-colour JPEG.
pub fn solid_jpeg(color: [u8; 3], w: usize, h: usize) -> Vec<u8> {
    let rgb: Vec<u8> = (0..w * h).flat_map(|_| color).collect();
    jpeg(&rgb, w, h)
}

/// A record of the test datasets: JPEG bytes, label, height, width.
pub type TestRecord = (Vec<u8>, u32, u16, u16);

/// Solid-colour record `k`: label `k % 4`, sides between 40 and 111 pixels.
pub fn solid_record(k: usize) -> TestRecord {
    let label = (k % 4) as u32;
    let w = 40 + (k * 37) % 72;
    let h = 40 + (k * 53) % 72;
    (
        solid_jpeg(PALETTE[label as usize], w, h),
        label,
        h as u16,
        w as u16,
    )
}

/// Writes `records` into `shards` shards (round-robin by record order, contiguous blocks) of
/// split `split` under `dir`, plus a manifest for `nodes` nodes.
pub fn write_dataset(dir: &Path, split: &str, records: &[TestRecord], shards: usize, nodes: usize) {
    let per = records.len().div_ceil(shards);
    let shards: Vec<Vec<Record>> = records
        .chunks(per)
        .map(|chunk| {
            chunk
                .iter()
                .map(|(bytes, label, h, w)| Record {
                    bytes: bytes.clone(),
                    label: *label,
                    size: (*h, *w),
                })
                .collect()
        })
        .collect();
    let info = write_shards(dir, split, &shards, nodes);
    write_manifest(dir, PALETTE.len(), vec![(split, info)], nodes);
}

/// Writes a solid-colour dataset of `n` records.
pub fn solid_dataset(dir: &Path, n: usize, shards: usize) {
    let records: Vec<TestRecord> = (0..n).map(solid_record).collect();
    write_dataset(dir, "train", &records, shards, 1);
}

/// A shuffling sampler over all `n` records of a one-node, one-rank dataset.
pub fn sampler(n: usize, replicas: usize, batch: usize, tail: Tail, seed: u64) -> Sampler {
    Sampler::new(
        n,
        n,
        SamplerConfig {
            seed,
            ranks_in_node: 1,
            rank_in_node: 0,
            replicas,
            batch_per_replica: batch,
            tail,
            shuffle: true,
        },
    )
}

pub use ddl_testkit::tar_of;
