//! Helpers shared by the in-process tests of ddl-sim.

use std::sync::Arc;

use ddl_comm::{thread_group, Transport};

/// Runs `f(transport)` on one thread per rank of a fresh in-process group of `n` and returns
/// the results in rank order.
pub fn on_ranks<R: Send>(n: usize, f: impl Fn(Arc<dyn Transport>) -> R + Sync) -> Vec<R> {
    let f = &f;
    std::thread::scope(|s| {
        let ranks: Vec<_> = thread_group(n)
            .into_iter()
            .map(|t| s.spawn(move || f(Arc::new(t))))
            .collect();
        ranks
            .into_iter()
            .map(|r| r.join().expect("rank thread panicked"))
            .collect()
    })
}
