//! Online tuning of `auto`: at each size class the first calls try the candidates, taking
//! turns, and the ranks keep the fastest.
//!
//! A cost model guesses; the machine in front of the user decides (a 2-vCPU VM and a 16-core
//! host rank the algorithms differently, and users do not run `ddl-bench calibrate` before
//! their first job). The candidates take turns: call `i` of a round runs candidate `i % k`, so
//! every rank runs the same candidate for the same call without talking. Two rounds of one
//! call each end in a tiny ring allreduce of the times: after the first, the candidates over
//! [`FIRST_PRUNE`] times the fastest stop (one call of a candidate 100x slower than the best
//! can cost a training step), and so do those over [`PRUNE`] times the fastest whose one call
//! already took longer than [`PROBE_BUDGET`] (a second call of them would cost more than the
//! whole race of the others); after the second, those whose faster call is over [`PRUNE`]
//! times the fastest's. The rest race for as many rounds as [`RACE_BUDGET`] pays for at their
//! scouting times, up to [`MAX_RACE_CALLS`] ([`race_rounds`]: more calls where calls are
//! cheap, so that a few calls that lost their core on a shared host cannot decide), and after a last tiny allreduce every rank
//! keeps the candidate of the smallest median (the first of equals). The ranks start every
//! trial call together, and a call's time is the longest any rank spent in it
//! ([`call_times`]). The allreduce's sums are exact and bitwise identical on all ranks, so the
//! choice (and the number of rounds) is the same on every rank, however differently they
//! timed the calls. Training buckets repeat every step, so the tuning costs a few steps, once.

use std::collections::HashMap;

use crate::algorithm::Algorithm;
use crate::cost::MeasuredCurve;
use crate::error::Result;
use crate::topology::Topology;
use crate::transport::Transport;

/// Rounds of one call per candidate before the race, each followed by pruning.
const SCOUTS: usize = 2;

/// A candidate goes on after the first round if its call took at most this factor of the
/// fastest's: on a busy host one call of the best can lose its core and take 20x its usual
/// time, while the worst candidates take 100x (`mpi` under `--oversubscribe`).
pub const FIRST_PRUNE: f64 = 30.0;

/// A candidate goes on to the race after the second round if the faster of its two calls is
/// within this factor of the fastest's.
pub const PRUNE: f64 = 3.0;

/// A candidate whose first call took longer than this (seconds) goes on only if it was
/// within [`PRUNE`] of the fastest: a second call of a slow candidate (`mpi` under
/// `--oversubscribe`) would be most of the tuning's cost (BENCHMARKS.md, "Figures behind the
/// defaults").
pub const PROBE_BUDGET: f64 = 10e-3;

/// Seconds of calls the race may spend, all racing candidates together, when that buys more
/// than [`MIN_ROUNDS`] rounds ([`race_rounds`]).
pub const RACE_BUDGET: f64 = 5e-3;

/// Fewest rounds of the race: the median of three calls outvotes one that lost its core.
pub const MIN_ROUNDS: usize = 3;

/// Most calls of the race, all racing candidates together, where calls take microseconds: a
/// training step makes one call of each bucket, so the race lasts that many steps.
pub const MAX_RACE_CALLS: usize = 16;

/// The size class of a call of `bytes`: the size rounded up to a power of two. Calls of one
/// class share one tuning.
pub fn class_of(bytes: usize) -> usize {
    bytes.max(1).next_power_of_two()
}

/// What the ranks agreed on at one size class.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    /// The size of the class's first call, in bytes (of f32).
    pub bytes: usize,
    /// The candidate with the smallest time.
    pub algorithm: Algorithm,
    /// Every candidate with its time per call ([`estimate`] of the calls' times on the
    /// slowest rank), seconds.
    pub timings: Vec<(Algorithm, f64)>,
    /// Seconds the trial calls took beyond what the chosen algorithm would have taken for
    /// them (on the slowest rank of each call): the price of the tuning.
    pub cost: f64,
}

/// Where a size class stands.
#[derive(Clone, Debug)]
enum State {
    /// Candidates taking turns: call `i` of a round runs `candidates[racing[i % r]]`;
    /// `times[c]` holds what candidate `c`'s calls took on this rank, seconds.
    Trying {
        bytes: usize,
        candidates: Vec<Algorithm>,
        /// The candidates in the race: all of them in the first round, then the survivors.
        racing: Vec<usize>,
        /// Rounds of one call each that are over (and pruned after): 0, 1 or 2 (the race).
        stage: usize,
        /// Rounds of the race ([`race_rounds`], set when it starts).
        rounds: usize,
        /// Calls made since the race was last pruned (or started).
        calls: usize,
        times: Vec<Vec<f64>>,
    },
    /// The ranks agreed.
    Chosen(Choice),
}

/// What the next call of a size class runs.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Plan {
    /// The class's agreed algorithm.
    Chosen(Algorithm),
    /// Trial call: the candidate whose turn it is (its time goes to [`Tuner::record`]).
    Trial(Algorithm),
}

/// The tuning of one [`super::Allreducer`]: one state per (size class, shared memory found).
#[derive(Debug, Default)]
pub(crate) struct Tuner {
    classes: HashMap<(usize, bool), State>,
    /// Choices made since [`Tuner::take_fresh`] last ran.
    fresh: Vec<Choice>,
}

/// Candidates that run the same code as an earlier one here: multiring over a single tier is
/// the ring, so trying both only doubles the cost.
pub(crate) fn distinct(candidates: Vec<Algorithm>, topology: Topology) -> Vec<Algorithm> {
    let tiers = topology.dims().iter().filter(|&&d| d > 1).count();
    candidates
        .into_iter()
        .filter(|a| !(tiers <= 1 && matches!(a, Algorithm::Multiring(m) if m.dims.is_empty())))
        .collect()
}

impl Tuner {
    /// What the next call of `bytes` runs (`shared`: whether shared memory was found);
    /// `candidates` gives the class's candidates the first time it is seen.
    pub(crate) fn plan(
        &mut self,
        bytes: usize,
        shared: bool,
        candidates: impl FnOnce() -> Vec<Algorithm>,
    ) -> Plan {
        let state = self
            .classes
            .entry((class_of(bytes), shared))
            .or_insert_with(|| {
                let candidates = candidates();
                State::Trying {
                    bytes,
                    times: vec![Vec::new(); candidates.len()],
                    racing: (0..candidates.len()).collect(),
                    stage: 0,
                    rounds: MIN_ROUNDS,
                    candidates,
                    calls: 0,
                }
            });
        match state {
            State::Chosen(c) => Plan::Chosen(c.algorithm.clone()),
            State::Trying {
                candidates,
                racing,
                calls,
                ..
            } => Plan::Trial(candidates[racing[*calls % racing.len()]].clone()),
        }
    }

    /// The agreed algorithm of the class of `bytes`, if the ranks have agreed.
    pub(crate) fn chosen(&self, bytes: usize, shared: bool) -> Option<&Choice> {
        match self.classes.get(&(class_of(bytes), shared)) {
            Some(State::Chosen(c)) => Some(c),
            _ => None,
        }
    }

    /// Records that the trial call of `bytes` just made took `seconds` on this rank; `true`
    /// when it ended a stage (one of the first two rounds, or the race), so that the ranks must now
    /// [`Tuner::agree`].
    pub(crate) fn record(&mut self, bytes: usize, shared: bool, seconds: f64) -> bool {
        let Some(State::Trying {
            racing,
            stage,
            rounds,
            calls,
            times,
            ..
        }) = self.classes.get_mut(&(class_of(bytes), shared))
        else {
            return false;
        };
        times[racing[*calls % racing.len()]].push(seconds);
        *calls += 1;
        *calls == racing.len() * if *stage == SCOUTS { *rounds } else { 1 }
    }

    /// Collective over `t` (every rank calls it after the same trial call): the ranks share
    /// their calls' times ([`call_times`]). After each of the first two rounds it prunes the race (and
    /// settles it if one candidate is left), after the last it keeps the fastest
    /// ([`settle`]). Returns the choice once made, also kept for [`Tuner::take_fresh`].
    pub(crate) fn agree(
        &mut self,
        t: &dyn Transport,
        bytes: usize,
        shared: bool,
    ) -> Result<Option<Choice>> {
        let key = (class_of(bytes), shared);
        let Some(State::Trying {
            bytes: first,
            candidates,
            racing,
            stage,
            rounds,
            calls,
            times,
        }) = self.classes.get_mut(&key)
        else {
            unreachable!("agree follows a trial call that ended a stage");
        };
        let calls_of = call_times(t, times)?;
        let estimate: Vec<f64> = calls_of.iter().map(|v| estimate(v)).collect();
        if *stage < SCOUTS {
            let best = racing
                .iter()
                .map(|&c| estimate[c])
                .fold(f64::INFINITY, f64::min);
            let first = *stage == 0;
            racing.retain(|&c| {
                let factor = if first && estimate[c] <= PROBE_BUDGET {
                    FIRST_PRUNE
                } else {
                    PRUNE
                };
                estimate[c] <= factor * best
            });
            (*stage, *calls) = (*stage + 1, 0);
            *rounds = race_rounds(racing.iter().map(|&c| estimate[c]));
            if racing.len() > 1 {
                return Ok(None);
            }
        }
        let choice = settle(*first, candidates, &calls_of, &estimate);
        self.classes.insert(key, State::Chosen(choice.clone()));
        self.fresh.push(choice.clone());
        Ok(Some(choice))
    }

    /// The choices made since the last call (each is handed out once: for logging).
    pub(crate) fn take_fresh(&mut self) -> Vec<Choice> {
        std::mem::take(&mut self.fresh)
    }

    /// Every choice made, as measured curves of `topology`'s layout: one point per class and
    /// candidate, so that a saved model chooses as the tuning did.
    pub(crate) fn curves(&self, topology: Topology) -> Vec<MeasuredCurve> {
        let mut curves: Vec<MeasuredCurve> = Vec::new();
        let mut chosen: Vec<&Choice> = self
            .classes
            .values()
            .filter_map(|s| match s {
                State::Chosen(c) => Some(c),
                State::Trying { .. } => None,
            })
            .collect();
        chosen.sort_by_key(|c| c.bytes);
        for c in chosen {
            for (a, secs) in &c.timings {
                let name = a.to_string();
                let at = match curves.iter().position(|m| m.algorithm == name) {
                    Some(i) => i,
                    None => {
                        curves.push(MeasuredCurve {
                            algorithm: name,
                            nodes: topology.nodes,
                            ranks_per_node: topology.ranks_per_node,
                            points: Vec::new(),
                        });
                        curves.len() - 1
                    }
                };
                curves[at].points.push((c.bytes, *secs));
            }
        }
        curves
    }
}

/// Collective over `t`: every trial call's time on the rank that took the longest for it, per
/// candidate, the same on every rank. The ranks start each trial call together (after its
/// call check, run on its own), so that is how long the call kept them: otherwise every call held
/// the wait for the last rank to arrive (in training, for its backward), which says nothing
/// about the algorithm, and the time of the last to arrive flattered the algorithms that let
/// the others work ahead. The ranks' times travel through one ring allreduce of a table with
/// one row per rank, zeros but in its own row: exact sums, so every rank reads the same table.
fn call_times(t: &dyn Transport, times: &[Vec<f64>]) -> Result<Vec<Vec<f64>>> {
    let mine: Vec<f32> = times.iter().flatten().map(|s| *s as f32).collect();
    let len = mine.len();
    let mut table = vec![0f32; len * t.size()];
    table[t.rank() * len..][..len].copy_from_slice(&mine);
    let (mut recv, mut steps) = (Vec::new(), Vec::new());
    super::ring::multiring(t, &[t.size()], 1, &mut table, &mut recv, &mut steps)?;
    let mut longest = (0..len).map(|i| {
        (0..t.size())
            .map(|r| f64::from(table[r * len + i]))
            .fold(0.0, f64::max)
    });
    Ok(times
        .iter()
        .map(|v| longest.by_ref().take(v.len()).collect())
        .collect())
}

/// A candidate's time per call from its calls: the median of the race's, or the fastest of
/// its first calls (a call that lost its core, or set up buffers, is not the candidate's).
fn estimate(calls: &[f64]) -> f64 {
    match calls.get(SCOUTS..).filter(|r| !r.is_empty()) {
        Some(race) => median(race),
        None => calls.iter().copied().fold(f64::INFINITY, f64::min),
    }
}

/// Rounds of the race among candidates whose calls take `estimates` (seconds, the same on
/// every rank): as many as [`RACE_BUDGET`] pays for and [`MAX_RACE_CALLS`] allows, at least
/// [`MIN_ROUNDS`].
fn race_rounds(estimates: impl Iterator<Item = f64>) -> usize {
    let (racing, round) = estimates.fold((0usize, 0.0), |(n, sum), e| (n + 1, sum + e));
    let affordable = (RACE_BUDGET / round.max(f64::MIN_POSITIVE)).min(1e6) as usize;
    affordable
        .min(MAX_RACE_CALLS / racing.max(1))
        .max(MIN_ROUNDS)
}

/// The choice: the candidate of the smallest `estimate` (the first of equals; a candidate
/// dropped after one call keeps that call's time), with what the trial `calls` cost beyond the
/// mean of its own trial calls: they ran in the same stretch as the others, so a call that
/// lost its core to the host's other work is not the tuning's price.
fn settle(bytes: usize, candidates: &[Algorithm], calls: &[Vec<f64>], estimate: &[f64]) -> Choice {
    let mut best = 0;
    for (c, e) in estimate.iter().enumerate() {
        if *e < estimate[best] {
            best = c;
        }
    }
    let spent: f64 = calls.iter().flatten().sum();
    let made: usize = calls.iter().map(Vec::len).sum();
    let kept = calls[best].iter().sum::<f64>() / calls[best].len().max(1) as f64;
    Choice {
        bytes,
        algorithm: candidates[best].clone(),
        timings: candidates
            .iter()
            .cloned()
            .zip(estimate.iter().copied())
            .collect(),
        cost: (spent - made as f64 * kept).max(0.0),
    }
}

/// Median of `v` (0 when empty).
fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::thread::thread_group;

    fn candidates() -> Vec<Algorithm> {
        vec![Algorithm::Ring, Algorithm::Rhd, Algorithm::SHM]
    }

    /// Runs one class's trials on every rank of a thread group with the times `time(rank,
    /// candidate)` and returns each rank's choice.
    fn tune(
        ranks: usize,
        time: impl Fn(usize, usize) -> f64 + Send + Sync + 'static,
    ) -> Vec<Choice> {
        let time = Arc::new(time);
        let handles: Vec<_> = thread_group(ranks)
            .into_iter()
            .enumerate()
            .map(|(r, t)| {
                let time = time.clone();
                std::thread::spawn(move || {
                    let mut tuner = Tuner::default();
                    let bytes = 3 << 20;
                    loop {
                        let Plan::Trial(a) = tuner.plan(bytes, true, candidates) else {
                            panic!("rank {r}: the class was chosen without agreement");
                        };
                        let c = candidates().iter().position(|x| *x == a).unwrap();
                        if tuner.record(bytes, true, time(r, c)) {
                            if let Some(choice) = tuner.agree(&t, bytes, true).expect("agree") {
                                return choice;
                            }
                        }
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn ranks_that_timed_differently_agree_on_one_algorithm() {
        // Rank 0 finds the ring fastest, ranks 1 and 2 shm; rhd kept every rank for the
        // shortest time, and every rank keeps it.
        let table = [[1.0, 5.0, 9.0], [6.0, 2.0, 1.5], [7.0, 4.0, 3.0]];
        let choices = tune(3, move |r, c| table[r][c] * 1e-3);
        for (r, c) in choices.iter().enumerate() {
            assert_eq!(c.algorithm, Algorithm::Rhd, "rank {r}: {c:?}");
            assert_eq!(c, &choices[0], "rank {r} agrees with rank 0");
        }
        let times: Vec<f64> = choices[0].timings.iter().map(|(_, s)| *s).collect();
        assert!((times[0] - 7e-3).abs() < 1e-9, "{times:?}");
        assert!((times[1] - 5e-3).abs() < 1e-9, "{times:?}");
    }

    #[test]
    fn the_slowest_stop_after_one_call_and_the_race_decides_on_the_calls_after_two() {
        // Per rank: the ring's first call is slow (cold buffers) and it is fastest after; rhd
        // takes 50x the best and stops after one call.
        let calls = std::sync::Mutex::new(vec![0usize; 2 * 3]);
        let choices = tune(2, move |r, c| {
            let mut calls = calls.lock().unwrap();
            calls[r * 3 + c] += 1;
            let first = calls[r * 3 + c] == 1;
            assert!(
                c != 1 || first,
                "rank {r}: rhd ran again after the first round"
            );
            match (c, first) {
                (0, true) => 2e-3,
                (0, false) => 1e-3,
                (1, _) => 100e-3,
                _ => 1.5e-3,
            }
        });
        assert_eq!(choices[0].algorithm, Algorithm::Ring);
        let times: Vec<f64> = choices[0].timings.iter().map(|(_, s)| *s).collect();
        assert!((times[1] - 100e-3).abs() < 1e-6, "{times:?}");
        assert!((times[2] - 1.5e-3).abs() < 1e-6, "{times:?}");
        // 11 calls per rank (3, 2, then 3 rounds of 2) took 113.5 ms where 11 ring calls take
        // 13.2 at the ring's mean over its own 5 trial calls (its cold first call included).
        assert!(
            (choices[0].cost - 100.3e-3).abs() < 1e-6,
            "{:?}",
            choices[0]
        );
    }

    /// Per rank, the calls each candidate made, in order, and the choice, for candidates
    /// whose `n`th call (from 0) takes `time(candidate, n)` on every rank.
    fn tune_counted(
        ranks: usize,
        time: impl Fn(usize, usize) -> f64 + Send + Sync + 'static,
    ) -> (Vec<usize>, Choice) {
        let calls = Arc::new(std::sync::Mutex::new(vec![0usize; ranks * 3]));
        let counted = Arc::clone(&calls);
        let choices = tune(ranks, move |r, c| {
            let mut calls = counted.lock().unwrap();
            calls[r * 3 + c] += 1;
            time(c, calls[r * 3 + c] - 1)
        });
        let calls = calls.lock().unwrap().clone();
        for r in 1..ranks {
            assert_eq!(calls[r * 3..][..3], calls[..3], "rank {r} made other calls");
            assert_eq!(choices[r], choices[0], "rank {r} chose otherwise");
        }
        (calls[..3].to_vec(), choices[0].clone())
    }

    #[test]
    fn two_calls_of_the_best_that_lost_their_core_do_not_decide_where_calls_are_cheap() {
        // shm takes 10 us, but its first two race calls lost the core (300 us); rhd 25 us
        // throughout; the ring (200 us) is pruned after scouting. Three rounds of the race
        // (shm's median of [300, 300, 10]) kept rhd; now the race runs the rounds that
        // RACE_BUDGET pays for, at most MAX_RACE_CALLS calls (8 rounds of 2).
        let (calls, choice) = tune_counted(2, |c, n| match (c, n) {
            (0, _) => 200e-6,
            (1, _) => 25e-6,
            (_, 2 | 3) => 300e-6,
            _ => 10e-6,
        });
        assert_eq!(choice.algorithm, Algorithm::SHM, "{choice:?}");
        assert_eq!(
            calls,
            vec![2, 2 + MAX_RACE_CALLS / 2, 2 + MAX_RACE_CALLS / 2]
        );
    }

    #[test]
    fn a_candidate_whose_first_call_overran_the_probe_budget_is_not_called_again() {
        // rhd's first call takes 20 ms, 20x shm's 1 ms: within FIRST_PRUNE, but a second call
        // would cost more than the race; it stops after one. Calls of 1-2 ms race 3 rounds.
        let (calls, choice) = tune_counted(2, |c, _| [2e-3, 20e-3, 1e-3][c]);
        assert_eq!(choice.algorithm, Algorithm::SHM, "{choice:?}");
        assert_eq!(calls, vec![2 + MIN_ROUNDS, 1, 2 + MIN_ROUNDS]);
    }

    #[test]
    fn curves_hold_every_candidate_at_every_tuned_size() {
        let mut tuner = Tuner::default();
        tuner.classes.insert(
            (4096, true),
            State::Chosen(Choice {
                bytes: 4000,
                algorithm: Algorithm::Ring,
                timings: vec![(Algorithm::Ring, 1e-5), (Algorithm::SHM, 2e-5)],
                cost: 0.0,
            }),
        );
        let curves = tuner.curves(Topology::flat(2));
        assert_eq!(curves.len(), 2);
        assert_eq!(curves[1].algorithm, "shm");
        assert_eq!(curves[1].points, vec![(4000, 2e-5)]);
    }

    #[test]
    fn multiring_over_one_tier_is_not_tried_twice() {
        let multiring = Algorithm::Multiring(Default::default());
        let all = vec![Algorithm::Ring, multiring.clone()];
        assert_eq!(
            distinct(all.clone(), Topology::flat(4)),
            vec![Algorithm::Ring]
        );
        assert_eq!(distinct(all.clone(), Topology::new(2, 2)), all);
    }
}
