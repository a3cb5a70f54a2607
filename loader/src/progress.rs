//! How far an epoch has got, in a form that does not depend on the layout: the set of the
//! split's records it has served. A run stopped mid-epoch keeps it in its checkpoint; a run
//! resumed on another number of nodes, ranks or replicas deals the records not yet served
//! over its own layout ([`crate::placement::Holdings::dealt`]) and serves each exactly once
//! in the rest of the epoch.

use serde::{Deserialize, Serialize};

use crate::error::{LoaderError, Result};

/// The records of one epoch served so far: bit `i % 32` of word `i / 32` is record `i`
/// (its global id, the position in the split).
///
/// # Examples
///
/// ```
/// use ddl_loader::progress::EpochProgress;
///
/// let mut p = EpochProgress::new(3, 10);
/// p.mark_all([0u64, 4, 9])?;
/// assert_eq!(p.served(), 3);
/// assert_eq!(p.unserved(), [1, 2, 3, 5, 6, 7, 8]);
/// # Ok::<(), ddl_loader::LoaderError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochProgress {
    /// The epoch.
    pub epoch: u64,
    /// Records in the split.
    pub records: u64,
    /// Whether the epoch was resumed on another layout (its rest dealt from this set), so
    /// that a later resume continues the same way on any layout.
    #[serde(default)]
    pub resumed: bool,
    words: Vec<u32>,
}

impl EpochProgress {
    /// Nothing served yet of `epoch` of a split of `records` records.
    pub fn new(epoch: u64, records: u64) -> EpochProgress {
        EpochProgress {
            epoch,
            records,
            resumed: false,
            words: vec![0; records.div_ceil(32) as usize],
        }
    }

    /// The progress of `epoch` over `records` records whose served set is `words` (bit
    /// `i % 32` of word `i / 32` is record `i`, as [`EpochProgress::words`] gives them): how a
    /// state that carries it as numbers (the Python loader's `state_dict`) reads it back.
    /// Fails unless `words` is whole ([`EpochProgress::check`]).
    pub fn from_words(epoch: u64, records: u64, words: Vec<u32>) -> Result<EpochProgress> {
        let p = EpochProgress {
            epoch,
            records,
            resumed: false,
            words,
        };
        p.check()?;
        Ok(p)
    }

    /// The served set as words: bit `i % 32` of word `i / 32` is record `i`.
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// Marks every record served: the epoch is over (what an uninterrupted epoch left out
    /// by its last incomplete step stays left out).
    pub fn mark_rest(&mut self) {
        self.words.fill(u32::MAX);
        if self.records % 32 != 0 {
            if let Some(last) = self.words.last_mut() {
                *last = (1 << (self.records % 32)) - 1;
            }
        }
    }

    /// Marks the records `ids` served; fails on an id outside the split.
    pub fn mark_all(&mut self, ids: impl IntoIterator<Item = u64>) -> Result<()> {
        for id in ids {
            if id >= self.records {
                return Err(LoaderError::InvalidConfig(format!(
                    "record {id} served in epoch {}, whose split has {} records",
                    self.epoch, self.records
                )));
            }
            self.words[(id / 32) as usize] |= 1 << (id % 32);
        }
        Ok(())
    }

    /// Adds what `other` served; fails when it is another epoch or split size.
    pub fn merge(&mut self, other: &EpochProgress) -> Result<()> {
        if (other.epoch, other.records) != (self.epoch, self.records) {
            return Err(LoaderError::InvalidConfig(format!(
                "progress of epoch {} over {} records cannot merge with epoch {} over {}",
                other.epoch, other.records, self.epoch, self.records
            )));
        }
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            *a |= b;
        }
        Ok(())
    }

    /// Whether record `id` was served.
    pub fn is_served(&self, id: u64) -> bool {
        id < self.records && self.words[(id / 32) as usize] & (1 << (id % 32)) != 0
    }

    /// Records served.
    pub fn served(&self) -> u64 {
        self.words.iter().map(|w| u64::from(w.count_ones())).sum()
    }

    /// The records not served yet, ascending.
    pub fn unserved(&self) -> Vec<u32> {
        (0..self.records as u32)
            .filter(|&id| !self.is_served(u64::from(id)))
            .collect()
    }

    /// Checks that the progress read from a checkpoint is whole: as many words as the split
    /// needs, no record beyond it (each error says which).
    pub fn check(&self) -> Result<()> {
        let needed = self.records.div_ceil(32);
        if self.words.len() as u64 != needed {
            return Err(LoaderError::InvalidConfig(format!(
                "the progress of epoch {} has {} words for {} records, which take {needed}: it \
                 was cut short or written for another split",
                self.epoch,
                self.words.len(),
                self.records
            )));
        }
        let tail = self.records % 32;
        let spare = match self.words.last() {
            Some(&w) if tail != 0 => w >> tail,
            _ => 0,
        };
        if spare != 0 {
            let past: Vec<u64> = (0..32 - tail)
                .filter(|b| spare & (1 << b) != 0)
                .map(|b| self.records + b)
                .collect();
            return Err(LoaderError::InvalidConfig(format!(
                "the progress of epoch {} marks record(s) {past:?} served, past the last of its \
                 {} records (ids 0 to {}): it was altered",
                self.epoch,
                self.records,
                self.records - 1
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_merge_and_survive_json() {
        let mut a = EpochProgress::new(1, 70);
        a.mark_all([0, 33, 69]).unwrap();
        let mut b = EpochProgress::new(1, 70);
        b.mark_all([1, 33]).unwrap();
        a.merge(&b).unwrap();
        assert_eq!(a.served(), 4);
        assert!(a.is_served(69) && !a.is_served(68) && !a.is_served(70));
        let back: EpochProgress =
            serde_json::from_str(&serde_json::to_string(&a).unwrap()).unwrap();
        assert_eq!(back, a);
        back.check().unwrap();
        assert!(a.mark_all([70]).is_err());
        assert!(a.merge(&EpochProgress::new(2, 70)).is_err());
        let mut bad = a.clone();
        bad.words.push(0);
        assert!(bad.check().is_err());
        let words = EpochProgress::from_words(1, 70, a.words().to_vec()).unwrap();
        assert_eq!(words.unserved(), a.unserved());
        let short = EpochProgress::from_words(1, 70, vec![0; 2]).unwrap_err();
        assert!(
            short
                .to_string()
                .contains("has 2 words for 70 records, which take 3"),
            "{short}"
        );
        // 70 records: bits 6.. of the third word are past the last one.
        let past = EpochProgress::from_words(1, 70, vec![0, 0, 1 << 6 | 1 << 9]).unwrap_err();
        assert!(
            past.to_string()
                .contains("marks record(s) [70, 73] served, past the last of its 70 records"),
            "{past}"
        );
    }

    #[test]
    fn the_rest_marked_leaves_nothing_unserved() {
        for records in [0, 31, 32, 70] {
            let mut p = EpochProgress::new(0, records);
            p.mark_rest();
            assert_eq!((p.served(), p.unserved().len()), (records, 0));
            p.check().unwrap();
        }
    }
}
