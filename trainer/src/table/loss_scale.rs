//! Dynamic loss scaling for fp16: the loss is multiplied by a scale before backward so that
//! small gradients stay representable in float16, and the gradients are divided by it after the
//! allreduce. A step whose gradients overflow is skipped and halves the scale; a run of
//! [`GROWTH_INTERVAL`] good steps doubles it (the rule of PyTorch's `GradScaler`).

use crate::config::Precision;

/// Initial fp16 loss scale.
const INITIAL_SCALE: f64 = 65536.0;
/// Steps without overflow after which the fp16 loss scale doubles.
const GROWTH_INTERVAL: u64 = 2000;

/// The loss scale of a run and the steps since its last change by overflow or growth.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct LossScaler {
    scale: f64,
    good_steps: u64,
}

impl LossScaler {
    /// The scaler a run in `precision` starts with: 1 (no scaling) unless fp16.
    pub(crate) fn new(precision: Precision) -> LossScaler {
        let scale = if precision == Precision::Fp16 {
            INITIAL_SCALE
        } else {
            1.0
        };
        LossScaler {
            scale,
            good_steps: 0,
        }
    }

    /// A scaler restored from a checkpoint's `(scale, good_steps)`.
    pub(crate) fn restored(scale: f64, good_steps: u64) -> LossScaler {
        LossScaler { scale, good_steps }
    }

    /// The factor the loss is multiplied by.
    pub(crate) fn scale(&self) -> f64 {
        self.scale
    }

    /// `(scale, good steps)`, as a checkpoint stores it.
    pub(crate) fn state(&self) -> (f64, u64) {
        (self.scale, self.good_steps)
    }

    /// Counts a step whose gradients were all `finite`, or halves the scale (never below 1).
    pub(crate) fn update(&mut self, finite: bool) {
        if finite {
            self.good_steps += 1;
            if self.good_steps >= GROWTH_INTERVAL {
                self.scale *= 2.0;
                self.good_steps = 0;
            }
        } else {
            self.scale = (self.scale / 2.0).max(1.0);
            self.good_steps = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflow_halves_and_a_run_of_good_steps_doubles() {
        assert_eq!(LossScaler::new(Precision::Bf16).scale(), 1.0);
        let mut s = LossScaler::new(Precision::Fp16);
        s.update(false);
        assert_eq!(s.state(), (INITIAL_SCALE / 2.0, 0));
        for _ in 0..GROWTH_INTERVAL {
            s.update(true);
        }
        assert_eq!(s.state(), (INITIAL_SCALE, 0));
        let mut low = LossScaler::restored(1.0, 7);
        low.update(false);
        assert_eq!(low.state(), (1.0, 0));
    }
}
