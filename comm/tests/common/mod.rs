//! Helpers shared by the in-process tests of ddl-comm.

pub mod exact;

use std::sync::Arc;

use ddl_comm::{
    tcp_group, thread_group, Across, Algorithm, Hierarchical, Multicolor, Multiring, Shm, Transport,
};

/// Runs `f(rank, transport)` on one thread per rank of a fresh in-process group of `n` and
/// returns the results in rank order.
pub fn on_ranks<R: Send + 'static>(
    n: usize,
    f: impl Fn(usize, Arc<dyn Transport>) -> R + Send + Sync + 'static,
) -> Vec<R> {
    on_group(thread_group(n), f)
}

/// [`on_ranks`] over a job of `n` ranks connected by the TCP transport over loopback.
pub fn on_tcp_ranks<R: Send + 'static>(
    n: usize,
    f: impl Fn(usize, Arc<dyn Transport>) -> R + Send + Sync + 'static,
) -> Vec<R> {
    on_group(tcp_group(n).expect("loopback TCP group"), f)
}

/// Runs `f(rank, transport)` on one thread per endpoint of `group`, results in rank order.
pub fn on_group<T: Transport + 'static, R: Send + 'static>(
    group: Vec<T>,
    f: impl Fn(usize, Arc<dyn Transport>) -> R + Send + Sync + 'static,
) -> Vec<R> {
    let f = Arc::new(f);
    let handles: Vec<_> = group
        .into_iter()
        .enumerate()
        .map(|(r, t)| {
            let f = f.clone();
            std::thread::spawn(move || f(r, Arc::new(t)))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank thread panicked"))
        .collect()
}

/// Deterministic per-rank input: small integers (exact sums in any order) or fractional values.
pub fn input(rank: usize, len: usize, seed: u64, integers: bool) -> Vec<f32> {
    (0..len)
        .map(|i| {
            let mut x =
                seed ^ ((rank as u64) << 32) ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            x ^= x >> 29;
            x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x ^= x >> 32;
            if integers {
                (x % 2001) as f32 - 1000.0
            } else {
                ((x % 1_000_000) as f32 / 1_000_000.0 - 0.5) * 3.0
            }
        })
        .collect()
}

/// Every algorithm the transports must run exactly on `p` ranks: each of the registry's with
/// its defaults (but `mpi`, of the MPI transport only: tests/mpi.rs), then other parameters
/// (two tiers where [`Topology`](ddl_comm::Topology) has them, multi-dimensional rings where
/// `p` factors).
pub fn algorithms(p: usize) -> Vec<Algorithm> {
    let mut v: Vec<Algorithm> = Algorithm::names()
        .filter(|&name| name != "mpi")
        .map(|name| name.parse().expect("a registered name parses"))
        .collect();
    v.extend([
        Algorithm::Multicolor(Multicolor {
            colors: 3,
            chunk_bytes: 16,
        }),
        Algorithm::Multiring(Multiring {
            dims: vec![],
            segments: 3,
        }),
        // Chunks of 32 f32: many chunks per call, each slot reused many times.
        Algorithm::Shm(Shm { chunk_bytes: 128 }),
    ]);
    // Two tiers where the test topology has them (otherwise shm alone), in many short chunks.
    v.push(Algorithm::Hierarchical(Hierarchical {
        across: Across::Ring,
        chunk_bytes: 128,
    }));
    // A genuinely multi-dimensional ring where p factors.
    for a in 2..p {
        if p % a == 0 {
            v.push(Algorithm::Multiring(Multiring {
                dims: vec![a, p / a],
                segments: 0,
            }));
            v.push(Algorithm::Multiring(Multiring {
                dims: vec![a, p / a],
                segments: 5,
            }));
            break;
        }
    }
    v
}
