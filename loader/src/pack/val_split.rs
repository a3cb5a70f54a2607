//! What a held-out validation split is asked for ([`ValSplit`]); `split.rs` carves it.

use serde::{Deserialize, Serialize};

use super::option_error::{OptionError, PackOption};

/// Which inputs of a class go to the validation split.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ValRule {
    /// Inputs whose key, as a fraction of 2^64, is below this (0 < F < 1).
    Fraction(f64),
    /// The N inputs of each class with the smallest keys (at most all but one).
    PerClass(u64),
}

/// A validation split carved from the training inputs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ValSplit {
    /// Which inputs.
    pub rule: ValRule,
    /// Seed of the key; another seed holds out other inputs.
    pub seed: u64,
}

impl ValSplit {
    /// The option that asked for this split.
    pub fn option(&self) -> PackOption {
        PackOption::of_val_rule(&self.rule)
    }

    /// The rule's value as given (the fraction or the count).
    pub fn value(&self) -> String {
        match self.rule {
            ValRule::Fraction(f) => f.to_string(),
            ValRule::PerClass(n) => n.to_string(),
        }
    }

    /// Checks the value: a fraction strictly between 0 and 1, a per-class count of at least 1.
    pub fn validate(&self) -> std::result::Result<(), OptionError> {
        let problem = match self.rule {
            ValRule::Fraction(f) if !(f > 0.0 && f < 1.0) => "must be strictly between 0 and 1",
            ValRule::PerClass(0) => "must be at least 1",
            _ => return Ok(()),
        };
        Err(OptionError::new(self.option(), self.value(), problem))
    }
}

impl PackOption {
    /// The option that asks for `rule`.
    pub fn of_val_rule(rule: &ValRule) -> PackOption {
        match rule {
            ValRule::Fraction(_) => PackOption::ValFraction,
            ValRule::PerClass(_) => PackOption::ValPerClass,
        }
    }
}
