//! Deterministic, resumable sampling of a node's records.
//!
//! Every node owns a subset of the split (see [`crate::dataset`]). Within a node there are
//! `ranks_in_node` processes, each feeding `replicas` local model replicas, so the node's
//! records are consumed by `S = ranks_in_node * replicas` *streams*. For every epoch the
//! sampler draws a permutation of the node's records from `(seed, epoch)` alone (splitmix64
//! seeding a xoshiro256** generator, unbiased bounded draws, Fisher-Yates), and lays it out
//! step-major: position `p = (step * S + stream) * batch + j` of the permutation is item `j`
//! of stream `stream`'s batch at `step`, where `stream = rank_in_node * replicas + replica`.
//!
//! Every node must take the same number of steps (the allreduce is synchronous), so the step
//! count comes from the job's node record counts ([`NodeRecords`]), not this node's own: the
//! placement gives every node `floor` or `ceil` of the split over the nodes
//! ([`crate::placement`]). [`Tail::Drop`] takes `floor(fewest / (S * batch))` steps, leaving
//! the rest of each node's permutation (fewer than one global step's records over the job,
//! other ones each epoch) out; [`Tail::Pad`] takes `ceil(most / (S * batch))` and wraps
//! positions past the end of this node's permutation back to its start. [`Tail::Short`] also
//! takes `ceil(most / (S * batch))` steps, but its last step gives every stream the same
//! shorter batch of `ceil(R / S)` records, `R` the most records a node has left (laid out
//! stream-major like a full step, wrapping only to even them out), as a
//! `DataLoader(drop_last=False)` over a `DistributedSampler` does: every record is served, a
//! few twice to even the streams out.
//!
//! Because [`Sampler::batch`] is a pure function of `(epoch, step, replica)`, resuming at any
//! `(epoch, step)` reproduces exactly the batches an uninterrupted run would have produced.
//!
//! # Extension point: global reshuffle every K epochs
//!
//! Records never move between nodes here: each node permutes only its own shards. A global
//! reshuffle every K epochs (re-deal whole shards to nodes from `(seed, epoch / K)` and
//! re-stage them) would plug in at [`crate::dataset::Residency`]: compute the shard to node
//! assignment from a seeded permutation of shard ids instead of `s % P`, re-open the
//! [`crate::dataset::Dataset`] at epoch boundaries where `epoch % K == 0`, and keep this
//! sampler unchanged (it only sees node-local indices and the minimum node record count).

use std::sync::{Arc, Mutex};

use crate::error::{LoaderError, Result};

/// What to do with the records left over when the node's record count is not a multiple of
/// `streams * batch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tail {
    /// Drop the incomplete last step (training).
    Drop,
    /// Complete the last step by wrapping around to the start of the permutation (evaluation:
    /// every record is seen; a few are seen twice, recognisable by their indices).
    Pad,
    /// End with a shorter last step, the same size on every stream (`DataLoader`'s
    /// `drop_last=False`): `ceil(R / S)` records each, `R` the records left.
    Short,
    /// Evaluation: every record of the node exactly once, no padding, and `steps` steps on
    /// every stream (the job-wide count: the largest node's `ceil(records / (S * batch))`).
    /// Full batches while every stream can have one, then the `R` records left shared as
    /// evenly as the streams allow (`floor(R / S)` or one more each, the first `R % S`
    /// streams the larger share; none when `R < S` for the rest), then empty batches up to
    /// `steps`. Each stream's share of the node is `floor` or `ceil` of `records / S`.
    Even {
        /// Steps per epoch of every stream of the job.
        steps: usize,
    },
}

/// The record counts of the job's nodes that set the steps: `fewest` for [`Tail::Drop`],
/// `most` for [`Tail::Pad`] and [`Tail::Short`]. From one count: every node holds as many.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeRecords {
    /// Records of the node with the fewest.
    pub fewest: usize,
    /// Records of the node with the most.
    pub most: usize,
}

impl From<usize> for NodeRecords {
    fn from(n: usize) -> NodeRecords {
        NodeRecords { fewest: n, most: n }
    }
}

/// Configuration of one process's [`Sampler`].
#[derive(Clone, Debug)]
pub struct SamplerConfig {
    /// Seed of the permutation; every rank of every node must use the same one.
    pub seed: u64,
    /// Number of processes (ranks) on this node that share the node's records.
    pub ranks_in_node: usize,
    /// This process's rank among the node's processes, `0..ranks_in_node`.
    pub rank_in_node: usize,
    /// Number of model replicas this process feeds.
    pub replicas: usize,
    /// Records per batch of one replica.
    pub batch_per_replica: usize,
    /// Handling of the incomplete last step.
    pub tail: Tail,
    /// Permute the records (`false`: records in node-local order, e.g. for evaluation).
    pub shuffle: bool,
}

/// Deterministic sampler of node-local record indices; see the module documentation.
///
/// `Sampler` is `Send + Sync`; it caches the permutation of the most recent epoch.
///
/// # Examples
///
/// The two ranks of a node, one replica each, share its 10 records: every step gives each a
/// batch of 4 distinct records, and a new epoch a new order.
///
/// ```
/// use ddl_loader::sampler::{Sampler, SamplerConfig, Tail};
///
/// let rank = |rank_in_node| {
///     let cfg = SamplerConfig {
///         seed: 7,
///         ranks_in_node: 2,
///         rank_in_node,
///         replicas: 1,
///         batch_per_replica: 4,
///         tail: Tail::Drop,
///         shuffle: true,
///     };
///     Sampler::new(10, 10, cfg)
/// };
/// let (a, b) = (rank(0), rank(1));
/// assert_eq!(a.steps_per_epoch(), 1); // 8 of the 10 records; Drop leaves the last 2 out
/// let mut step: Vec<usize> = a.batch(0, 0, 0).into_iter().chain(b.batch(0, 0, 0)).collect();
/// step.sort_unstable();
/// step.dedup();
/// assert_eq!(step.len(), 8);
/// assert_ne!(a.batch(0, 0, 0), a.batch(1, 0, 0));
/// ```
pub struct Sampler {
    node_records: usize,
    /// The job's node record counts, which set the steps (and the short last batch).
    job: NodeRecords,
    steps: usize,
    cfg: SamplerConfig,
    cache: Mutex<Option<(u64, Arc<[u32]>)>>,
}

impl Clone for Sampler {
    fn clone(&self) -> Self {
        Sampler {
            node_records: self.node_records,
            job: self.job,
            steps: self.steps,
            cfg: self.cfg.clone(),
            cache: Mutex::new(None),
        }
    }
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler")
            .field("node_records", &self.node_records)
            .field("steps", &self.steps)
            .field("cfg", &self.cfg)
            .finish()
    }
}

impl Sampler {
    /// Creates the sampler of one process.
    ///
    /// `node_records` is the number of records on this node, `job` the fewest and most
    /// records a node of the job holds ([`crate::placement::Placement::counts`]), or one count
    /// when every node holds as many.
    ///
    /// # Panics
    ///
    /// On an invalid configuration (see [`Sampler::try_new`] for the conditions); use
    /// `try_new` to get an error instead.
    pub fn new(node_records: usize, job: impl Into<NodeRecords>, cfg: SamplerConfig) -> Sampler {
        match Sampler::try_new(node_records, job, cfg) {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        }
    }

    /// Creates the sampler of one process, or fails when `ranks_in_node`, `replicas` or
    /// `batch_per_replica` is zero, `rank_in_node >= ranks_in_node`, `node_records` is not
    /// within the job's fewest and most, a node has no records, or `node_records >= 2^32`.
    pub fn try_new(
        node_records: usize,
        job: impl Into<NodeRecords>,
        cfg: SamplerConfig,
    ) -> Result<Sampler> {
        let job = job.into();
        let invalid = |why: String| Err(LoaderError::InvalidConfig(format!("sampler: {why}")));
        if cfg.ranks_in_node == 0 || cfg.replicas == 0 || cfg.batch_per_replica == 0 {
            return invalid(format!(
                "ranks_in_node ({}), replicas ({}) and batch_per_replica ({}) must be positive",
                cfg.ranks_in_node, cfg.replicas, cfg.batch_per_replica
            ));
        }
        if cfg.rank_in_node >= cfg.ranks_in_node {
            return invalid(format!(
                "rank_in_node {} is not below ranks_in_node {}",
                cfg.rank_in_node, cfg.ranks_in_node
            ));
        }
        if node_records == 0 || job.fewest == 0 {
            return invalid("a node has no records".to_string());
        }
        if !(job.fewest..=job.most).contains(&node_records) {
            return invalid(format!(
                "this node's {node_records} records are not within the job's {} to {} per node",
                job.fewest, job.most
            ));
        }
        if node_records > u32::MAX as usize {
            return invalid(format!(
                "{node_records} records on one node (limit 2^32 - 1)"
            ));
        }
        let per_step = cfg.ranks_in_node * cfg.replicas * cfg.batch_per_replica;
        let steps = match cfg.tail {
            Tail::Drop => job.fewest / per_step,
            Tail::Pad | Tail::Short => job.most.div_ceil(per_step),
            Tail::Even { steps } if steps < node_records.div_ceil(per_step) => {
                return invalid(format!(
                    "{steps} steps cannot deal this node's {node_records} records in batches \
                     of {} to {} streams",
                    cfg.batch_per_replica,
                    cfg.ranks_in_node * cfg.replicas
                ));
            }
            Tail::Even { steps } => steps,
        };
        Ok(Sampler {
            node_records,
            job,
            steps,
            cfg,
            cache: Mutex::new(None),
        })
    }

    /// Steps per epoch, identical on every rank of every node (may be 0 with [`Tail::Drop`]
    /// when the smallest node has fewer records than one step consumes).
    pub fn steps_per_epoch(&self) -> usize {
        self.steps
    }

    /// Number of records on this node.
    pub fn node_records(&self) -> usize {
        self.node_records
    }

    /// The configuration this sampler was built with.
    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// The node's record order for `epoch`: a permutation of `0..node_records` (identity when
    /// `shuffle` is off), a pure function of `(seed, epoch)`.
    pub fn order(&self, epoch: u64) -> Arc<[u32]> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((e, order)) = cache.as_ref() {
            if *e == epoch {
                return Arc::clone(order);
            }
        }
        let mut order: Vec<u32> = (0..self.node_records as u32).collect();
        if self.cfg.shuffle {
            let mut rng = Xoshiro256::from_seed(mix64(self.cfg.seed ^ mix64(epoch ^ 0x5348_5546)));
            for i in (1..order.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                order.swap(i, j);
            }
        }
        let order: Arc<[u32]> = order.into();
        *cache = Some((epoch, Arc::clone(&order)));
        order
    }

    /// Records in `replica`'s batch at `step`: `batch_per_replica`, except the last step of
    /// a [`Tail::Short`] epoch, which shares the records left evenly (rounded up), and the
    /// steps of a [`Tail::Even`] epoch past its full batches.
    pub fn batch_len(&self, step: usize, replica: usize) -> usize {
        self.span(step, replica).1
    }

    /// Records `replica` of this rank gets per epoch (the sum of [`Sampler::batch_len`] over
    /// the steps).
    pub fn samples_per_epoch(&self, replica: usize) -> usize {
        match (self.cfg.tail, self.steps) {
            (_, 0) => 0,
            (Tail::Even { .. }, _) => {
                let full = self.node_records / self.per_step();
                full * self.cfg.batch_per_replica + self.batch_len(full, replica)
            }
            (_, n) => (n - 1) * self.cfg.batch_per_replica + self.batch_len(n - 1, replica),
        }
    }

    /// Records of a stream's share of the epoch before batching, as `len()` of a
    /// `DistributedSampler` counts them: `ceil(most / S)` for [`Tail::Drop`] (whose batches
    /// leave the rest out, as `DataLoader(drop_last=True)`'s do) and [`Tail::Short`]; every
    /// record drawn, padding included, for [`Tail::Pad`]; the first replica's records for
    /// [`Tail::Even`].
    pub fn share_per_epoch(&self) -> usize {
        match self.cfg.tail {
            Tail::Drop | Tail::Short => self
                .job
                .most
                .div_ceil(self.cfg.ranks_in_node * self.cfg.replicas),
            Tail::Pad => self.steps * self.cfg.batch_per_replica,
            Tail::Even { .. } => self.samples_per_epoch(0),
        }
    }

    /// Records every stream's batch takes in a full step.
    fn per_step(&self) -> usize {
        self.cfg.ranks_in_node * self.cfg.replicas * self.cfg.batch_per_replica
    }

    /// First permutation position (before wrapping) and length of `replica`'s batch at `step`.
    fn span(&self, step: usize, replica: usize) -> (usize, usize) {
        let batch = self.cfg.batch_per_replica;
        let streams = self.cfg.ranks_in_node * self.cfg.replicas;
        let stream = self.cfg.rank_in_node * self.cfg.replicas + replica;
        let start = step * streams * batch;
        match self.cfg.tail {
            Tail::Even { .. } => {
                let full = self.node_records / (streams * batch);
                if step < full {
                    return (start + stream * batch, batch);
                }
                // The records left (none after the step that deals them).
                let left = if step == full {
                    self.node_records - start
                } else {
                    0
                };
                let (each, more) = (left / streams, left % streams);
                (
                    start + stream * each + stream.min(more),
                    each + usize::from(stream < more),
                )
            }
            Tail::Short if step + 1 == self.steps => {
                let left = self.job.most - start;
                let len = left.div_ceil(streams);
                (start + stream * len, len)
            }
            _ => (start + stream * batch, batch),
        }
    }

    /// Permutation position of item `j` of `replica`'s batch at `step`, before wrapping.
    fn position(&self, step: usize, replica: usize, j: usize) -> usize {
        self.span(step, replica).0 + j
    }

    /// Node-local record indices of `replica`'s batch at `(epoch, step)`.
    ///
    /// # Panics
    ///
    /// When `step >= steps_per_epoch()` or `replica >= replicas` (caller bugs).
    pub fn batch(&self, epoch: u64, step: usize, replica: usize) -> Vec<usize> {
        let mut out = Vec::with_capacity(self.cfg.batch_per_replica);
        self.batch_into(epoch, step, replica, &mut out);
        out
    }

    /// Like [`Sampler::batch`], writing into `out` (cleared first) to avoid an allocation.
    ///
    /// # Panics
    ///
    /// When `step >= steps_per_epoch()` or `replica >= replicas` (caller bugs).
    pub fn batch_into(&self, epoch: u64, step: usize, replica: usize, out: &mut Vec<usize>) {
        assert!(
            step < self.steps,
            "step {step} out of range ({} steps per epoch)",
            self.steps
        );
        assert!(
            replica < self.cfg.replicas,
            "replica {replica} out of range ({} replicas)",
            self.cfg.replicas
        );
        let order = self.order(epoch);
        out.clear();
        for j in 0..self.batch_len(step, replica) {
            let p = self.position(step, replica, j) % self.node_records;
            out.push(order[p] as usize);
        }
    }

    /// Position of the record that follows `replica`'s item `j` at `step` in the epoch order,
    /// `k` places further on (wrapping): used to pick deterministic substitutes for bad records.
    pub fn successor(&self, epoch: u64, step: usize, replica: usize, j: usize, k: usize) -> usize {
        let order = self.order(epoch);
        let p = (self.position(step, replica, j) + k) % self.node_records;
        order[p] as usize
    }
}

/// The splitmix64 finaliser: a bijective 64-bit mix, used as a counter-based hash.
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// xoshiro256** (Blackman and Vigna), seeded through splitmix64.
#[derive(Clone, Debug)]
pub struct Xoshiro256 {
    s: [u64; 4],
}

impl Xoshiro256 {
    /// Seeds the generator from one 64-bit value (splitmix64 sequence, never all zero).
    pub fn from_seed(seed: u64) -> Self {
        let mut x = seed;
        let mut s = [0u64; 4];
        for v in &mut s {
            *v = mix64(x);
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        }
        if s == [0; 4] {
            s[0] = 1;
        }
        Xoshiro256 { s }
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform integer in `0..n` without modulo bias (Lemire's method); `n` must be positive.
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        let mut m = (self.next_u64() as u128) * (n as u128);
        if (m as u64) < n {
            let threshold = n.wrapping_neg() % n;
            while (m as u64) < threshold {
                m = (self.next_u64() as u128) * (n as u128);
            }
        }
        (m >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(ranks: usize, rank: usize, replicas: usize, batch: usize, tail: Tail) -> SamplerConfig {
        SamplerConfig {
            seed: 42,
            ranks_in_node: ranks,
            rank_in_node: rank,
            replicas,
            batch_per_replica: batch,
            tail,
            shuffle: true,
        }
    }

    /// Counts how often each record is drawn in one epoch over all ranks and replicas.
    fn epoch_counts(
        n: usize,
        min: usize,
        ranks: usize,
        replicas: usize,
        batch: usize,
        tail: Tail,
        epoch: u64,
    ) -> (usize, HashMap<usize, usize>) {
        let mut counts = HashMap::new();
        let mut steps = None;
        for rank in 0..ranks {
            let s = Sampler::new(n, min, cfg(ranks, rank, replicas, batch, tail));
            steps.get_or_insert(s.steps_per_epoch());
            assert_eq!(steps, Some(s.steps_per_epoch()));
            for step in 0..s.steps_per_epoch() {
                for r in 0..replicas {
                    let b = s.batch(epoch, step, r);
                    assert_eq!(b.len(), batch);
                    for i in b {
                        assert!(i < n);
                        *counts.entry(i).or_insert(0) += 1;
                    }
                }
            }
        }
        (steps.unwrap_or(0), counts)
    }

    #[test]
    fn drop_divisible_covers_each_record_exactly_once() {
        // 2 ranks x 3 replicas x batch 5 = 30 per step; 120 records = 4 steps.
        let (steps, counts) = epoch_counts(120, 120, 2, 3, 5, Tail::Drop, 7);
        assert_eq!(steps, 4);
        assert_eq!(counts.len(), 120);
        assert!(counts.values().all(|&c| c == 1));
    }

    #[test]
    fn drop_not_divisible_uses_distinct_records() {
        let (steps, counts) = epoch_counts(131, 131, 2, 3, 5, Tail::Drop, 0);
        assert_eq!(steps, 4);
        assert_eq!(counts.len(), 120);
        assert!(counts.values().all(|&c| c == 1));
    }

    #[test]
    fn pad_covers_every_record() {
        let (steps, counts) = epoch_counts(131, 131, 2, 3, 5, Tail::Pad, 3);
        assert_eq!(steps, 5);
        assert_eq!(counts.len(), 131);
        assert_eq!(counts.values().sum::<usize>(), 150);
        assert!(counts.values().all(|&c| c == 1 || c == 2));
    }

    /// Nodes of 701 and 700 records, 20 a step: Drop takes the fewest's 35 steps (fewer than
    /// one global step's 40 records left out); Pad and Short the most's 36, every record of
    /// both nodes drawn.
    #[test]
    fn drop_takes_the_fewest_nodes_steps_and_pad_the_mosts() {
        let job = NodeRecords {
            fewest: 700,
            most: 701,
        };
        for (tail, steps) in [(Tail::Drop, 35), (Tail::Pad, 36), (Tail::Short, 36)] {
            for n in [701, 700] {
                let s = Sampler::new(n, job, cfg(1, 0, 2, 10, tail));
                assert_eq!(s.steps_per_epoch(), steps, "{tail:?}");
                let mut seen: Vec<usize> = (0..steps)
                    .flat_map(|t| [s.batch(0, t, 0), s.batch(0, t, 1)])
                    .flatten()
                    .collect();
                seen.sort_unstable();
                seen.dedup();
                let want = if tail == Tail::Drop { 700 } else { n };
                assert_eq!(seen.len(), want, "{tail:?} on {n}");
            }
        }
        assert!(Sampler::try_new(702, job, cfg(1, 0, 1, 1, Tail::Drop)).is_err());
    }

    #[test]
    fn same_seed_same_order_epochs_differ() {
        let a = Sampler::new(500, 500, cfg(1, 0, 1, 10, Tail::Drop));
        let b = Sampler::new(500, 500, cfg(1, 0, 1, 10, Tail::Drop));
        assert_eq!(a.order(5), b.order(5));
        assert_ne!(a.order(5), a.order(6));
        let mut other = cfg(1, 0, 1, 10, Tail::Drop);
        other.seed = 43;
        let c = Sampler::new(500, 500, other);
        assert_ne!(a.order(5), c.order(5));
        let mut sorted = a.order(9).to_vec();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..500).collect::<Vec<u32>>());
    }

    #[test]
    fn no_shuffle_is_identity() {
        let mut c = cfg(1, 0, 1, 4, Tail::Pad);
        c.shuffle = false;
        let s = Sampler::new(10, 10, c);
        assert_eq!(s.batch(0, 0, 0), vec![0, 1, 2, 3]);
        assert_eq!(s.batch(1, 2, 0), vec![8, 9, 0, 1]);
    }

    #[test]
    fn resume_equals_uninterrupted() {
        let full = Sampler::new(300, 300, cfg(2, 1, 2, 7, Tail::Drop));
        let mut uninterrupted = Vec::new();
        for epoch in 0..3 {
            for step in 0..full.steps_per_epoch() {
                for r in 0..2 {
                    uninterrupted.push(full.batch(epoch, step, r));
                }
            }
        }
        // A fresh sampler resuming at (epoch 1, step 5).
        let resumed = Sampler::new(300, 300, cfg(2, 1, 2, 7, Tail::Drop));
        let mut tail = Vec::new();
        for epoch in 1..3 {
            let first = if epoch == 1 { 5 } else { 0 };
            for step in first..resumed.steps_per_epoch() {
                for r in 0..2 {
                    tail.push(resumed.batch(epoch, step, r));
                }
            }
        }
        let skip = (resumed.steps_per_epoch() + 5) * 2;
        assert_eq!(&uninterrupted[skip..], &tail[..]);
    }

    /// `Tail::Short`: a `DataLoader(drop_last=False)` over a `DistributedSampler` of `n`
    /// records on `w` ranks gives each `ceil(n / w)` samples in `ceil(ceil(n / w) / b)`
    /// batches, the last one shorter; every record is drawn, the few extra ones only to even
    /// the ranks out.
    #[test]
    fn short_tail_is_dataloaders_last_batch() {
        for (n, ranks, batch) in [
            (10usize, 1usize, 4usize),
            (96, 1, 100),
            (23, 3, 4),
            (97, 2, 8),
            (64, 2, 8),
        ] {
            let per_rank = n.div_ceil(ranks);
            let mut seen = HashMap::new();
            for rank in 0..ranks {
                let s = Sampler::new(n, n, cfg(ranks, rank, 1, batch, Tail::Short));
                assert_eq!(
                    s.steps_per_epoch(),
                    per_rank.div_ceil(batch),
                    "{n} {ranks} {batch}"
                );
                assert_eq!(s.samples_per_epoch(0), per_rank);
                assert_eq!(s.share_per_epoch(), per_rank);
                let last = s.steps_per_epoch() - 1;
                let lens: Vec<usize> = (0..=last).map(|t| s.batch(3, t, 0).len()).collect();
                assert_eq!(lens[last], per_rank - last * batch, "{n} {ranks} {batch}");
                assert!(lens[..last].iter().all(|&l| l == batch));
                for t in 0..=last {
                    for i in s.batch(3, t, 0) {
                        *seen.entry(i).or_insert(0usize) += 1;
                    }
                }
            }
            assert_eq!(seen.len(), n, "every record drawn");
            assert_eq!(seen.values().sum::<usize>(), per_rank * ranks);
        }
    }

    /// `Tail::Even`: every stream takes the same steps (the job's), every record exactly once
    /// over all streams, each stream `floor` or `ceil` of `n / S` records in full batches then
    /// one shorter (or empty) batch: ImageNet's 50,000 val images at batch 512 on 8 ranks,
    /// 100 records at batch 512 on 2, fewer records left than streams, and replicas.
    #[test]
    fn even_tail_deals_every_record_once_in_equal_steps() {
        for (n, ranks, replicas, batch, steps) in [
            (50_000usize, 8usize, 1usize, 512usize, 13usize),
            (100, 2, 1, 512, 1),
            (28, 3, 1, 9, 2),
            (29, 2, 2, 3, 3),
            (7, 2, 1, 4, 4), // a smaller node of a job whose largest takes 4 steps
        ] {
            let streams = ranks * replicas;
            let mut seen = HashMap::new();
            for rank in 0..ranks {
                let c = SamplerConfig {
                    shuffle: false,
                    ..cfg(ranks, rank, replicas, batch, Tail::Even { steps })
                };
                let s = Sampler::new(n, n, c);
                assert_eq!(s.steps_per_epoch(), steps, "{n} {ranks} {batch}");
                for r in 0..replicas {
                    let lens: Vec<usize> = (0..steps).map(|t| s.batch(0, t, r).len()).collect();
                    let total: usize = lens.iter().sum();
                    assert_eq!(total, s.samples_per_epoch(r));
                    assert!(
                        total == n / streams || total == n.div_ceil(streams),
                        "{lens:?}"
                    );
                    let full = lens.iter().take_while(|&&l| l == batch).count();
                    assert!(lens[full..].iter().skip(1).all(|&l| l == 0), "{lens:?}");
                    for t in 0..steps {
                        for i in s.batch(0, t, r) {
                            *seen.entry(i).or_insert(0usize) += 1;
                        }
                    }
                }
            }
            assert_eq!(seen.len(), n, "every record drawn");
            assert!(seen.values().all(|&c| c == 1), "no record twice");
        }
        // Fewer steps than the node's records need is a configuration error.
        assert!(Sampler::try_new(10, 10, cfg(1, 0, 1, 4, Tail::Even { steps: 2 })).is_err());
    }

    #[test]
    fn invalid_configs_are_errors() {
        assert!(Sampler::try_new(10, 10, cfg(2, 2, 1, 1, Tail::Drop)).is_err());
        assert!(Sampler::try_new(10, 11, cfg(1, 0, 1, 1, Tail::Drop)).is_err());
        assert!(Sampler::try_new(10, 10, cfg(1, 0, 0, 1, Tail::Drop)).is_err());
        assert!(Sampler::try_new(0, 0, cfg(1, 0, 1, 1, Tail::Drop)).is_err());
    }

    #[test]
    fn bounded_draws_are_uniform() {
        let mut rng = Xoshiro256::from_seed(1);
        let mut hist = [0u32; 6];
        for _ in 0..60_000 {
            hist[rng.below(6) as usize] += 1;
        }
        assert!(
            hist.iter().all(|&h| (9_400..10_600).contains(&h)),
            "{hist:?}"
        );
    }
}
