//! Learning-rate schedule: linear scaling of the base rate with the global batch, per-step
//! linear warmup (Goyal et al. 2017), then step decay or cosine decay.

use crate::flag_value::{flag_value_named, Named};

/// What happens after warmup.
#[derive(Clone, Debug, PartialEq)]
pub enum Decay {
    /// Multiply by `gamma` at each milestone epoch (torchvision: 30, 60, 80 with 0.1).
    Step {
        /// Epochs at which the rate drops, ascending.
        milestones: Vec<u32>,
        /// Factor applied at each milestone.
        gamma: f64,
    },
    /// Half-cosine from the peak down to 0 at the end of training.
    Cosine,
}

/// Kind of decay as named on the command line (`schedule` step|cosine).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DecayKind {
    /// Step decay at `milestones`.
    Step,
    /// Cosine decay.
    Cosine,
}

impl Named for DecayKind {
    const ALL: &'static [Self] = &[DecayKind::Step, DecayKind::Cosine];

    fn name(self) -> &'static str {
        match self {
            DecayKind::Step => "step",
            DecayKind::Cosine => "cosine",
        }
    }

    fn help(self) -> &'static str {
        match self {
            DecayKind::Step => "times `gamma` at each of `milestones`",
            DecayKind::Cosine => "cosine to 0 at the last epoch",
        }
    }
}

flag_value_named!(DecayKind);

/// The learning rate as a pure function of the global step, so that a resumed run uses
/// exactly the rates of an uninterrupted one.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    /// Peak rate: base lr x global batch / 256.
    pub peak: f64,
    /// Optimizer steps per epoch (equal on every rank).
    pub steps_per_epoch: u64,
    /// Warmup length in steps (0 = none).
    pub warmup_steps: u64,
    /// Total steps of the run (for cosine).
    pub total_steps: u64,
    /// Decay after warmup.
    pub decay: Decay,
}

impl Schedule {
    /// Builds the schedule. `warmup_epochs` may be fractional.
    pub fn new(
        base_lr: f64,
        global_batch: usize,
        steps_per_epoch: u64,
        epochs: u32,
        warmup_epochs: f64,
        decay: Decay,
    ) -> Schedule {
        let peak = base_lr * global_batch as f64 / 256.0;
        let warmup_steps = (warmup_epochs * steps_per_epoch as f64).round().max(0.0) as u64;
        Schedule {
            peak,
            steps_per_epoch,
            warmup_steps,
            total_steps: steps_per_epoch * u64::from(epochs),
            decay,
        }
    }

    /// The rate used by optimizer step `step` (0-based, counted over the whole run).
    pub fn lr(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            // Linear from peak/warmup_steps (close to 0) to the peak at the last warmup step.
            return self.peak * (step + 1) as f64 / self.warmup_steps as f64;
        }
        match &self.decay {
            Decay::Step { milestones, gamma } => {
                let epoch = step / self.steps_per_epoch.max(1);
                let passed = milestones
                    .iter()
                    .filter(|&&m| u64::from(m) <= epoch)
                    .count();
                self.peak * gamma.powi(passed as i32)
            }
            Decay::Cosine => {
                let span = self.total_steps.saturating_sub(self.warmup_steps).max(1);
                let t = (step - self.warmup_steps) as f64 / span as f64;
                self.peak * 0.5 * (1.0 + (std::f64::consts::PI * t.min(1.0)).cos())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_scaling_and_warmup() {
        let s = Schedule::new(
            0.1,
            1024,
            100,
            90,
            5.0,
            Decay::Step {
                milestones: vec![30, 60, 80],
                gamma: 0.1,
            },
        );
        assert!((s.peak - 0.4).abs() < 1e-12);
        assert_eq!(s.warmup_steps, 500);
        assert!((s.lr(0) - 0.4 / 500.0).abs() < 1e-12);
        assert!((s.lr(499) - 0.4).abs() < 1e-12);
        assert!((s.lr(500) - 0.4).abs() < 1e-12);
        assert!((s.lr(2999) - 0.4).abs() < 1e-12);
        assert!((s.lr(3000) - 0.04).abs() < 1e-12);
        assert!((s.lr(6000) - 0.004).abs() < 1e-12);
        assert!((s.lr(8000) - 0.0004).abs() < 1e-12);
        // Monotone during warmup.
        for k in 1..500 {
            assert!(s.lr(k) > s.lr(k - 1));
        }
    }

    #[test]
    fn cosine_reaches_zero() {
        let s = Schedule::new(0.1, 256, 10, 10, 1.0, Decay::Cosine);
        assert!((s.lr(10) - 0.1).abs() < 1e-12);
        assert!((s.lr(55) - 0.05).abs() < 1e-12);
        assert!(s.lr(99) < 1e-3);
        assert!(s.lr(99) > 0.0);
    }

    #[test]
    fn no_warmup() {
        let s = Schedule::new(0.2, 256, 10, 2, 0.0, Decay::Cosine);
        assert!((s.lr(0) - 0.2).abs() < 1e-12);
    }
}
