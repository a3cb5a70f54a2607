//! Steady-state memory of the pipeline. This is its own test binary, so its own process: no
//! other test's threads or allocations count. A counting global allocator sees every
//! allocation the pipeline makes.
//!
//! Asserted: (1) once the pipeline runs, no allocation as large as a batch's image buffer is
//! ever made again, across batches and epochs (buffers are recycled, not reallocated); (2) the
//! resident set stays below shard bytes + (prefetch depth + workers) x batch bytes + 64 MiB,
//! sampled at every batch over ten epochs, which holding on to (leaking) one buffer per batch
//! would exceed several times over.

use crate::common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::{jpeg, sampler, write_dataset, TestRecord};
use ddl_loader::dataset::{Dataset, OpenOptions, Residency};
use ddl_loader::pipeline::{Augment, OnBadRecord, Output, Pipeline, PipelineConfig};
use ddl_loader::sampler::Tail;
use ddl_testkit::scratch;

/// Allocations of at least `BIG` bytes are counted in `BIG_ALLOCS`.
static BIG: AtomicUsize = AtomicUsize::new(usize::MAX);
static BIG_ALLOCS: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting large allocations and growths.
struct Counting;

fn note(size: usize) {
    if size >= BIG.load(Ordering::Relaxed) {
        BIG_ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded unchanged to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc_zeroed(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            note(new_size);
        }
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Resident set size of this process in bytes (VmRSS).
fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS line");
    kb * 1024
}

/// Textured record `k` (gradients and a hash pattern): sides between 150 and 299 pixels.
fn textured_record(k: usize) -> TestRecord {
    let w = 150 + (k * 37) % 150;
    let h = 150 + (k * 53) % 150;
    let rgb: Vec<u8> = (0..w * h * 3)
        .map(|i| {
            let (x, y, c) = ((i / 3) % w, (i / 3) / w, i % 3);
            ((x * (c + 1) + y * (3 - c) + (x * y + k) % 29) % 256) as u8
        })
        .collect();
    (jpeg(&rgb, w, h), (k % 4) as u32, h as u16, w as u16)
}

#[test]
fn steady_state_memory_is_bounded_and_buffers_are_recycled() {
    let dir = scratch("memory");
    let records: Vec<TestRecord> = (0..96).map(textured_record).collect();
    write_dataset(dir.path(), "train", &records, 2, 1);
    drop(records);
    let opts = OpenOptions {
        populate: true,
        ..OpenOptions::default()
    };
    let ds = Arc::new(
        Dataset::open(dir.path(), "train", Residency { node: 0, nodes: 1 }, &opts).unwrap(),
    );
    let (size, batch, workers, prefetch) = (128usize, 32usize, 2usize, 2usize);
    let batch_bytes = (batch * 3 * size * size * 4) as u64;
    let bound = ds.file_bytes() + (prefetch + workers) as u64 * batch_bytes + (64 << 20);
    let cfg = PipelineConfig {
        image_size: size as u32,
        output: Output::F32Nchw,
        augment: Augment::Train,
        workers,
        prefetch,
        seed: 5,
        on_bad_record: OnBadRecord::Skip,
        ..PipelineConfig::default()
    };
    let sampler = sampler(ds.len(), 1, batch, Tail::Drop, 1);
    // The pipeline allocates its batch buffers when it starts; from then on, nothing of that
    // size may be allocated again.
    let mut p = Pipeline::start(Arc::clone(&ds), sampler, cfg, 0, 0).unwrap();
    BIG.store(batch_bytes as usize, Ordering::SeqCst);
    let (mut batches, mut peak) = (0usize, 0u64);
    for epoch in 0..10u64 {
        if epoch > 0 {
            p = p.next_epoch(epoch, 0).unwrap();
        }
        for b in p.replica(0) {
            let b = b.unwrap();
            assert_eq!(b.shape(), [batch, 3, size, size]);
            batches += 1;
            peak = peak.max(rss());
        }
    }
    drop(p);
    let big = BIG_ALLOCS.load(Ordering::SeqCst);
    BIG.store(usize::MAX, Ordering::SeqCst);
    assert_eq!(batches, 30);
    assert_eq!(
        big, 0,
        "{big} batch-sized allocations after the start: buffers are not recycled"
    );
    // What the bound must catch: keeping one buffer per batch would add 30 x batch bytes.
    assert!(30 * batch_bytes > bound);
    assert!(
        peak < bound,
        "steady-state RSS {:.1} MiB exceeds shards + (prefetch + workers) x batch + 64 MiB = {:.1} MiB",
        peak as f64 / (1 << 20) as f64,
        bound as f64 / (1 << 20) as f64
    );
}
