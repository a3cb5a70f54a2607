//! Which node holds which record of a split in each epoch, when the nodes exchange a fraction
//! of their records at every epoch boundary ("partial local shuffling", Nguyen et al., IPDPS
//! 2022).
//!
//! In epoch 0 every node holds its *home* records, those of the shards `s % nodes == node`
//! ([`crate::dataset`]). Going from epoch `e` to `e + 1`, every node puts a fraction `Q` of
//! the records it holds, drawn from `(seed, e, node)`, into a pool; the pool is shuffled from
//! `(seed, e)` and dealt back, each node receiving as many records as it put in. A node's
//! record count therefore never changes (the steps per epoch stay those of epoch 0), `Q = 0`
//! is node-local order forever and `Q = 1` a global shuffle every epoch. About `Q (P - 1) / P`
//! of a node's records change between epochs on `P` nodes (a pooled record may come back to
//! the node that gave it).
//!
//! Everything is a pure function of the seed, `Q`, the node count and the split's shard sizes:
//! every rank computes every node's holdings itself, with no message, and a run resumed at
//! epoch `e` finds the same holdings an uninterrupted run had.

use crate::error::{LoaderError, Result};
use crate::sampler::{mix64, Xoshiro256};

/// The record placement of one split over a number of nodes; see the module documentation.
///
/// # Examples
///
/// Two nodes of five records each (two shards): epoch 0 is the home placement, and a
/// global shuffle (`Q = 1`) keeps every node's count while moving records between them.
///
/// ```
/// use ddl_loader::placement::Placement;
///
/// let placement = Placement::new(&[5, 5], 2, 1.0, 7)?;
/// let first = placement.holdings(0);
/// assert_eq!(first.node(0), &[0, 1, 2, 3, 4]);
/// let next = first.advance(&placement);
/// assert_eq!(next.node(0).len(), 5);
/// assert_eq!(next, placement.holdings(1));
/// let mut all: Vec<u32> = next.node(0).iter().chain(next.node(1)).copied().collect();
/// all.sort_unstable();
/// assert_eq!(all, (0..10).collect::<Vec<u32>>());
/// # Ok::<(), ddl_loader::LoaderError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Placement {
    seed: u64,
    fraction: f64,
    nodes: usize,
    /// Global id of each shard's first record; one extra entry, the split's record count.
    shard_starts: Vec<u64>,
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
        Ok(Placement {
            seed,
            fraction,
            nodes,
            shard_starts,
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

    /// Records in the split.
    pub fn records(&self) -> usize {
        self.shard_starts[self.shard_starts.len() - 1] as usize
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

    /// Every node's home records: the holdings of epoch 0.
    pub fn home_holdings(&self) -> Holdings {
        let mut nodes = vec![Vec::new(); self.nodes];
        for (s, w) in self.shard_starts.windows(2).enumerate() {
            nodes[s % self.nodes].extend(w[0] as u32..w[1] as u32);
        }
        Holdings { epoch: 0, nodes }
    }

    /// The holdings of `epoch`: epoch 0's advanced `epoch` times (linear in `epoch` times the
    /// records; keep the last [`Holdings`] and [`Holdings::advance`] it from one epoch to the
    /// next).
    pub fn holdings(&self, epoch: u64) -> Holdings {
        let mut h = self.home_holdings();
        if self.fraction > 0.0 && self.nodes > 1 {
            while h.epoch < epoch {
                h = h.advance(self);
            }
        }
        h.epoch = epoch;
        h
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

    /// The holdings of the next epoch under `placement` (the exchange at the boundary).
    pub fn advance(&self, placement: &Placement) -> Holdings {
        let epoch = self.epoch + 1;
        if placement.fraction == 0.0 || self.nodes.len() < 2 {
            return Holdings {
                epoch,
                nodes: self.nodes.clone(),
            };
        }
        let mut pool = Vec::new();
        let mut kept = Vec::with_capacity(self.nodes.len());
        let mut given = Vec::with_capacity(self.nodes.len());
        for (n, held) in self.nodes.iter().enumerate() {
            let out = (placement.fraction * held.len() as f64).round() as usize;
            let mut drawn = held.clone();
            let mut rng = rng(placement.seed, self.epoch, n as u64 + 1);
            for i in 0..out {
                let j = i + rng.below((drawn.len() - i) as u64) as usize;
                drawn.swap(i, j);
            }
            let mut gone = drawn[..out].to_vec();
            gone.sort_unstable();
            kept.push(difference(held, &gone));
            pool.extend_from_slice(&gone);
            given.push(out);
        }
        let mut rng = rng(placement.seed, self.epoch, 0);
        for i in (1..pool.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            pool.swap(i, j);
        }
        let mut dealt = pool.as_slice();
        let nodes = kept
            .into_iter()
            .zip(given)
            .map(|(mut held, n)| {
                let (mine, rest) = dealt.split_at(n);
                dealt = rest;
                held.extend_from_slice(mine);
                held.sort_unstable();
                held
            })
            .collect();
        Holdings { epoch, nodes }
    }

    /// `ids` dealt evenly over `nodes` nodes in an order drawn from `(seed, epoch)`, as the
    /// holdings of `epoch` (a node gets `floor` or `ceil` of `ids.len() / nodes`): how the
    /// records an interrupted epoch has not served yet are shared by the nodes of a new layout.
    pub fn dealt(ids: &[u32], nodes: usize, seed: u64, epoch: u64) -> Holdings {
        let mut order = ids.to_vec();
        let mut rng = rng(seed ^ 0x4445_414c, epoch, 0);
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

/// The generator of stream `stream` of epoch `epoch`'s exchange.
fn rng(seed: u64, epoch: u64, stream: u64) -> Xoshiro256 {
    Xoshiro256::from_seed(mix64(seed ^ mix64(epoch ^ mix64(stream ^ 0x4543_4847))))
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

    fn all_ids(h: &Holdings) -> Vec<u32> {
        let mut all: Vec<u32> = (0..h.nodes()).flat_map(|n| h.node(n).to_vec()).collect();
        all.sort_unstable();
        all
    }

    #[test]
    fn every_record_is_held_once_and_counts_never_change() {
        let shards = [40u64, 37, 52, 41, 39, 33];
        for nodes in [1, 2, 3] {
            for q in [0.0, 0.25, 0.5, 1.0] {
                let p = Placement::new(&shards, nodes, q, 3).unwrap();
                let mut h = p.home_holdings();
                let counts: Vec<usize> = (0..nodes).map(|n| h.node(n).len()).collect();
                for _ in 0..4 {
                    h = h.advance(&p);
                    assert_eq!(all_ids(&h), (0..242).collect::<Vec<u32>>());
                    let now: Vec<usize> = (0..nodes).map(|n| h.node(n).len()).collect();
                    assert_eq!(now, counts, "{nodes} nodes, Q {q}");
                    assert!((0..nodes).all(|n| h.node(n).windows(2).all(|w| w[0] < w[1])));
                }
                assert_eq!(h, p.holdings(4));
            }
        }
    }

    #[test]
    fn a_node_changes_by_about_q_times_p_minus_one_over_p() {
        let shards = vec![1000u64; 4];
        for q in [0.0, 0.25, 0.5, 1.0] {
            let p = Placement::new(&shards, 4, q, 11).unwrap();
            let (a, b) = (p.holdings(2), p.holdings(3));
            for n in 0..4 {
                let left = difference(a.node(n), b.node(n)).len() as f64 / 1000.0;
                let expect = q * 3.0 / 4.0;
                assert!((left - expect).abs() < 0.05, "Q {q} node {n}: {left}");
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
    }
}
