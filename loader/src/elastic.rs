//! Exact elastic resume, the parts every front end shares: what a job of a given layout served
//! of an epoch (recomputed from the layout alone, no message), and the rest of the epoch
//! dealt over a new layout.
//!
//! A job stopped mid-epoch has served, over all its ranks, the records its samplers gave for
//! the steps taken: a pure function of the split's shard sizes, the [`Layout`] and the step
//! ([`served`]). A job resumed on another layout deals the records not served yet over its
//! own nodes ([`Holdings::dealt`]) and serves them, each once (the Drop tail's rule aside), in
//! the rest of the epoch: the *remainder* ([`remainder`]), each node reading its part from
//! every shard of the directory. A remainder stopped in turn has served what it began with
//! plus what its own samplers gave ([`served_after`]), so a second change of layout mid-epoch
//! continues the same way. ddl-train gathers the served ids of its ranks instead of
//! recomputing them (its checkpoints carry the [`EpochProgress`]); the Python loader, whose
//! state is per rank, recomputes them.

use std::path::Path;

use crate::dataset::{Dataset, OpenOptions, Residency};
use crate::error::{LoaderError, Result};
use crate::placement::{Holdings, Placement};
use crate::progress::EpochProgress;
use crate::sampler::{NodeRecords, Sampler, SamplerConfig, Tail};

/// How a job's ranks took the records of a split: what decides which records it served.
#[derive(Clone, Debug, PartialEq)]
pub struct Layout {
    /// Nodes of the job (each holding the shards `s % nodes`, or the placement's records).
    pub nodes: usize,
    /// Ranks on every node.
    pub ranks_in_node: usize,
    /// Model replicas each rank feeds.
    pub replicas: usize,
    /// Records per batch of one replica.
    pub batch_per_replica: usize,
    /// The rule of the incomplete last step.
    pub tail: Tail,
    /// Seed of the order (and of the placement and of the dealing).
    pub seed: u64,
    /// Fraction of every node's records exchanged at each epoch boundary
    /// ([`crate::placement`]).
    pub exchange: f64,
}

impl Layout {
    /// The sampler configuration of rank `rank_in_node` of a node (shuffled).
    pub fn sampler_config(&self, rank_in_node: usize) -> SamplerConfig {
        SamplerConfig {
            seed: self.seed,
            ranks_in_node: self.ranks_in_node,
            rank_in_node,
            replicas: self.replicas,
            batch_per_replica: self.batch_per_replica,
            tail: self.tail,
            shuffle: true,
        }
    }

    /// Fails on a layout whose order depends on more than itself (an unshuffled val
    /// [`Tail::Even`]) or that has no ranks or batches.
    fn check(&self) -> Result<()> {
        let invalid = |why: &str| Err(LoaderError::InvalidConfig(format!("layout: {why}")));
        if matches!(self.tail, Tail::Even { .. }) {
            return invalid("an evaluation order (Tail::Even) is not resumed on another layout");
        }
        if self.nodes == 0 || self.ranks_in_node == 0 || self.replicas == 0 {
            return invalid("nodes, ranks per node and replicas must be positive");
        }
        if self.batch_per_replica == 0 {
            return invalid("the batch must be positive");
        }
        Ok(())
    }
}

/// What the ranks of `layout` served of `epoch` in its first `steps` steps, each node from the
/// records the placement gives it ([`Placement::holdings`]: its home shards without an
/// exchange), in a split whose shards hold `shard_records` records.
///
/// At the epoch's end (`steps` its steps per epoch) every record counts as served: what the
/// last incomplete step left out stays left out, as in an uninterrupted epoch. Fails when
/// `steps` is beyond the epoch's end or the layout does not fit the split.
///
/// # Examples
///
/// Two nodes of one rank, shards of 6 and 4 records (each node holds 5: one record of the
/// first shard is the second node's), batches of 2: after one step the job has served 4
/// records, and its second step ends the epoch.
///
/// ```
/// use ddl_loader::elastic::{served, Layout};
/// use ddl_loader::sampler::Tail;
///
/// let layout = Layout {
///     nodes: 2, ranks_in_node: 1, replicas: 1, batch_per_replica: 2,
///     tail: Tail::Drop, seed: 5, exchange: 0.0,
/// };
/// let p = served(&[6, 4], &layout, 0, 1)?;
/// assert_eq!((p.served(), p.unserved().len()), (4, 6));
/// assert_eq!(served(&[6, 4], &layout, 0, 2)?.unserved(), Vec::<u32>::new()); // the end
/// # Ok::<(), ddl_loader::LoaderError>(())
/// ```
pub fn served(
    shard_records: &[u64],
    layout: &Layout,
    epoch: u64,
    steps: usize,
) -> Result<EpochProgress> {
    layout.check()?;
    let placement = Placement::new(shard_records, layout.nodes, layout.exchange, layout.seed)?;
    let mut progress = EpochProgress::new(epoch, placement.records() as u64);
    mark_served(&mut progress, &placement.holdings(epoch), layout, steps)?;
    Ok(progress)
}

/// Steps of `epoch` on `layout` over a split whose shards hold `shard_records` records, or of
/// the remainder `layout` deals from `before` (what the epoch had served when it began).
pub fn epoch_steps(
    shard_records: &[u64],
    layout: &Layout,
    epoch: u64,
    before: Option<&EpochProgress>,
) -> Result<usize> {
    layout.check()?;
    let held = match before {
        Some(b) => Holdings::dealt(&b.unserved(), layout.nodes, layout.seed, b.epoch),
        None => Placement::new(shard_records, layout.nodes, layout.exchange, layout.seed)?
            .holdings(epoch),
    };
    let job = node_records(&held);
    if job.fewest == 0 {
        return Ok(0);
    }
    Ok(Sampler::try_new(held.node(0).len(), job, layout.sampler_config(0))?.steps_per_epoch())
}

/// `before` (what an epoch had served when its remainder began on `layout`) plus what the
/// remainder served in its first `steps` steps: the progress of a remainder stopped in turn.
/// At the remainder's end every record counts as served, as in [`served`].
pub fn served_after(
    before: &EpochProgress,
    layout: &Layout,
    steps: usize,
) -> Result<EpochProgress> {
    layout.check()?;
    let dealt = Holdings::dealt(&before.unserved(), layout.nodes, layout.seed, before.epoch);
    let mut progress = before.clone();
    progress.resumed = true;
    mark_served(&mut progress, &dealt, layout, steps)?;
    Ok(progress)
}

/// Marks in `progress` what the ranks of `layout` served over `held` (every node's records,
/// ascending: a node's record `i` is its `i`-th) in the first `steps` steps.
fn mark_served(
    progress: &mut EpochProgress,
    held: &Holdings,
    layout: &Layout,
    steps: usize,
) -> Result<()> {
    let job = node_records(held);
    let samplers = |ids: &[u32]| -> Result<Vec<Sampler>> {
        (0..layout.ranks_in_node)
            .map(|r| Sampler::try_new(ids.len(), job, layout.sampler_config(r)))
            .collect()
    };
    let per_epoch = if job.fewest == 0 {
        0
    } else {
        samplers(held.node(0))?[0].steps_per_epoch()
    };
    if steps > per_epoch {
        return Err(LoaderError::InvalidConfig(format!(
            "step {steps} of epoch {} is beyond its {per_epoch} steps on {} node(s) of {} \
             rank(s), batch {}",
            progress.epoch, layout.nodes, layout.ranks_in_node, layout.batch_per_replica
        )));
    }
    if steps == per_epoch {
        progress.mark_rest();
        return Ok(());
    }
    let mut batch = Vec::new();
    for node in 0..held.nodes() {
        let ids = held.node(node);
        for sampler in samplers(ids)? {
            for step in 0..steps {
                for replica in 0..layout.replicas {
                    sampler.batch_into(progress.epoch, step, replica, &mut batch);
                    progress.mark_all(batch.iter().map(|&i| u64::from(ids[i])))?;
                }
            }
        }
    }
    Ok(())
}

/// The fewest and most records a node of `held` holds: what its samplers' steps follow.
pub fn node_records(held: &Holdings) -> NodeRecords {
    NodeRecords {
        fewest: held.min_node_records(),
        most: held.max_node_records(),
    }
}

/// One node's part of the rest of an epoch on a new layout.
pub struct Remainder {
    /// The records not served yet that this node serves, read from every shard of the split.
    pub dataset: Dataset,
    /// How one rank's replicas take them.
    pub sampler: Sampler,
}

/// Node `residency.node`'s part of the records `progress` has not served, dealt over
/// `residency.nodes` nodes from `cfg.seed` ([`Holdings::dealt`]) and read from every shard of
/// `split` in `data` (a lost node's shards included), with the sampler of the rank that `cfg`
/// describes over them; `None` when no full step is left to take (the epoch then ends where
/// it is).
pub fn remainder(
    data: &Path,
    split: &str,
    progress: &EpochProgress,
    residency: Residency,
    cfg: SamplerConfig,
    opts: &OpenOptions,
) -> Result<Option<Remainder>> {
    let left = progress.unserved();
    let dealt = Holdings::dealt(&left, residency.nodes, cfg.seed, progress.epoch);
    let mine = dealt.node(residency.node);
    let job = node_records(&dealt);
    if job.fewest == 0 {
        return Ok(None);
    }
    let sampler = match Sampler::try_new(mine.len(), job, cfg) {
        Ok(s) if s.steps_per_epoch() > 0 => s,
        _ => return Ok(None),
    };
    let all = Residency { node: 0, nodes: 1 };
    let shards = Dataset::open(data, split, all, opts)?;
    Ok(Some(Remainder {
        dataset: shards.holding(mine, None)?,
        sampler,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::difference;

    fn layout(nodes: usize, ranks: usize, batch: usize, tail: Tail, q: f64) -> Layout {
        Layout {
            nodes,
            ranks_in_node: ranks,
            replicas: 1,
            batch_per_replica: batch,
            tail,
            seed: 9,
            exchange: q,
        }
    }

    /// The global ids each rank's sampler gives over `steps` of `epoch`, every node holding
    /// `held`'s records: the brute force the recomputation is checked against.
    fn brute(held: &Holdings, l: &Layout, epoch: u64, steps: usize) -> Vec<u32> {
        let job = node_records(held);
        let mut out = Vec::new();
        for n in 0..held.nodes() {
            for r in 0..l.ranks_in_node {
                let s = Sampler::new(held.node(n).len(), job, l.sampler_config(r));
                for step in 0..steps {
                    out.extend(s.batch(epoch, step, 0).iter().map(|&i| held.node(n)[i]));
                }
            }
        }
        out
    }

    /// Distinct ids, ascending.
    fn distinct(mut ids: Vec<u32>) -> Vec<u32> {
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Shards that do not divide evenly over the nodes ([13, 9, 11, 12, 8]: 32 and 21 records
    /// at home on 2 nodes): the recomputed set is what the samplers gave at every step, and a
    /// whole epoch's samplers serve every record but fewer than one global step's (Drop), or
    /// every one (Short, Pad).
    #[test]
    fn served_is_what_every_ranks_sampler_gave() {
        let shards = [13u64, 9, 11, 12, 8];
        for (nodes, ranks, batch) in [(1, 1, 4), (2, 1, 3), (2, 2, 2), (3, 2, 1), (5, 1, 2)] {
            for tail in [Tail::Drop, Tail::Short, Tail::Pad] {
                for q in [0.0, 0.5, 1.0] {
                    let l = layout(nodes, ranks, batch, tail, q);
                    let p = Placement::new(&shards, nodes, q, l.seed).unwrap();
                    for epoch in [0, 2] {
                        let held = p.holdings(epoch);
                        let job = node_records(&held);
                        let per_epoch = Sampler::new(held.node(0).len(), job, l.sampler_config(0))
                            .steps_per_epoch();
                        for steps in 0..per_epoch {
                            let got = served(&shards, &l, epoch, steps).unwrap();
                            let want = distinct(brute(&held, &l, epoch, steps));
                            assert_eq!(
                                got.unserved(),
                                difference(&(0..53).collect::<Vec<_>>(), &want)
                            );
                        }
                        let all = distinct(brute(&held, &l, epoch, per_epoch));
                        let global_step = nodes * ranks * batch;
                        let left = 53 - all.len();
                        match tail {
                            Tail::Drop => assert!(left < global_step, "{l:?}: {left} left out"),
                            _ => assert_eq!(left, 0, "{l:?}: {left} never drawn"),
                        }
                        let end = served(&shards, &l, epoch, per_epoch).unwrap();
                        assert_eq!(end.served(), 53, "the end of the epoch counts them all");
                        assert!(served(&shards, &l, epoch, per_epoch + 1).is_err());
                    }
                }
            }
        }
    }

    #[test]
    fn a_remainder_serves_the_rest_once_and_its_own_progress_adds_up() {
        let shards = [13u64, 9, 11, 12, 8];
        let old = layout(2, 2, 3, Tail::Drop, 0.5);
        let before = served(&shards, &old, 1, 2).unwrap();
        for new in [
            layout(1, 1, 3, Tail::Drop, 0.0),
            layout(3, 1, 2, Tail::Short, 0.25),
            layout(2, 2, 2, Tail::Drop, 0.0),
        ] {
            let dealt = Holdings::dealt(&before.unserved(), new.nodes, new.seed, 1);
            let job = node_records(&dealt);
            let steps =
                Sampler::new(dealt.node(0).len(), job, new.sampler_config(0)).steps_per_epoch();
            let all = brute(&dealt, &new, 1, steps);
            let once = distinct(all.clone());
            assert!(once.iter().all(|&id| !before.is_served(u64::from(id))));
            let left = before.unserved().len() - once.len();
            match new.tail {
                Tail::Drop => {
                    assert_eq!(once.len(), all.len(), "a record served twice");
                    let global_step = new.nodes * new.ranks_in_node * new.batch_per_replica;
                    assert!(left < global_step, "{left} left out by {new:?}");
                }
                _ => assert_eq!(left, 0, "{left} never served by {new:?}"),
            }
            for k in 0..steps {
                let after = served_after(&before, &new, k).unwrap();
                assert!(after.resumed);
                let part = distinct(brute(&dealt, &new, 1, k));
                assert_eq!(after.served(), before.served() + part.len() as u64);
                assert!(part.iter().all(|&id| after.is_served(u64::from(id))));
            }
        }
    }

    #[test]
    fn an_evaluation_order_is_refused() {
        let l = layout(1, 1, 2, Tail::Even { steps: 3 }, 0.0);
        assert!(served(&[4, 4], &l, 0, 1).is_err());
    }
}
