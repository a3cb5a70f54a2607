//! How a buffer is shared out among the ranks of a group: the parts an allgather assembles and
//! a reduce-scatter leaves, one per rank, contiguous and in rank order, of any lengths (a
//! class count that does not divide by the ranks, a rank with nothing to give).

use std::ops::Range;

use crate::error::{CommError, Result};

/// Rank `q` owns elements `range(q)` of a buffer of `len()` elements; parts follow each other
/// in rank order and may be empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parts {
    /// `offsets[q]..offsets[q + 1]` is part `q`; `offsets[0] == 0`.
    offsets: Vec<usize>,
}

impl Parts {
    /// `len` elements over `ranks` ranks as evenly as possible: the first `len % ranks` parts
    /// are one longer.
    pub fn even(len: usize, ranks: usize) -> Parts {
        let ranks = ranks.max(1);
        let (base, extra) = (len / ranks, len % ranks);
        Parts::from_counts(
            &(0..ranks)
                .map(|q| base + usize::from(q < extra))
                .collect::<Vec<_>>(),
        )
    }

    /// Parts of `counts[q]` elements each.
    pub fn from_counts(counts: &[usize]) -> Parts {
        let mut offsets = Vec::with_capacity(counts.len() + 1);
        offsets.push(0);
        for c in counts {
            offsets.push(offsets[offsets.len() - 1] + c);
        }
        Parts { offsets }
    }

    /// Every part `times` longer (rows of `times` elements each, say).
    pub fn scaled(&self, times: usize) -> Parts {
        Parts {
            offsets: self.offsets.iter().map(|o| o * times).collect(),
        }
    }

    /// Number of parts (ranks).
    pub fn ranks(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Elements of all parts together.
    pub fn len(&self) -> usize {
        self.offsets[self.offsets.len() - 1]
    }

    /// Whether there are no elements at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements of part `q`.
    pub fn range(&self, q: usize) -> Range<usize> {
        self.offsets[q]..self.offsets[q + 1]
    }

    /// The length of part `q`.
    pub fn count(&self, q: usize) -> usize {
        self.offsets[q + 1] - self.offsets[q]
    }

    /// Checks that these parts cut a buffer of `len` elements among `ranks` ranks.
    pub(crate) fn check(&self, op: &str, len: usize, ranks: usize) -> Result<()> {
        if self.ranks() != ranks || self.len() != len {
            return Err(CommError::InvalidArgument(format!(
                "{op}: parts of {} elements over {} ranks for a buffer of {len} elements over \
                 {ranks} ranks",
                self.len(),
                self.ranks()
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_parts_put_the_remainder_first() {
        let p = Parts::even(10, 4);
        assert_eq!(
            (0..4).map(|q| p.range(q)).collect::<Vec<_>>(),
            vec![0..3, 3..6, 6..8, 8..10]
        );
        assert_eq!(Parts::even(2, 3).count(2), 0);
        let rows = Parts::from_counts(&[2, 0, 1]).scaled(5);
        assert_eq!((rows.len(), rows.range(2)), (15, 10..15));
        assert!(rows.check("x", 15, 3).is_ok());
        assert!(rows.check("x", 14, 3).is_err());
    }
}
