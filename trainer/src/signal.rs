//! Preemption: SIGTERM (what Slurm and other schedulers send before they kill a job) and
//! SIGINT (Ctrl-C) ask a run to stop; they do not kill it.
//!
//! [`StopRequest::install`] registers both signals (through signal-hook): the first one only
//! sets a flag. More SIGTERMs belong to the same stop: schedulers and launchers send several
//! (Slurm, at a job's time limit, SIGTERM, SIGCONT and SIGTERM within milliseconds; at a
//! preemption with a grace time, another SIGTERM when it ends; `mpirun` forwards the SIGTERM
//! that Slurm also sends each rank) and end a stop that takes too long with SIGKILL. A second
//! SIGINT more than [`REPEAT_WINDOW`] after the first signal (a person pressing Ctrl-C again)
//! exits at once with status 128 + signal and a line, unless a checkpoint is being written
//! ([`hold_for_checkpoint`]): then the write finishes first, so that the checkpoint a first
//! signal asked for is never lost to the second. The training loop reads the flag after every
//! step and the ranks agree on it collectively ([`crate::train`](mod@crate::train) folds it
//! into a tiny allreduce), so that every rank stops after the same step even when the signal
//! reached only some of them; rank 0 then writes a checkpoint and every rank says where to
//! resume.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::console::eprint_line;

use signal_hook::consts::{SIGINT, SIGTERM};

/// What stops a run before its end: a signal, or the job's time limit ahead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopSignal {
    /// SIGTERM: a scheduler's (or `kill`'s) request to terminate.
    Term,
    /// SIGINT: Ctrl-C.
    Int,
    /// No signal: the run stops itself ahead of its job's time limit, because the limit's
    /// SIGKILL would come before a stop begun at its SIGTERM could write the checkpoint
    /// ([`KillTiming`]).
    TimeLimit,
}

/// [`StopSignal::TimeLimit`] in the flag (the signals are stored as their numbers).
const TIME_LIMIT_RAW: usize = 0x100;

impl StopSignal {
    /// The signal's name.
    pub fn name(self) -> &'static str {
        match self {
            StopSignal::Term => "SIGTERM",
            StopSignal::Int => "SIGINT",
            StopSignal::TimeLimit => "the job's time limit",
        }
    }

    /// How the run stopped, after "stopped": `by SIGTERM`.
    pub fn cause(self) -> String {
        match self {
            StopSignal::TimeLimit => "ahead of the job's time limit".to_string(),
            signal => format!("by {}", signal.name()),
        }
    }

    /// The exit status of a process stopped by this signal (128 + the signal's number, as a
    /// shell reports a process killed by it; the time limit's SIGTERM for a stop ahead of it).
    pub fn exit_code(self) -> i32 {
        128 + match self {
            StopSignal::Term | StopSignal::TimeLimit => SIGTERM,
            StopSignal::Int => SIGINT,
        }
    }

    fn raw(self) -> usize {
        match self {
            StopSignal::Term => SIGTERM as usize,
            StopSignal::Int => SIGINT as usize,
            StopSignal::TimeLimit => TIME_LIMIT_RAW,
        }
    }

    fn from_raw(raw: usize) -> Option<StopSignal> {
        match raw {
            0 => None,
            TIME_LIMIT_RAW => Some(StopSignal::TimeLimit),
            r if r == SIGINT as usize => Some(StopSignal::Int),
            _ => Some(StopSignal::Term),
        }
    }
}

/// How long the job's scheduler leaves a stop: from its SIGTERM to its SIGKILL, and when the
/// job's time limit brings SIGKILL at the earliest. [`crate::slurm`] reads them under Slurm.
#[derive(Clone, Debug, Default)]
pub struct KillTiming {
    /// SIGTERM to SIGKILL, and what sets it, for messages (`Slurm's KillWait`).
    pub grace: Option<(Duration, String)>,
    /// The earliest SIGKILL of the job's time limit.
    pub kill_by: Option<Instant>,
    /// What the run's start-up line says about it.
    pub said: String,
}

/// A SIGINT this soon after the first stop signal is part of the same stop (one Ctrl-C can
/// reach a process twice, from the terminal and from its launcher); a person who wants out at
/// once presses Ctrl-C again after it (srun's own double Ctrl-C is a second apart).
pub const REPEAT_WINDOW: Duration = Duration::from_secs(1);

/// When the first stop signal came (CLOCK_MONOTONIC nanoseconds; 0: none yet).
static FIRST_AT: AtomicU64 = AtomicU64::new(0);

/// CLOCK_MONOTONIC in nanoseconds, at least 1; async-signal-safe (clock_gettime).
fn monotonic_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) is async-signal-safe and writes only `t`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    (t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64).max(1)
}

/// What stop signal `sig` arriving at `now_ns` does, the first one having come at `first_ns`
/// (0: this is the first).
#[derive(Debug, PartialEq, Eq)]
enum Arrival {
    /// The first: raise the flag.
    First,
    /// Part of the same stop: any SIGTERM, a SIGINT within [`REPEAT_WINDOW`].
    Repeat,
    /// A person's second Ctrl-C: a request to leave now.
    Second,
}

fn arrival(sig: i32, first_ns: u64, now_ns: u64) -> Arrival {
    if first_ns == 0 {
        Arrival::First
    } else if sig == SIGTERM || now_ns.saturating_sub(first_ns) < REPEAT_WINDOW.as_nanos() as u64 {
        Arrival::Repeat
    } else {
        Arrival::Second
    }
}

/// Whether a checkpoint is being written (a second Ctrl-C then waits for it).
static WRITING: AtomicBool = AtomicBool::new(false);
/// A second Ctrl-C that came during a checkpoint write (0: none).
static DEFERRED: AtomicUsize = AtomicUsize::new(0);

/// What a second Ctrl-C does outside a checkpoint write: one line on stderr, then the exit.
/// Only async-signal-safe calls (write, _exit).
fn exit_now(sig: i32) {
    const LINE: &[u8] = b"ddl-train: a second Ctrl-C (SIGINT): exiting now; the last checkpoint \
written (if any) is where --resume continues\n";
    // SAFETY: write(2) and _exit(2) are async-signal-safe; LINE is a static buffer.
    unsafe {
        libc::write(2, LINE.as_ptr().cast(), LINE.len());
        libc::_exit(128 + sig);
    }
}

/// Held while a checkpoint is written ([`hold_for_checkpoint`]): a second Ctrl-C that
/// comes meanwhile waits for the write; [`CheckpointHold::release`] then says how the write
/// ended and exits with that signal's status.
#[must_use = "release the hold once the checkpoint is written"]
pub struct CheckpointHold(());

/// Makes a second Ctrl-C wait until the returned hold is released.
pub fn hold_for_checkpoint() -> CheckpointHold {
    WRITING.store(true, Ordering::SeqCst);
    CheckpointHold(())
}

impl CheckpointHold {
    /// Ends the hold after the write, whose outcome is `written` (the checkpoint's path, or
    /// its error): when a second Ctrl-C came meanwhile, says so with that outcome and
    /// exits with the signal's status.
    pub fn release(self, written: std::result::Result<&std::path::Path, String>) {
        drop(self);
        let sig = DEFERRED.swap(0, Ordering::SeqCst);
        if let Some(signal) = StopSignal::from_raw(sig) {
            let outcome = match written {
                Ok(path) => format!("{} is complete", path.display()),
                Err(e) => format!("it failed ({e})"),
            };
            eprint_line(&format!(
                "ddl-train: a second {} came during the checkpoint write, which was let finish: \
                 {outcome}; exiting",
                signal.name()
            ));
            std::process::exit(signal.exit_code());
        }
    }
}

impl Drop for CheckpointHold {
    fn drop(&mut self) {
        WRITING.store(false, Ordering::SeqCst);
    }
}

/// The stop flag of one process: which stop signal arrived first, if any. Clones share it.
#[derive(Clone, Debug, Default)]
pub struct StopRequest {
    /// 0, or the number of the first stop signal.
    signal: Arc<AtomicUsize>,
}

impl StopRequest {
    /// Registers SIGTERM and SIGINT for this process: the first sets the flag, later SIGTERMs
    /// are part of the same stop, and a SIGINT more than [`REPEAT_WINDOW`] after the first
    /// exits at once with status 130 (after the checkpoint write in progress, if any). Call
    /// once, early in `main`.
    pub fn install() -> std::io::Result<StopRequest> {
        let request = StopRequest::default();
        for sig in [SIGTERM, SIGINT] {
            let first = request.signal.clone();
            // SAFETY: the action uses atomics, clock_gettime(2), write(2) and _exit(2), which
            // are async-signal-safe, and cannot panic.
            unsafe {
                signal_hook::low_level::register(sig, move || {
                    let now = monotonic_ns();
                    let first_at =
                        match FIRST_AT.compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst)
                        {
                            Ok(_) => 0,
                            Err(at) => at,
                        };
                    match arrival(sig, first_at, now) {
                        Arrival::First => {
                            let _ = first.compare_exchange(
                                0,
                                sig as usize,
                                Ordering::SeqCst,
                                Ordering::SeqCst,
                            );
                        }
                        Arrival::Repeat => {}
                        Arrival::Second if WRITING.load(Ordering::SeqCst) => {
                            DEFERRED.store(sig as usize, Ordering::SeqCst);
                        }
                        Arrival::Second => exit_now(sig),
                    }
                })?;
            }
        }
        Ok(request)
    }

    /// Raises the flag as `signal` would (for drivers that learn of a stop otherwise, and tests).
    pub fn request(&self, signal: StopSignal) {
        let _ = self
            .signal
            .compare_exchange(0, signal.raw(), Ordering::SeqCst, Ordering::SeqCst);
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
        let c = StopRequest::default();
        c.request(StopSignal::TimeLimit);
        assert_eq!(c.requested(), Some(StopSignal::TimeLimit));
        assert_eq!(StopSignal::TimeLimit.exit_code(), 143);
    }

    #[test]
    fn more_sigterms_are_one_stop_and_a_later_ctrl_c_leaves() {
        let window = REPEAT_WINDOW.as_nanos() as u64;
        let first = 5_000_000_000;
        assert_eq!(arrival(SIGTERM, 0, first), Arrival::First);
        // Slurm's SIGTERM, SIGCONT, SIGTERM (milliseconds apart), mpirun's forwarded SIGTERM
        // (seconds later), the SIGTERM that ends a preemption's grace time (minutes later).
        for later in [3_000_000, window, 100 * window] {
            assert_eq!(arrival(SIGTERM, first, first + later), Arrival::Repeat);
        }
        assert_eq!(arrival(SIGINT, first, first + window - 1), Arrival::Repeat);
        assert_eq!(arrival(SIGINT, first, first + window), Arrival::Second);
    }
}
