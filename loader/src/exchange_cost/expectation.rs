//! The expected exchange at each boundary of a [`Placement`], from the make-up of its cohorts
//! alone (their places on each node, the home nodes of their records): what a plan gives for
//! the boundaries it does not count, in time independent of the records and of the epoch.
//!
//! A cohort dealt anew puts each of its records on node `j` with probability `p_j = s_j / m`
//! (`s_j` its places on `j`, `m` its records). Node `j` receives a record that lands on it,
//! was not on it before and is not its own. The first time a cohort is dealt its records
//! leave their epoch-0 places, known; later they leave places as random as the new ones.

use crate::placement::Placement;

/// The make-up of a placement's cohorts; see the module documentation.
#[derive(Clone, Debug)]
pub struct Expectation {
    cohorts: Vec<Census>,
}

/// One cohort: per node (index), as floating counts.
#[derive(Clone, Debug)]
struct Census {
    /// Its records.
    len: f64,
    /// Its places on each node.
    places: Vec<f64>,
    /// Its records of each home node.
    home: Vec<f64>,
    /// Its records epoch 0 holds on their home node, per node.
    kept: Vec<f64>,
    /// Per home node: for each of its records epoch 0 holds elsewhere, the places of that
    /// node, summed.
    away: Vec<f64>,
}

/// The expected exchange into one epoch, per node.
#[derive(Clone, Debug, PartialEq)]
pub struct ExpectedExchange {
    /// Records each node receives.
    pub records_in: Vec<f64>,
    /// Records each node sends.
    pub records_out: Vec<f64>,
    /// Records of other nodes' shards each node holds in the epoch.
    pub held_foreign: Vec<f64>,
}

impl Expectation {
    /// The census of `placement`'s cohorts (linear in the records).
    pub fn new(placement: &Placement) -> Expectation {
        let nodes = placement.nodes();
        let base = placement.epoch_zero();
        let cohorts = (0..placement.cohort_count())
            .map(|c| {
                let (members, places) = placement.cohort(c, &base);
                let mut census = Census {
                    len: members.len() as f64,
                    places: vec![0.0; nodes],
                    home: vec![0.0; nodes],
                    kept: vec![0.0; nodes],
                    away: vec![0.0; nodes],
                };
                for &n in &places {
                    census.places[n as usize] += 1.0;
                }
                for (&id, &n) in members.iter().zip(&places) {
                    let home = placement.home(id);
                    census.home[home] += 1.0;
                    if home == n as usize {
                        census.kept[home] += 1.0;
                    } else {
                        census.away[home] += census.places[n as usize];
                    }
                }
                census
            })
            .collect();
        Expectation { cohorts }
    }

    /// The expected exchange into `epoch` of `placement` (the one this census is of).
    pub fn into_epoch(&self, placement: &Placement, epoch: u64) -> ExpectedExchange {
        let nodes = placement.nodes();
        let mut e = ExpectedExchange {
            records_in: vec![0.0; nodes],
            records_out: vec![0.0; nodes],
            held_foreign: vec![0.0; nodes],
        };
        for (c, first) in placement.redeals_into(epoch) {
            self.cohorts[c].add_deal(first, &mut e);
        }
        for (c, census) in self.cohorts.iter().enumerate() {
            let dealt = placement.dealt_before(c, epoch);
            for j in 0..nodes {
                e.held_foreign[j] += census.places[j]
                    - match dealt {
                        true => census.places[j] * census.home[j] / census.len,
                        false => census.kept[j],
                    };
            }
        }
        e
    }
}

impl Census {
    /// Adds to `e` what dealing this cohort anew moves (`first`: from its epoch-0 places).
    fn add_deal(&self, first: bool, e: &mut ExpectedExchange) {
        let m = self.len;
        if m == 0.0 {
            return;
        }
        let p: Vec<f64> = self.places.iter().map(|s| s / m).collect();
        // A record lands on j, having been elsewhere: p_j (1 - p_j), summed over the nodes.
        let moves: f64 = p.iter().map(|p| p * (1.0 - p)).sum();
        for (j, &pj) in p.iter().enumerate() {
            if first {
                // Lands on j from a place not on j, not home to j.
                let neither = m - self.home[j] - self.places[j] + self.kept[j];
                e.records_in[j] += pj * neither;
                e.records_out[j] += self.home[j] * (1.0 - pj) - self.away[j] / m;
            } else {
                e.records_in[j] += (m - self.home[j]) * pj * (1.0 - pj);
                e.records_out[j] += self.home[j] * (moves - pj * (1.0 - pj));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange_cost::exchange_cost;

    /// The expectation against the mean of exact counts over many seeds, on shards that do
    /// not divide evenly (some records held away from home in epoch 0).
    #[test]
    fn the_expectation_is_the_mean_of_the_counts() {
        let shards = [30u64, 22, 27, 25, 19];
        let seeds = 400;
        for (nodes, q) in [(2, 0.5), (3, 0.25), (3, 1.0)] {
            for epoch in [1, 2, 6] {
                let p = Placement::new(&shards, nodes, q, 0).unwrap();
                let want = Expectation::new(&p).into_epoch(&p, epoch);
                let (mut into, mut out, mut foreign) =
                    (vec![0.0; nodes], vec![0.0; nodes], vec![0.0; nodes]);
                for seed in 0..seeds {
                    let p = Placement::new(&shards, nodes, q, seed).unwrap();
                    let c = exchange_cost(&p, epoch, 1.0);
                    for n in 0..nodes {
                        into[n] += c.records_in[n] as f64 / seeds as f64;
                        out[n] += c.records_out[n] as f64 / seeds as f64;
                        foreign[n] += c.held_foreign[n] as f64 / seeds as f64;
                    }
                }
                let close =
                    |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(a, b)| (a - b).abs() < 1.0);
                let at = format!("{nodes} nodes, Q {q}, epoch {epoch}");
                assert!(close(&into, &want.records_in), "{at}: {into:?} {want:?}");
                assert!(close(&out, &want.records_out), "{at}: {out:?} {want:?}");
                assert!(
                    close(&foreign, &want.held_foreign),
                    "{at}: {foreign:?} {want:?}"
                );
            }
        }
    }
}
