//! Helpers shared by the in-process tests of ddl-comm.

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
