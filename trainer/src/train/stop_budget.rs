//! Stopping in time under a scheduler ([`KillTiming`]): a stop finishes the stretch of work in
//! flight (a step, or an evaluation and the epoch's checkpoint) and writes a checkpoint, all
//! between the scheduler's SIGTERM and its SIGKILL. The run times those stretches and its
//! checkpoint writes; it warns once, as soon as it knows, when a stop cannot fit in the
//! scheduler's grace, and it stops itself ahead of a time limit whose SIGKILL would come
//! before a stop begun at the limit's SIGTERM could end.

use std::time::{Duration, Instant};

use crate::config::Setting;
use crate::signal::KillTiming;

/// The write speed assumed for a checkpoint until one has been timed (a shared file system's
/// share of one client; a local disk is faster).
const ASSUMED_BYTES_PER_S: f64 = 200e6;
/// The estimates of a stretch and a write are scaled by this before a stop ahead of the time
/// limit, and [`MARGIN`] is added: steps vary, and the limit must not be missed.
const MARGIN_FACTOR: f64 = 1.25;
/// See [`MARGIN_FACTOR`].
const MARGIN: Duration = Duration::from_secs(1);

/// What a stop takes and what the scheduler leaves it.
#[derive(Debug)]
pub(super) struct StopBudget {
    timing: KillTiming,
    /// The last stop check.
    last_check: Option<Instant>,
    /// The longest stretch between two stop checks.
    longest: Duration,
    /// The last checkpoint write, and whether it was timed (else assumed from its bytes).
    write: Duration,
    write_timed: bool,
    warned: bool,
}

impl StopBudget {
    /// The budget of a run under `timing` whose checkpoints hold `checkpoint_bytes`.
    pub(super) fn new(timing: KillTiming, checkpoint_bytes: u64) -> StopBudget {
        StopBudget {
            timing,
            last_check: None,
            longest: Duration::ZERO,
            write: Duration::from_secs_f64(checkpoint_bytes as f64 / ASSUMED_BYTES_PER_S),
            write_timed: false,
            warned: false,
        }
    }

    /// A stop check at `now`: times the stretch since the one before (the first, from the
    /// start of the run, holds its warm-up and is not counted).
    pub(super) fn check(&mut self, now: Instant) {
        if let Some(last) = self.last_check {
            self.longest = self.longest.max(now.saturating_duration_since(last));
        }
        self.last_check = Some(now);
    }

    /// A checkpoint write (with its gather) that took `took`.
    pub(super) fn wrote(&mut self, took: Duration) {
        self.write = took;
        self.write_timed = true;
    }

    /// Whether the run must stop now: one more stretch and a checkpoint write would end
    /// after the time limit's earliest SIGKILL.
    pub(super) fn time_limit_near(&self, now: Instant) -> bool {
        let need = (self.longest + self.write).mul_f64(MARGIN_FACTOR) + MARGIN;
        self.timing.kill_by.is_some_and(|kill| now + need > kill)
    }

    /// Once, when a stop cannot fit in the scheduler's grace: a cancellation or preemption
    /// then loses the steps since the last checkpoint.
    pub(super) fn warning(&mut self) -> Option<String> {
        let (grace, from) = self.timing.grace.as_ref()?;
        let need = self.longest + self.write;
        if self.warned || self.longest.is_zero() || need <= *grace {
            return None;
        }
        self.warned = true;
        Some(format!(
            "a stop does not fit before SIGKILL: {from} leaves {:.0} s after SIGTERM, but \
             finishing a step (or an evaluation) takes up to {:.1} s and a checkpoint write \
             {:.1} s ({}); a cancellation or preemption loses the steps since the last \
             checkpoint ({} N bounds them){}",
            grace.as_secs_f64(),
            self.longest.as_secs_f64(),
            self.write.as_secs_f64(),
            if self.write_timed {
                "timed"
            } else {
                "estimated"
            },
            Setting::CheckpointEvery,
            if self.timing.kill_by.is_some() {
                "; the time limit is met by stopping ahead of it"
            } else {
                ""
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(grace_s: u64, kill_in: Option<Duration>, now: Instant) -> KillTiming {
        KillTiming {
            grace: Some((Duration::from_secs(grace_s), "Slurm's KillWait".into())),
            kill_by: kill_in.map(|d| now + d),
            said: String::new(),
        }
    }

    #[test]
    fn stops_ahead_of_a_time_limit_only_when_a_stop_after_it_would_not_fit() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        // SIGKILL in 100 s; 200 MB: a write assumed to take 1 s.
        let mut b = StopBudget::new(timing(30, Some(s(100)), t0), 200_000_000);
        b.check(t0);
        b.check(t0 + s(2));
        b.check(t0 + s(12)); // a 10 s step
        b.wrote(s(3));
        // 1.25 x (10 + 3) + 1 = 17.25 s are needed.
        assert!(!b.time_limit_near(t0 + s(82)));
        assert!(b.time_limit_near(t0 + s(83)));
        assert!(b.warning().is_none(), "10 s + 3 s fit in 30 s");
    }

    #[test]
    fn warns_once_when_a_step_and_a_write_outlast_the_grace() {
        let t0 = Instant::now();
        let mut b = StopBudget::new(timing(5, None, t0), 200_000_000);
        b.check(t0);
        assert!(b.warning().is_none(), "nothing timed yet");
        b.check(t0 + Duration::from_secs(6));
        let w = b.warning().expect("6 s + 1 s do not fit in 5 s");
        assert!(w.contains("leaves 5 s after SIGTERM"), "{w}");
        assert!(
            w.contains("up to 6.0 s") && w.contains("1.0 s (estimated)"),
            "{w}"
        );
        assert!(b.warning().is_none(), "once");
        assert!(
            !b.time_limit_near(t0 + Duration::from_secs(1_000_000)),
            "no limit"
        );
    }
}
