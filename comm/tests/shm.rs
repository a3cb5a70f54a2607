//! The shared-memory allreduce on in-process groups: exact and bitwise-identical sums in both
//! of its modes (whole buffers and chunked reduce-scatter), half types travelling as
//! themselves, a silent rank reported by name, and nothing left in /dev/shm.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ddl_comm::{
    bf16, f16, thread_group_with_timeout, Algorithm, Allreducer, CommError, Shm, Topology,
};

use crate::common;
use crate::common::exact;
use common::on_ranks;
use exact::{check_exact_sums, input};

fn bits<T: Copy>(v: &[T], to_bits: impl Fn(T) -> u32) -> Vec<u32> {
    v.iter().map(|&x| to_bits(x)).collect()
}

/// Buffer lengths (f32) around the modes' edges: summed whole up to 16 KiB, chunked above,
/// with chunks of 4 KiB (many, and a short last one) and of the default size.
const LENGTHS: [usize; 5] = [1, 4096, 4097, 25_003, 300_001];

#[test]
fn sums_are_exact_and_identical_on_every_rank() {
    for p in [2, 3, 5] {
        for algo in [Algorithm::SHM, Algorithm::Shm(Shm { chunk_bytes: 4096 })] {
            check_exact_sums(&algo, Topology::flat(p), &LENGTHS);
        }
    }
}

#[test]
fn half_types_travel_as_themselves_and_round_once() {
    // Integer data: the f32 sum is exact, so every algorithm rounds the same value once and
    // shm (which moves f16 / bf16) must equal rhd (which widens the buffer) bitwise.
    let p = 4;
    let results = on_ranks(p, move |r, t| {
        let shm = Allreducer::new(
            t.clone(),
            Algorithm::Shm(Shm { chunk_bytes: 2048 }),
            Topology::flat(p),
        )
        .expect("shm");
        let rhd = Allreducer::new(t, Algorithm::Rhd, Topology::flat(p)).expect("rhd");
        let mut out = Vec::new();
        for (salt, len) in [3usize, 5000, 20_011].into_iter().enumerate() {
            for average in [false, true] {
                let src = input(r, len, salt);
                let mut a: Vec<f16> = src.iter().map(|&v| f16::from_f32(v)).collect();
                let mut b = a.clone();
                shm.allreduce_f16(&mut a, average).expect("shm f16");
                rhd.allreduce_f16(&mut b, average).expect("rhd f16");
                let mut c: Vec<bf16> = src.iter().map(|&v| bf16::from_f32(v)).collect();
                let mut d = c.clone();
                shm.allreduce_bf16(&mut c, average).expect("shm bf16");
                rhd.allreduce_bf16(&mut d, average).expect("rhd bf16");
                out.push((
                    bits(&a, |v| v.to_bits().into()),
                    bits(&b, |v| v.to_bits().into()),
                    bits(&c, |v| v.to_bits().into()),
                    bits(&d, |v| v.to_bits().into()),
                ));
            }
        }
        out
    });
    for (r, res) in results.iter().enumerate() {
        for (k, (a, b, c, d)) in res.iter().enumerate() {
            assert_eq!(a, b, "rank {r} case {k}: f16 shm vs rhd");
            assert_eq!(c, d, "rank {r} case {k}: bf16 shm vs rhd");
            assert_eq!(
                a, &results[0][k].0,
                "rank {r} case {k}: f16 differs from rank 0"
            );
        }
    }
}

#[test]
fn a_silent_rank_is_named_within_the_timeout() {
    let timeout = Duration::from_millis(300);
    let group = thread_group_with_timeout(3, timeout);
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let mut handles = Vec::new();
    let mut done_rx = Some(done_rx);
    for (r, t) in group.into_iter().enumerate() {
        let done_tx = done_tx.clone();
        let done_rx = if r == 2 { done_rx.take() } else { None };
        handles.push(std::thread::spawn(move || {
            let ar = Allreducer::new(Arc::new(t), Algorithm::SHM, Topology::flat(3))
                .expect("allreducer");
            // All three meet once (this also sets up the region), then rank 2 goes silent.
            let mut buf = vec![1.0f32; 50_000];
            ar.allreduce_f32(&mut buf, false).expect("first call");
            if let Some(rx) = done_rx {
                // Stay alive (the region and transport too) until the others have failed.
                rx.recv().expect("ranks 0 and 1 report");
                rx.recv().expect("ranks 0 and 1 report");
                return None;
            }
            let start = Instant::now();
            let err = ar
                .allreduce_f32(&mut buf, false)
                .expect_err("rank 2 is silent");
            done_tx.send(()).expect("rank 2 listens");
            Some((start.elapsed(), err))
        }));
    }
    for (r, h) in handles.into_iter().enumerate() {
        let Some((elapsed, err)) = h.join().expect("thread") else {
            continue;
        };
        assert!(elapsed < timeout * 10, "rank {r} took {elapsed:?}");
        assert!(
            matches!(
                err,
                CommError::Timeout {
                    peer: Some(2),
                    op: "shm allreduce",
                    ..
                }
            ),
            "rank {r}: expected a timeout naming peer 2, got {err}"
        );
    }
}

/// Set in the process of its own that `nothing_is_left_in_dev_shm` runs its check in.
const ALONE: &str = "DDL_TEST_SHM_ALONE";

#[test]
fn nothing_is_left_in_dev_shm() {
    // A process's regions are named `ddl-PID-...`, and the other tests of this binary hold
    // regions of their own while they run: the check runs in a process of its own.
    if std::env::var_os(ALONE).is_none() {
        let name = "shm::nothing_is_left_in_dev_shm";
        let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", name, "--test-threads", "1"])
            .env(ALONE, "1")
            .output()
            .expect("run the test binary");
        let printed = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{printed}");
        assert!(
            printed.contains("1 passed"),
            "{name} did not run: {printed}"
        );
        return;
    }
    let prefix = format!("ddl-{}-", std::process::id());
    let ours = || {
        std::fs::read_dir("/dev/shm")
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                    .count()
            })
            .unwrap_or(0)
    };
    let sums = on_ranks(3, |r, t| {
        // Two allreducers on one group: two regions, used alternately.
        let a = Allreducer::new(t.clone(), Algorithm::SHM, Topology::flat(3)).expect("a");
        let b = Allreducer::new(t, Algorithm::Auto, Topology::flat(3)).expect("b");
        let mut x = vec![r as f32; 10_000];
        let mut y = vec![1.0f32; 100];
        a.allreduce_f32(&mut x, false).expect("a");
        b.allreduce_f32(&mut y, false).expect("b");
        a.allreduce_f32(&mut x, false).expect("a again");
        (x[0], y[0], b.resolve(400).name())
    });
    for (x, y, auto) in sums {
        assert_eq!((x, y), (9.0, 3.0));
        // The default cost model puts shm ahead of the message-based algorithms on one node.
        assert_eq!(auto, "shm");
    }
    assert_eq!(ours(), 0, "a region's file was left in /dev/shm");
}

/// Minor page faults of the calling thread so far.
fn thread_minor_faults() -> i64 {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(
        unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) },
        0
    );
    usage.ru_minflt
}

#[test]
fn the_first_call_of_a_new_size_takes_no_page_faults_in_the_region() {
    // The region's page tables are filled when it is made: a first call that reaches slots
    // no call touched before (here 256 KiB after 4 bytes) would otherwise take a fault per
    // page of its own slots (64 at 256 KiB) and of those it reads.
    let faults = on_ranks(2, |r, t| {
        let shm = Allreducer::new(t, Algorithm::SHM, Topology::flat(2)).expect("shm");
        let mut small = vec![r as f32];
        shm.allreduce_f32(&mut small, false)
            .expect("the region is made");
        // Non-zero: written (faulted in) here, not in the call.
        let mut big = vec![1.0 + r as f32; 64 << 10];
        let before = thread_minor_faults();
        shm.allreduce_f32(&mut big, false).expect("256 KiB");
        assert_eq!(big[0], 3.0);
        thread_minor_faults() - before
    });
    for (r, f) in faults.iter().enumerate() {
        assert!(
            *f < 16,
            "rank {r}: {f} minor page faults in its first 256 KiB call"
        );
    }
}
