//! Shared helpers: tiny packed datasets of generated JPEGs in a scratch directory.

#![allow(dead_code)] // each test binary uses a different subset

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ddl_loader::manifest::{ClassInfo, Manifest, ShardInfo, SplitInfo};
use ddl_loader::sampler::{Sampler, SamplerConfig, Tail};
use ddl_loader::shard::ShardWriter;

/// RGB colour of each class in the solid-colour datasets.
pub const PALETTE: [[u8; 3]; 4] = [[220, 30, 30], [30, 200, 40], [40, 60, 210], [230, 220, 40]];

/// A scratch directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// A fresh, empty directory named after the test.
    pub fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("ddl-loader-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A scratch directory under the build's own temporary directory (`CARGO_TARGET_TMPDIR`, on
/// the disk of `target/`), for tests that evict files from the page cache: a tmpfs `/tmp`
/// keeps every page.
pub fn disk_scratch(name: &str) -> Scratch {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("ddl-loader-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

/// Drops `path` from the page cache (`fdatasync`, then `posix_fadvise(POSIX_FADV_DONTNEED)`)
/// and asserts, with `mincore`, that none of it is resident any more: the precondition of a
/// test that then expects pages to come back.
pub fn evict(path: &Path) {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    f.sync_data().unwrap();
    // SAFETY: plain syscall on a descriptor we own; offset 0, length 0 = the whole file.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0, "posix_fadvise {}", path.display());
    let left = ddl_loader::shard::cached_bytes(path).unwrap();
    assert_eq!(
        left,
        0,
        "{} keeps {left} bytes in the page cache after POSIX_FADV_DONTNEED: its file system \
         does not evict (a tmpfs?), so residency cannot be tested there",
        path.display()
    );
}

/// Encodes a `w` x `h` RGB image as a JPEG (4:4:4, quality 95).
pub fn jpeg(rgb: &[u8], w: usize, h: usize) -> Vec<u8> {
    let img = turbojpeg::Image {
        pixels: rgb,
        width: w,
        pitch: w * 3,
        height: h,
        format: turbojpeg::PixelFormat::RGB,
    };
    turbojpeg::compress(img, 95, turbojpeg::Subsamp::None)
        .unwrap()
        .to_vec()
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
    let mut infos = Vec::new();
    for (s, chunk) in records.chunks(per).enumerate() {
        let file = format!("{split}-{s:05}.ddl");
        let mut w = ShardWriter::create(&dir.join(&file)).unwrap();
        for (bytes, label, h, wd) in chunk {
            w.push(bytes, *label, *h, *wd).unwrap();
        }
        let sum = w.finish().unwrap();
        infos.push(ShardInfo {
            file,
            records: sum.records,
            bytes: sum.bytes,
            crc32c: sum.crc32c,
            node: s % nodes,
        });
    }
    let mut splits = BTreeMap::new();
    splits.insert(
        split.to_string(),
        SplitInfo {
            records: records.len() as u64,
            shards: infos,
        },
    );
    let manifest = Manifest {
        format_version: 1,
        classes: (0..4)
            .map(|i| ClassInfo {
                wnid: format!("n{i:08}"),
                label: i,
            })
            .collect(),
        splits,
        pack: serde_json::json!({"test": true}),
        nodes,
    };
    manifest.save(dir).unwrap();
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
