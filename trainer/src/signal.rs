//! Preemption: SIGTERM (what Slurm and other schedulers send before they kill a job) and
//! SIGINT (Ctrl-C) ask a run to stop; they do not kill it.
//!
//! [`StopRequest::install`] registers both signals (through signal-hook): the first one only
//! sets a flag, a second one exits at once with status 128 + signal. The training loop reads
//! the flag after every step and the ranks agree on it collectively ([`crate::train`](mod@crate::train) folds it
//! into a tiny allreduce), so that every rank stops after the same step even when the signal
//! reached only some of them; rank 0 then writes a checkpoint and every rank says where to
//! resume.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use signal_hook::consts::{SIGINT, SIGTERM};

/// A signal that asks a run to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopSignal {
    /// SIGTERM: a scheduler's (or `kill`'s) request to terminate.
    Term,
    /// SIGINT: Ctrl-C.
    Int,
}

impl StopSignal {
    /// The signal's name.
    pub fn name(self) -> &'static str {
        match self {
            StopSignal::Term => "SIGTERM",
            StopSignal::Int => "SIGINT",
        }
    }

    /// The exit status of a process stopped by this signal (128 + the signal's number, as a
    /// shell reports a process killed by it).
    pub fn exit_code(self) -> i32 {
        128 + match self {
            StopSignal::Term => SIGTERM,
            StopSignal::Int => SIGINT,
        }
    }

    fn from_raw(raw: usize) -> Option<StopSignal> {
        match raw as i32 {
            0 => None,
            SIGINT => Some(StopSignal::Int),
            _ => Some(StopSignal::Term),
        }
    }
}

/// The stop flag of one process: which stop signal arrived first, if any. Clones share it.
#[derive(Clone, Debug, Default)]
pub struct StopRequest {
    /// 0, or the number of the first stop signal.
    signal: Arc<AtomicUsize>,
}

impl StopRequest {
    /// Registers SIGTERM and SIGINT for this process: the first sets the flag, a second exits
    /// at once with status 128 + signal. Call once, early in `main`.
    pub fn install() -> std::io::Result<StopRequest> {
        let request = StopRequest::default();
        let seen = Arc::new(AtomicBool::new(false));
        for sig in [SIGTERM, SIGINT] {
            // Registered first, so it runs before `seen` is set: it exits only on a second signal.
            signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, seen.clone())?;
            signal_hook::flag::register(sig, seen.clone())?;
            let first = request.signal.clone();
            // SAFETY: the action is one compare-and-swap on an atomic, which is
            // async-signal-safe, and cannot panic.
            unsafe {
                signal_hook::low_level::register(sig, move || {
                    let _ =
                        first.compare_exchange(0, sig as usize, Ordering::SeqCst, Ordering::SeqCst);
                })?;
            }
        }
        Ok(request)
    }

    /// Raises the flag as `signal` would (for drivers that learn of a stop otherwise, and tests).
    pub fn request(&self, signal: StopSignal) {
        let raw = match signal {
            StopSignal::Term => SIGTERM,
            StopSignal::Int => SIGINT,
        };
        let _ = self
            .signal
            .compare_exchange(0, raw as usize, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// The first stop signal received, if any.
    pub fn requested(&self) -> Option<StopSignal> {
        StopSignal::from_raw(self.signal.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_request_wins_and_clones_share_it() {
        let a = StopRequest::default();
        let b = a.clone();
        assert_eq!(a.requested(), None);
        b.request(StopSignal::Int);
        a.request(StopSignal::Term);
        assert_eq!(a.requested(), Some(StopSignal::Int));
        assert_eq!(StopSignal::Int.exit_code(), 130);
        assert_eq!(StopSignal::Term.exit_code(), 143);
    }
}
