//! Helpers shared by the in-process tests of ddl-comm.

pub mod exact;

use std::sync::Arc;

use ddl_comm::{thread_group, Transport};

/// Runs `f(rank, transport)` on one thread per rank of a fresh in-process group of `n` and
/// returns the results in rank order.
pub fn on_ranks<R: Send + 'static>(
    n: usize,
    f: impl Fn(usize, Arc<dyn Transport>) -> R + Send + Sync + 'static,
) -> Vec<R> {
    let f = Arc::new(f);
    let handles: Vec<_> = thread_group(n)
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
