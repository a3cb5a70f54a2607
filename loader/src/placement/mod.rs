//! Which node holds which record of a split in each epoch: every record once, every node as
//! many as the others (to one record), and with a record exchange a fraction `Q` of every
//! node's records dealt anew at every epoch boundary ("partial local shuffling", Nguyen et
//! al., IPDPS 2022).
//!
//! A node's *home* records are those of its shards, `s % nodes == node`
//! ([`crate::dataset`]). Shards that do not divide evenly over the nodes leave the nodes with
//! different counts, and a synchronous job takes the same steps on every node: so in every
//! epoch a node holds `floor(N / P)` or `ceil(N / P)` of the `N` records, its home records
//! but for the surplus of the nodes above that count, which the nodes below it hold instead
//! ([`balance`]; nothing moves when the shards divide evenly). Only the last incomplete global
//! step's records then sit out of an epoch.
//!
//! With an exchange (`Q > 0`) the records of epoch 0 are dealt anew: about `Q` of every node's
//! records at each boundary, in cohorts that each re-deal independently of where they were
//! ([`cohorts`]), so that epoch `e`'s holdings take time linear in the records at any `e`
//! (a run resumed late, `ddl-plan`). About `Q (P - 1) / P` of a node's records change between
//! epochs on `P` nodes (a re-dealt record may stay), every record is dealt anew once in `1 / Q`
//! epochs, and a node's count never changes: its steps are those of epoch 0. `Q = 1` deals
//! every record anew every epoch.
//!
//! Everything is a pure function of the seed, `Q`, the node count and the split's shard sizes:
//! every rank computes every node's holdings itself, with no message, and a run resumed at
//! epoch `e` finds the same holdings an uninterrupted run had.

mod balance;
mod cohorts;

use crate::error::{LoaderError, Result};
use crate::sampler::{mix64, Xoshiro256};
use cohorts::Cohorts;

/// The version of the rule that places records (the nodes evened out, the exchange by
/// cohorts): a checkpoint written mid-epoch records it, so that a resume knows whether it can
/// recompute what the epoch served. Rule 1 (before it) left the bigger nodes' surplus out and
/// exchanged by pooling.
pub const RULE: u32 = 2;

/// The record placement of one split over a number of nodes; see the module documentation.
///
/// # Examples
///
/// Two nodes, three shards (8, 8 and 4 records): node 0's shards hold 12 records, node 1's 8,
/// so two of node 0's records are node 1's in every epoch. A global shuffle (`Q = 1`) keeps
/// the counts while dealing the records anew.
///
/// ```
/// use ddl_loader::placement::Placement;
///
/// let placement = Placement::new(&[8, 8, 4], 2, 1.0, 7)?;
/// assert_eq!(placement.counts(), [10, 10]);
/// assert_eq!(placement.evened(), 2);
/// let first = placement.holdings(0);
/// assert_eq!(first.node(1), [8, 9, 10, 11, 12, 13, 14, 15, 18, 19]);
/// let next = placement.holdings(1);
/// assert_eq!(next.node(0).len(), 10);
/// let mut all: Vec<u32> = next.node(0).iter().chain(next.node(1)).copied().collect();
/// all.sort_unstable();
/// assert_eq!(all, (0..20).collect::<Vec<u32>>());
/// # Ok::<(), ddl_loader::LoaderError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Placement {
    seed: u64,
    fraction: f64,
    nodes: usize,
    /// Global id of each shard's first record; one extra entry, the split's record count.
    shard_starts: Vec<u64>,
    /// Records each node holds in every epoch.
    counts: Vec<usize>,
    cohorts: Cohorts,
}

/// Every node's records in one epoch: global ids (positions in the split), ascending.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holdings {
    epoch: u64,
    nodes: Vec<Vec<u32>>,
}

impl Placement {
    /// The placement of a split whose shards hold `shard_records` records (in split order) over
    /// `nodes` nodes, exchanging `fraction` of every node's records at each epoch boundary.
    ///
    /// Fails when `fraction` is outside `[0, 1]`, there are no nodes, more nodes than shards,
    /// or `2^32` records or more.
    pub fn new(shard_records: &[u64], nodes: usize, fraction: f64, seed: u64) -> Result<Placement> {
        let invalid = |why: String| Err(LoaderError::InvalidConfig(format!("exchange: {why}")));
        if !(0.0..=1.0).contains(&fraction) {
            return invalid(format!(
                "fraction {fraction} is outside [0, 1] (0: node-local order, 1: a global shuffle)"
            ));
        }
        if nodes == 0 || nodes > shard_records.len() {
            return invalid(format!(
                "{nodes} nodes for {} shards (use between 1 and as many nodes as shards)",
                shard_records.len()
            ));
        }
        let mut shard_starts = vec![0u64];
        for &n in shard_records {
            shard_starts.push(shard_starts[shard_starts.len() - 1] + n);
        }
        let records = shard_starts[shard_records.len()];
        if records > u64::from(u32::MAX) {
            return invalid(format!("{records} records (limit 2^32 - 1)"));
        }
        let mut home = vec![0usize; nodes];
        for (s, &n) in shard_records.iter().enumerate() {
            home[s % nodes] += n as usize;
        }
        let counts = balance::counts(&home);
        Ok(Placement {
            seed,
            fraction,
            nodes,
            shard_starts,
            cohorts: Cohorts::new(&counts),
            counts,
        })
    }

    /// Number of nodes.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// Fraction of every node's records exchanged at each epoch boundary.
    pub fn fraction(&self) -> f64 {
        self.fraction
    }

    /// Whether records are dealt anew at epoch boundaries (`Q > 0` on several nodes).
    pub fn exchanges(&self) -> bool {
        self.fraction > 0.0 && self.nodes > 1
    }

    /// Records in the split.
    pub fn records(&self) -> usize {
        self.shard_starts[self.shard_starts.len() - 1] as usize
    }

    /// Records each node holds, the same in every epoch: `floor` or `ceil` of records / nodes.
    pub fn counts(&self) -> &[usize] {
        &self.counts
    }

    /// Records a node other than their home node holds in epoch 0, to even the counts out.
    pub fn evened(&self) -> usize {
        let mut home = vec![0usize; self.nodes];
        for (s, w) in self.shard_starts.windows(2).enumerate() {
            home[s % self.nodes] += (w[1] - w[0]) as usize;
        }
        home.iter()
            .zip(&self.counts)
            .map(|(&h, &c)| h.saturating_sub(c))
            .sum()
    }

    /// The node whose shards hold record `id` (`shard % nodes`).
    ///
    /// # Panics
    ///
    /// When `id` is not below [`Placement::records`] (a caller bug).
    pub fn home(&self, id: u32) -> usize {
        assert!((id as usize) < self.records(), "record {id} out of range");
        let shard = self.shard_starts.partition_point(|&s| s <= u64::from(id)) - 1;
        shard % self.nodes
    }

    /// Every node's home records, those of its shards (before any record moves).
    pub fn home_holdings(&self) -> Holdings {
        Holdings {
            epoch: 0,
            nodes: self.home_lists(),
        }
    }

    /// The holdings of `epoch`, in time linear in the records whatever the epoch.
    pub fn holdings(&self, epoch: u64) -> Holdings {
        let base = self.base();
        let made = self.made_before(epoch);
        if made == 0 {
            return Holdings { epoch, nodes: base };
        }
        let mut node_of = vec![0u32; self.records()];
        for (n, held) in base.iter().enumerate() {
            for &id in held {
                node_of[id as usize] = n as u32;
            }
        }
        for c in 0..self.cohorts.count() {
            let Some(u) = self.cohorts.last(c, made) else {
                continue;
            };
            let (members, places) = self.cohorts.members(c, &base);
            for (place, i) in cohorts::order(self.seed, u, members.len())
                .into_iter()
                .enumerate()
            {
                node_of[members[i as usize] as usize] = places[place];
            }
        }
        let mut nodes: Vec<Vec<u32>> = self.counts.iter().map(|&c| Vec::with_capacity(c)).collect();
        for (id, &n) in node_of.iter().enumerate() {
            nodes[n as usize].push(id as u32);
        }
        Holdings { epoch, nodes }
    }

    /// Whether some node holds other records in `epoch` than in the epoch before (in epoch 0:
    /// than its home records).
    pub fn changes_into(&self, epoch: u64) -> bool {
        match epoch {
            0 => self.evened() > 0,
            e => self.made_before(e) > self.made_before(e - 1),
        }
    }

    /// Most records of other nodes' shards that `node` holds in an epoch before `epochs`, at
    /// most (a bound for the memory they take): those epoch 0 gives it to even the nodes out,
    /// and every place of the cohorts dealt anew in the run; for a run of unknown length,
    /// `epochs` [`u64::MAX`], every cohort.
    pub fn most_foreign(&self, node: usize, epochs: u64) -> usize {
        let base = self.base();
        let made = self.made_before(epochs.saturating_sub(1));
        (0..self.cohorts.count())
            .map(|c| {
                let places = self.cohorts.places(c, node);
                if self.cohorts.last(c, made).is_some() {
                    places.len()
                } else {
                    let held = &base[node][places];
                    held.iter().filter(|&&id| self.home(id) != node).count()
                }
            })
            .sum()
    }

    /// The re-deals made before `epoch` ([`cohorts`]): none without an exchange.
    fn made_before(&self, epoch: u64) -> u64 {
        if self.exchanges() {
            self.cohorts.made_before(epoch, self.fraction)
        } else {
            0
        }
    }

    /// Every node's records of its own shards, ascending.
    fn home_lists(&self) -> Vec<Vec<u32>> {
        let mut nodes = vec![Vec::new(); self.nodes];
        for (s, w) in self.shard_starts.windows(2).enumerate() {
            nodes[s % self.nodes].extend(w[0] as u32..w[1] as u32);
        }
        nodes
    }

    /// Every node's records in epoch 0 ([`balance`]).
    fn base(&self) -> Vec<Vec<u32>> {
        balance::deal(self.home_lists(), &self.counts)
    }

    /// The re-deals into `epoch` (numbered as in [`cohorts`]), each with its cohort and
    /// whether it is the cohort's first (the cohort then leaves epoch 0's places).
    pub(crate) fn redeals_into(&self, epoch: u64) -> impl Iterator<Item = (usize, bool)> {
        let (from, to) = match epoch {
            0 => (0, 0),
            e => (self.made_before(e - 1), self.made_before(e)),
        };
        let k = self.cohorts.count() as u64;
        (from..to).map(move |u| ((u % k) as usize, u < k))
    }

    /// Whether cohort `c` was dealt anew before `epoch`.
    pub(crate) fn dealt_before(&self, c: usize, epoch: u64) -> bool {
        self.made_before(epoch) > c as u64
    }

    /// Number of cohorts.
    pub(crate) fn cohort_count(&self) -> usize {
        self.cohorts.count()
    }

    /// Cohort `c`'s records and the node of each of its places, in place order (epoch 0's
    /// holdings `base` give them).
    pub(crate) fn cohort(&self, c: usize, base: &[Vec<u32>]) -> (Vec<u32>, Vec<u32>) {
        self.cohorts.members(c, base)
    }

    /// Every node's records in epoch 0, ascending.
    pub(crate) fn epoch_zero(&self) -> Vec<Vec<u32>> {
        self.base()
    }
}

impl Holdings {
    /// The epoch these holdings are for.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Number of nodes.
    pub fn nodes(&self) -> usize {
        self.nodes.len()
    }

    /// Node `node`'s records, ascending.
    pub fn node(&self, node: usize) -> &[u32] {
        &self.nodes[node]
    }

    /// Records held by the node with the fewest.
    pub fn min_node_records(&self) -> usize {
        self.nodes.iter().map(Vec::len).min().unwrap_or(0)
    }

    /// Records held by the node with the most.
    pub fn max_node_records(&self) -> usize {
        self.nodes.iter().map(Vec::len).max().unwrap_or(0)
    }

    /// `ids` dealt evenly over `nodes` nodes in an order drawn from `(seed, epoch)`, as the
    /// holdings of `epoch` (a node gets `floor` or `ceil` of `ids.len() / nodes`): how the
    /// records an interrupted epoch has not served yet are shared by the nodes of a new layout.
    pub fn dealt(ids: &[u32], nodes: usize, seed: u64, epoch: u64) -> Holdings {
        let mut order = ids.to_vec();
        let mut rng = Xoshiro256::from_seed(mix64(
            (seed ^ 0x4445_414c) ^ mix64(epoch ^ mix64(0x4543_4847)),
        ));
        for i in (1..order.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            order.swap(i, j);
        }
        let nodes = nodes.max(1);
        let mut out = vec![Vec::new(); nodes];
        for (i, id) in order.into_iter().enumerate() {
            out[i % nodes].push(id);
        }
        for held in &mut out {
            held.sort_unstable();
        }
        Holdings { epoch, nodes: out }
    }
}

/// The elements of ascending `all` that are not in ascending `gone`.
pub fn difference(all: &[u32], gone: &[u32]) -> Vec<u32> {
    let mut out = Vec::with_capacity(all.len().saturating_sub(gone.len()));
    let mut g = gone.iter().peekable();
    for &id in all {
        while g.next_if(|&&x| x < id).is_some() {}
        if g.next_if_eq(&&id).is_none() {
            out.push(id);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_nodes(h: &Holdings) -> Vec<Vec<u32>> {
        (0..h.nodes()).map(|n| h.node(n).to_vec()).collect()
    }

    fn all_ids(h: &Holdings) -> Vec<u32> {
        let mut all: Vec<u32> = (0..h.nodes()).flat_map(|n| h.node(n).to_vec()).collect();
        all.sort_unstable();
        all
    }

    #[test]
    fn every_record_is_held_once_and_the_counts_are_even_and_never_change() {
        for shards in [&[40u64, 37, 52, 41, 39, 33][..], &[13, 9, 11, 12, 8]] {
            let records: u64 = shards.iter().sum();
            for nodes in [1, 2, 3, 5] {
                for q in [0.0, 0.25, 0.3, 1.0] {
                    let p = Placement::new(shards, nodes, q, 3).unwrap();
                    let even = records as usize / nodes;
                    assert!(p.counts().iter().all(|&c| c == even || c == even + 1));
                    for epoch in 0..6 {
                        let h = p.holdings(epoch);
                        assert_eq!(all_ids(&h), (0..records as u32).collect::<Vec<u32>>());
                        let now: Vec<usize> = (0..nodes).map(|n| h.node(n).len()).collect();
                        assert_eq!(now, p.counts(), "{nodes} nodes, Q {q}, epoch {epoch}");
                        assert!((0..nodes).all(|n| h.node(n).windows(2).all(|w| w[0] < w[1])));
                    }
                }
            }
        }
    }

    /// Shards [13, 9, 11, 12, 8] on 2 nodes: 32 and 21 records at home, 27 and 26 held, the
    /// 5 highest of node 0's; on 3 nodes (25, 17, 11): 18, 18, 17.
    #[test]
    fn uneven_shards_are_evened_out_by_moving_the_fewest_records() {
        let p = Placement::new(&[13, 9, 11, 12, 8], 2, 0.0, 1).unwrap();
        assert_eq!((p.counts(), p.evened()), (&[27, 26][..], 5));
        let h = p.holdings(4);
        assert!([48, 49, 50, 51, 52].iter().all(|id| h.node(1).contains(id)));
        assert_eq!(
            all_nodes(&h),
            all_nodes(&p.holdings(0)),
            "without an exchange, every epoch alike"
        );
        assert!(p.changes_into(0) && !p.changes_into(1));
        let p = Placement::new(&[13, 9, 11, 12, 8], 3, 0.0, 1).unwrap();
        assert_eq!((p.counts(), p.evened()), (&[18, 18, 17][..], 7));
        let even = Placement::new(&[10, 10, 10, 10], 2, 0.0, 1).unwrap();
        assert_eq!(even.evened(), 0);
        assert_eq!(
            all_nodes(&even.holdings(3)),
            all_nodes(&even.home_holdings())
        );
        assert!(!even.changes_into(0));
    }

    #[test]
    fn a_node_changes_by_about_q_times_p_minus_one_over_p() {
        let shards = vec![1000u64; 4];
        for q in [0.0, 0.25, 0.5, 1.0] {
            let p = Placement::new(&shards, 4, q, 11).unwrap();
            for epoch in [1, 3, 9] {
                let (a, b) = (p.holdings(epoch - 1), p.holdings(epoch));
                for n in 0..4 {
                    let left = difference(a.node(n), b.node(n)).len() as f64 / 1000.0;
                    let expect = q * 3.0 / 4.0;
                    assert!((left - expect).abs() < 0.05, "Q {q} node {n}: {left}");
                }
            }
        }
    }

    #[test]
    fn the_seed_and_epoch_choose_the_exchange() {
        let shards = [100u64, 100];
        let a = Placement::new(&shards, 2, 0.5, 1).unwrap();
        let b = Placement::new(&shards, 2, 0.5, 2).unwrap();
        assert_eq!(a.holdings(3), a.holdings(3));
        assert_ne!(a.holdings(3), b.holdings(3));
        assert_ne!(a.holdings(2).node(0), a.holdings(3).node(0));
        assert_eq!(
            a.holdings(0),
            a.home_holdings(),
            "epoch 0 at home: the shards divide evenly"
        );
    }

    #[test]
    fn a_node_holds_at_most_what_epoch_zero_and_the_cohorts_dealt_give_it() {
        let p = |q| Placement::new(&[500, 500], 2, q, 1).unwrap();
        assert_eq!(p(0.0).most_foreign(0, 5), 0);
        let (a, b) = (p(0.1).most_foreign(0, 5), p(1.0).most_foreign(0, 5));
        assert_eq!(
            (a, b),
            (200, 500),
            "4 boundaries of 10% of the cohorts, or all"
        );
        assert_eq!(p(0.1).most_foreign(0, u64::MAX), 500);
        assert_eq!(p(0.0).most_foreign(0, u64::MAX), 0);
        let uneven = Placement::new(&[13, 9, 11, 12, 8], 2, 0.5, 1).unwrap();
        assert_eq!(
            uneven.most_foreign(1, 1),
            5,
            "epoch 0 evens node 1 out with 5"
        );
        for epochs in [2, 3, 9] {
            let most = (0..epochs).map(|e| {
                let h = uneven.holdings(e);
                h.node(1).iter().filter(|&&id| uneven.home(id) != 1).count()
            });
            assert!(most.max().unwrap() <= uneven.most_foreign(1, epochs));
        }
    }

    /// Epoch e's holdings take time linear in the records, whatever e: a run resumed late
    /// must not walk every epoch before it (a hang guard: stepping through the million epochs
    /// would take hours).
    #[test]
    fn a_late_epoch_is_computed_directly() {
        let p = Placement::new(&[250_000; 8], 4, 0.25, 5).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(p.holdings(1_000_000));
        });
        let h = rx
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("the holdings of epoch 1,000,000 within two minutes");
        assert_eq!(h.epoch(), 1_000_000);
        assert_eq!(h.node(3).len(), 500_000);
    }

    #[test]
    fn bad_fractions_and_node_counts_are_refused() {
        for q in [-0.1, 1.5, f64::NAN] {
            let e = Placement::new(&[1, 1], 2, q, 0).unwrap_err().to_string();
            assert!(e.contains("outside [0, 1]"), "{e}");
        }
        assert!(Placement::new(&[1, 1], 3, 0.5, 0).is_err());
        assert!(Placement::new(&[1, 1], 0, 0.5, 0).is_err());
    }

    #[test]
    fn dealing_shares_ids_evenly() {
        let ids: Vec<u32> = (0..103).filter(|i| i % 3 != 0).collect();
        let h = Holdings::dealt(&ids, 3, 5, 7);
        assert_eq!(h.epoch(), 7);
        assert_eq!(all_ids(&h), ids);
        let lens: Vec<usize> = (0..3).map(|n| h.node(n).len()).collect();
        assert!(lens.iter().all(|&l| l == 22 || l == 23), "{lens:?}");
    }

    #[test]
    fn home_is_the_shard_modulo_the_nodes() {
        let p = Placement::new(&[3, 2, 4], 2, 0.0, 0).unwrap();
        assert_eq!((p.home(0), p.home(3), p.home(5), p.home(8)), (0, 1, 0, 0));
        assert_eq!(p.home_holdings().node(1), &[3, 4]);
        assert_eq!(
            p.holdings(0).node(1),
            &[3, 4, 7, 8],
            "node 0's highest records even out"
        );
    }
}
