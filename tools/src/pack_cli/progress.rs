//! `ddl-pack`'s progress: an indicatif bar on a terminal, or a plain line every 10 s.

use std::io::IsTerminal;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ddl_loader::pack::PackProgress;

use ddl_cli::stderr_line;

/// Progress as an indicatif bar on a terminal, or a plain line every 10 s otherwise.
pub(crate) struct Progress {
    bar: Option<indicatif::ProgressBar>,
    plain: Mutex<PlainState>,
}

struct PlainState {
    total: u64,
    done: u64,
    kept: u64,
    started: Instant,
    last: Instant,
}

impl Progress {
    pub(crate) fn new() -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = indicatif::ProgressBar::new(0);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{bar:40} {pos}/{len} images  {rate} images/s  ETA {eta}  {msg}",
                )
                .expect("valid template")
                .with_key(
                    "rate",
                    |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                        let _ = write!(w, "{:.0}", state.per_sec());
                    },
                ),
            );
            b
        });
        let now = Instant::now();
        Progress {
            bar,
            plain: Mutex::new(PlainState {
                total: 0,
                done: 0,
                kept: 0,
                started: now,
                last: now,
            }),
        }
    }
}

impl PackProgress for Progress {
    fn start(&self, total: u64, done: u64) {
        if let Some(b) = &self.bar {
            b.set_length(total);
            b.set_position(done);
            b.reset_eta();
            if done > 0 {
                b.set_message(format!("({done} kept from an earlier run)"));
            }
        } else {
            let mut p = self.plain.lock().expect("progress lock");
            p.total = total;
            p.done = done;
            p.kept = done;
            stderr_line(&format!(
                "ddl-pack: {total} inputs, {done} already packed by an earlier run"
            ));
        }
    }

    fn advance(&self, n: u64) {
        if let Some(b) = &self.bar {
            b.inc(n);
            return;
        }
        let mut p = self.plain.lock().expect("progress lock");
        p.done += n;
        let now = Instant::now();
        if now.duration_since(p.last) >= Duration::from_secs(10) {
            p.last = now;
            let secs = now.duration_since(p.started).as_secs_f64();
            let rate = (p.done - p.kept) as f64 / secs.max(1e-9);
            let eta = (p.total - p.done) as f64 / rate.max(1e-9);
            stderr_line(&format!(
                "ddl-pack: {}/{} images, {rate:.0} images/s, ETA {eta:.0} s",
                p.done, p.total
            ));
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            // The summary printed next repeats the totals and the rate.
            b.finish_and_clear();
        }
    }

    fn listing(&self, input: &Path, bytes: u64, what: &str) {
        stderr_line(&format!(
            "ddl-pack: listing {} ({:.1} GiB, {what}: read once to list its images, once more \
             to pack them)",
            input.display(),
            bytes as f64 / (1u64 << 30) as f64
        ));
    }
}
