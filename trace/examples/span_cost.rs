//! Cost of a span: `cargo run --release -p ddl-trace --example span_cost [N]` times N empty
//! loop iterations, N reads of the monotonic clock, N spans with recording off, and N spans
//! with recording on, and prints nanoseconds per iteration for each.

use std::hint::black_box;
use std::time::Instant;

fn per_iter(n: u64, f: impl Fn(u64)) -> f64 {
    let start = Instant::now();
    for i in 0..n {
        f(i);
    }
    start.elapsed().as_nanos() as f64 / n as f64
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_000_000);
    let empty = per_iter(n, |i| {
        black_box(i);
    });
    let clock = per_iter(n, |i| {
        black_box(Instant::now());
        black_box(i);
    });
    let off = per_iter(n, |i| {
        let _g = ddl_trace::span("off", "bench");
        black_box(i);
    });
    ddl_trace::enable();
    let on = per_iter(n, |i| {
        let _g = ddl_trace::span_args("on", "bench", &[("i", i as i64)]);
        black_box(i);
    });
    println!(
        "{n} iterations: empty {empty:.2} ns, clock read {clock:.2} ns, span off {off:.2} ns, span on {on:.2} ns ({} events)",
        ddl_trace::event_count()
    );
}
