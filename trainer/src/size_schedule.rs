//! Progressive resizing: the train image size of each epoch, as FFCV's ResNet recipes grow it
//! (160 px early, 192 px late, evaluated at 224).
//!
//! A schedule is a list of `(first epoch, size)` changes, written `EPOCH:SIZE,EPOCH:SIZE`
//! (`0:160,10:192`): from each listed epoch on, training uses its size, until the next one;
//! before the first listed epoch, the run's image size. The size of an epoch depends only on
//! the epoch, so a run resumed at any step of any epoch decodes the same batches.

use std::fmt;
use std::str::FromStr;

use serde::{Serialize, Serializer};

use crate::flag_value::{parse_one, FlagValue};

/// The train image size of each epoch; empty: the run's image size throughout.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SizeSchedule {
    /// `(first epoch, size)`, epochs strictly increasing.
    changes: Vec<(u64, u32)>,
}

/// Why a schedule is refused (the caller names its flag).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// An entry that is not `EPOCH:SIZE`.
    #[error("{0:?} is not EPOCH:SIZE (e.g. 0:160,10:192)")]
    Entry(String),
    /// Epochs not in strictly increasing order.
    #[error("epoch {0} does not follow epoch {1}: list the changes in increasing epoch order")]
    Order(u64, u64),
}

impl SizeSchedule {
    /// The train size of `epoch`: the last change at or before it, else `base`.
    pub fn size_at(&self, epoch: u64, base: u32) -> u32 {
        self.changes
            .iter()
            .take_while(|(first, _)| *first <= epoch)
            .last()
            .map_or(base, |&(_, size)| size)
    }

    /// Every size the schedule names.
    pub fn sizes(&self) -> impl Iterator<Item = u32> + '_ {
        self.changes.iter().map(|&(_, size)| size)
    }

    /// True when the schedule changes nothing.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }
}

impl FromStr for SizeSchedule {
    type Err = ScheduleError;

    fn from_str(s: &str) -> Result<Self, ScheduleError> {
        let mut changes: Vec<(u64, u32)> = Vec::new();
        for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let bad = || ScheduleError::Entry(entry.to_string());
            let (epoch, size) = entry.split_once(':').ok_or_else(bad)?;
            let epoch: u64 = epoch.trim().parse().map_err(|_| bad())?;
            let size: u32 = size.trim().parse().map_err(|_| bad())?;
            if let Some(&(previous, _)) = changes.last() {
                if epoch <= previous {
                    return Err(ScheduleError::Order(epoch, previous));
                }
            }
            changes.push((epoch, size));
        }
        Ok(SizeSchedule { changes })
    }
}

impl fmt::Display for SizeSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let entries: Vec<String> = self
            .changes
            .iter()
            .map(|(epoch, size)| format!("{epoch}:{size}"))
            .collect();
        f.write_str(&entries.join(","))
    }
}

/// As written by the user (`0:160,10:192`), so that a resumed run compares and names it.
impl Serialize for SizeSchedule {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl FlagValue for SizeSchedule {
    fn parse_flag(values: &[&str]) -> Result<Self, String> {
        parse_one(values)
    }

    fn shown(&self) -> Option<String> {
        (!self.is_empty()).then(|| self.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_the_changes() {
        let s: SizeSchedule = "2:160, 5:192".parse().unwrap();
        let sizes: Vec<u32> = (0..7).map(|e| s.size_at(e, 224)).collect();
        assert_eq!(sizes, [224, 224, 160, 160, 160, 192, 192]);
        assert_eq!(s.to_string(), "2:160,5:192");
        assert_eq!(s.to_string().parse::<SizeSchedule>(), Ok(s));
        let empty: SizeSchedule = "".parse().unwrap();
        assert!(empty.is_empty() && empty.size_at(9, 128) == 128);
    }

    #[test]
    fn bad_schedules_say_what_is_wrong() {
        let e = "0:160,x".parse::<SizeSchedule>().unwrap_err();
        assert_eq!(e, ScheduleError::Entry("x".into()));
        let e = "5:160,5:192".parse::<SizeSchedule>().unwrap_err();
        assert_eq!(e, ScheduleError::Order(5, 5));
        assert!("0:-3".parse::<SizeSchedule>().is_err());
    }
}
