//! The exchange's re-deals. Every node's places (its records in epoch 0, ascending: place
//! `p` holds the `p`-th) are split into `K` cohorts, place `p` of a node of `t` records in
//! cohort `floor(p K / t)`, so every cohort has `floor` or `ceil` of `t / K` places on every
//! node. A cohort's records are those its places hold in epoch 0, and they only ever move
//! among its places. The re-deals are numbered `u = 0, 1, 2, ...`: re-deal `u` deals the
//! records of cohort `u % K` over its places in an order drawn from `(seed, u)` alone, and the
//! boundary into epoch `e` makes the re-deals `U(e - 1)` to `U(e) - 1`, `U(e) = floor(e Q K)`:
//! about `Q` of every node's places each epoch, every cohort once in `1 / Q` epochs. Since a
//! re-deal does not depend on where the cohort was, epoch `e`'s holdings follow from each
//! cohort's last re-deal before `U(e)`: linear in the records at any epoch.

use crate::sampler::{mix64, Xoshiro256};

/// Most cohorts: `Q` is kept to within `1 / K` at every boundary (exactly over the epochs).
const MOST: usize = 1024;

/// The cohorts of a split whose nodes hold `counts` records: `K` and where their places are.
#[derive(Clone, Debug)]
pub(super) struct Cohorts {
    k: usize,
    counts: Vec<usize>,
}

impl Cohorts {
    /// As many cohorts as the smallest node holds records (so that every cohort has a place
    /// on every node), at most [`MOST`], at least one.
    pub(super) fn new(counts: &[usize]) -> Cohorts {
        let smallest = counts.iter().copied().min().unwrap_or(0);
        Cohorts {
            k: smallest.clamp(1, MOST),
            counts: counts.to_vec(),
        }
    }

    /// `K`.
    pub(super) fn count(&self) -> usize {
        self.k
    }

    /// Node `node`'s places of cohort `c`.
    pub(super) fn places(&self, c: usize, node: usize) -> std::ops::Range<usize> {
        let t = self.counts[node];
        (c * t).div_ceil(self.k)..((c + 1) * t).div_ceil(self.k)
    }

    /// `U(epoch)`: the re-deals made before `epoch` is served at `fraction`.
    pub(super) fn made_before(&self, epoch: u64, fraction: f64) -> u64 {
        (epoch as f64 * fraction * self.k as f64).floor() as u64
    }

    /// The last of the first `made` re-deals that dealt cohort `c`, if one did.
    pub(super) fn last(&self, c: usize, made: u64) -> Option<u64> {
        let (c, k) = (c as u64, self.k as u64);
        (made > c).then(|| c + k * ((made - 1 - c) / k))
    }

    /// Cohort `c`'s records in place order (node by node) given every node's records in epoch
    /// 0, and the node of each place.
    pub(super) fn members(&self, c: usize, base: &[Vec<u32>]) -> (Vec<u32>, Vec<u32>) {
        let (mut records, mut nodes) = (Vec::new(), Vec::new());
        for (n, held) in base.iter().enumerate() {
            let places = self.places(c, n);
            nodes.extend(std::iter::repeat_n(n as u32, places.len()));
            records.extend_from_slice(&held[places]);
        }
        (records, nodes)
    }
}

/// Re-deal `u`'s order of a cohort of `len` records: its place `i` holds record `order[i]`
/// of the cohort, a permutation drawn from `(seed, u)` alone.
pub(super) fn order(seed: u64, u: u64, len: usize) -> Vec<u32> {
    let mut order: Vec<u32> = (0..len as u32).collect();
    let mut rng = Xoshiro256::from_seed(mix64(seed ^ mix64(u ^ 0x4345_4452_4544_4541)));
    for i in (1..order.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cohort_has_an_even_share_of_every_node() {
        let c = Cohorts::new(&[10, 11, 25]);
        assert_eq!(c.count(), 10);
        for n in 0..3 {
            let mut all = Vec::new();
            for k in 0..10 {
                let p = c.places(k, n);
                assert!(p.len() == [10, 11, 25][n] / 10 || p.len() == [10, 11, 25][n] / 10 + 1);
                all.extend(p);
            }
            assert_eq!(all, (0..[10, 11, 25][n]).collect::<Vec<_>>());
        }
        assert_eq!(Cohorts::new(&[5000, 5000]).count(), MOST);
        assert_eq!(Cohorts::new(&[0, 3]).count(), 1);
    }

    #[test]
    fn the_window_deals_each_cohort_once_in_one_over_q_epochs() {
        let c = Cohorts::new(&[8, 8]);
        assert_eq!((c.made_before(0, 0.25), c.made_before(1, 0.25)), (0, 2));
        assert_eq!(c.made_before(4, 0.25), 8);
        assert_eq!(c.last(3, 2), None);
        assert_eq!(c.last(1, 2), Some(1));
        assert_eq!(c.last(1, 9), Some(1));
        assert_eq!(c.last(0, 9), Some(8));
        assert_eq!(c.last(0, 0), None);
        let mut o = order(3, 5, 100);
        assert_ne!(o, order(3, 6, 100));
        o.sort_unstable();
        assert_eq!(o, (0..100).collect::<Vec<u32>>());
    }
}
