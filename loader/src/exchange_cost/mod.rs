//! What the record exchange of [`crate::placement`] sends between nodes at each epoch
//! boundary: counted exactly from a [`Placement`] ([`exchange_cost`]) or expected
//! ([`expected`], [`Expectation`]), and a run's plan of it ([`plan`]) as `ddl-plan` and
//! `ddl-bench sim` print it.
//!
//! Going from epoch `e - 1` to `e`, node `n` must hold `H_e(n)`. It serves the records of its
//! own shards (its home records) from its mapped shards and keeps the other records it held in
//! `e - 1` (its arena); every other record `r` is sent to it by `r`'s home node. So node `n`
//! receives the records of `H_e(n) \ H_{e-1}(n)` whose home is not `n`, and a run resumed at
//! epoch `e`, without an arena yet, receives every record of `H_e(n)` whose home is not `n`.
//!
//! Expected counts, with `P` nodes of `h` records each: the boundary into `e` deals a share
//! `Q` of every node's records anew ([`crate::placement`]'s cohorts), a record landing on each
//! node with probability `1 / P`. In the first `1 / Q` epochs every cohort dealt leaves its
//! home places, so a node receives `Q h (P - 1) / P` records; later the places a cohort leaves
//! are themselves random, and a node receives `Q h ((P - 1) / P)^2`. A run resumed at `e`
//! receives `h r (P - 1) / P`, `r = min(1, e Q)` the share of the records dealt anew by then.

use std::fmt::Write;
use std::path::Path;

mod expectation;
pub use expectation::{Expectation, ExpectedExchange};

use serde::Serialize;

use crate::error::{LoaderError, Result};
use crate::manifest::{Manifest, MANIFEST_FILE};
use crate::placement::{Holdings, Placement};
use crate::units::{GIB, MIB};

/// What the exchange into one epoch moves, per node, counted exactly.
///
/// # Examples
///
/// A global shuffle (`Q = 1`) of two nodes: whatever node 0 receives, node 1 sends.
///
/// ```
/// use ddl_loader::exchange_cost::exchange_cost;
/// use ddl_loader::placement::Placement;
///
/// let placement = Placement::new(&[500, 500], 2, 1.0, 7)?;
/// let cost = exchange_cost(&placement, 1, 110_000.0);
/// assert_eq!(cost.records_in[0], cost.records_out[1]);
/// assert!(cost.records_in[0] > 200 && cost.records_in[0] < 300);
/// let busiest = cost.records_in.iter().max().copied().unwrap();
/// assert_eq!(cost.busiest_in_bytes(), busiest as f64 * 110_000.0);
/// # Ok::<(), ddl_loader::LoaderError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct ExchangeCost {
    /// The epoch the nodes enter.
    pub epoch: u64,
    /// Records each node receives over the network.
    pub records_in: Vec<u64>,
    /// Records each node sends: its home records that another node holds in `epoch` and did
    /// not hold in the epoch before.
    pub records_out: Vec<u64>,
    /// Records of other nodes' shards each node holds in `epoch` (its arena): what a run
    /// resumed at `epoch` receives.
    pub held_foreign: Vec<u64>,
    /// Bytes of one record (an average).
    pub record_bytes: f64,
}

/// The exchange into `epoch` under `placement` (nothing moves between epochs into epoch 0),
/// with records of `record_bytes` bytes: from the holdings of `epoch - 1` and `epoch`, linear
/// in the records.
pub fn exchange_cost(placement: &Placement, epoch: u64, record_bytes: f64) -> ExchangeCost {
    let before = placement.holdings(epoch.saturating_sub(1));
    if epoch == 0 {
        return ExchangeCost::between(placement, &before, &before, record_bytes);
    }
    let after = placement.holdings(epoch);
    ExchangeCost::between(placement, &before, &after, record_bytes)
}

impl ExchangeCost {
    /// What moves to go from the holdings `before` to `after` (those of the next epoch).
    pub fn between(
        placement: &Placement,
        before: &Holdings,
        after: &Holdings,
        record_bytes: f64,
    ) -> ExchangeCost {
        ExchangeCost::count(placement, Some(before), after, record_bytes)
    }

    /// What a run resumed at `holdings.epoch()` receives: every record of another node's
    /// shards that a node holds (its arena is not there yet).
    pub fn resume(placement: &Placement, holdings: &Holdings, record_bytes: f64) -> ExchangeCost {
        ExchangeCost::count(placement, None, holdings, record_bytes)
    }

    /// The records of `after` that a node must receive, having held `before` (nothing but its
    /// own shards when `None`).
    fn count(
        placement: &Placement,
        before: Option<&Holdings>,
        after: &Holdings,
        record_bytes: f64,
    ) -> ExchangeCost {
        let nodes = after.nodes();
        let mut cost = ExchangeCost {
            epoch: after.epoch(),
            records_in: vec![0; nodes],
            records_out: vec![0; nodes],
            held_foreign: vec![0; nodes],
            record_bytes,
        };
        for n in 0..nodes {
            let mut had = before.map_or(&[][..], |b| b.node(n)).iter().peekable();
            for &id in after.node(n) {
                while had.next_if(|&&x| x < id).is_some() {}
                let home = placement.home(id);
                if home == n {
                    continue;
                }
                cost.held_foreign[n] += 1;
                if had.next_if_eq(&&id).is_none() {
                    cost.records_in[n] += 1;
                    cost.records_out[home] += 1;
                }
            }
        }
        cost
    }

    /// Records sent over the network, all nodes together.
    pub fn records(&self) -> u64 {
        self.records_in.iter().sum()
    }

    /// Bytes into the node that receives the most.
    pub fn busiest_in_bytes(&self) -> f64 {
        self.records_in.iter().max().copied().unwrap_or(0) as f64 * self.record_bytes
    }

    /// Bytes out of the node that sends the most.
    pub fn busiest_out_bytes(&self) -> f64 {
        self.records_out.iter().max().copied().unwrap_or(0) as f64 * self.record_bytes
    }

    /// Bytes sent over the network, all nodes together.
    pub fn total_bytes(&self) -> f64 {
        self.records() as f64 * self.record_bytes
    }

    /// Bytes a resume at this epoch sends into the node that receives the most.
    pub fn busiest_resume_bytes(&self) -> f64 {
        self.held_foreign.iter().max().copied().unwrap_or(0) as f64 * self.record_bytes
    }
}

/// The expected records per node of an exchange into one epoch ([`expected`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Expected {
    /// Records a node receives over the network (and sends: every node alike).
    pub records_in: f64,
    /// Records of other nodes' shards a node holds in the epoch (what a resume receives).
    pub held_foreign: f64,
}

/// The expected exchange into `epoch` of `records` records spread evenly over `nodes` nodes
/// exchanging a fraction `fraction` (the module documentation derives it).
pub fn expected(records: u64, nodes: usize, fraction: f64, epoch: u64) -> Expected {
    let p = nodes.max(1) as f64;
    let h = records as f64 / p;
    let away = (p - 1.0) / p;
    let dealt = |e: u64| (e as f64 * fraction).min(1.0);
    let records_in = match epoch {
        0 => 0.0,
        e => {
            let first = dealt(e) - dealt(e - 1);
            h * (first * away + (fraction - first) * away * away)
        }
    };
    Expected {
        records_in,
        held_foreign: h * dealt(epoch) * away,
    }
}

/// A split's records: the records of each shard (counted exactly), or only their number
/// (expected, as if every node held as many).
#[derive(Clone, Debug, PartialEq)]
pub enum SplitRecords {
    /// Records per shard, in split order (from a manifest).
    Shards(Vec<u64>),
    /// Records of the split.
    Total(u64),
}

impl SplitRecords {
    /// The records per shard of the split `split` of the packed dataset in `dir` (from its
    /// manifest), and the average bytes of a record: the shards' bytes over their records.
    ///
    /// Fails when the manifest cannot be read, has no such split, or the split no records.
    pub fn of_manifest(dir: &Path, split: &str) -> Result<(SplitRecords, f64)> {
        let manifest = Manifest::load(dir)?;
        let info = manifest.split(dir, split)?;
        if info.records == 0 {
            return Err(LoaderError::Manifest {
                path: dir.join(MANIFEST_FILE),
                reason: format!("split {split:?} has no records to exchange"),
            });
        }
        let bytes: u64 = info.shards.iter().map(|s| s.bytes).sum();
        let shards = info.shards.iter().map(|s| s.records).collect();
        Ok((
            SplitRecords::Shards(shards),
            bytes as f64 / info.records as f64,
        ))
    }

    /// Records of the split.
    pub fn total(&self) -> u64 {
        match self {
            SplitRecords::Shards(s) => s.iter().sum(),
            SplitRecords::Total(n) => *n,
        }
    }
}

/// How long an epoch takes, and for how much of it the node links are free for the exchange.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EpochTime {
    /// Seconds of one epoch.
    pub seconds: f64,
    /// Seconds of it the busiest node's link is not carrying the allreduce (at most `seconds`).
    pub link_spare_s: f64,
}

/// What a run's exchange is planned for.
#[derive(Clone, Debug, PartialEq)]
pub struct ExchangeSetup {
    /// Fraction of every node's records exchanged at each epoch boundary (ddl-train's
    /// `--exchange`).
    pub fraction: f64,
    /// Nodes.
    pub nodes: usize,
    /// The split's records.
    pub records: SplitRecords,
    /// Bytes of one record (an average).
    pub record_bytes: f64,
    /// The placement's seed.
    pub seed: u64,
    /// Bytes per second of each node's link, each way.
    pub link_bytes_per_s: f64,
    /// Epochs of the run: the boundaries into epochs 1 to `epochs - 1` are planned.
    pub epochs: u64,
    /// The epoch's time, when known.
    pub epoch_time: Option<EpochTime>,
}

/// One epoch boundary of a plan.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Boundary {
    /// The epoch entered.
    pub epoch: u64,
    /// Records sent over the network, all nodes together.
    pub records: f64,
    /// Bytes into the node that receives the most.
    pub busiest_in_bytes: f64,
    /// Bytes out of the node that sends the most.
    pub busiest_out_bytes: f64,
    /// Bytes over the network, all nodes together.
    pub total_bytes: f64,
    /// Seconds the busiest link takes at the setup's speed: its bytes in or out, whichever are
    /// more (a link carries both ways at once).
    pub link_s: f64,
    /// Bytes into the busiest node of a run resumed at `epoch`.
    pub resume_bytes: f64,
    /// Whether the exchange into `epoch` fits in the link's spare time of the epoch before,
    /// when the epoch's time is known.
    pub fits: Option<bool>,
    /// Counted on the placement (else expected).
    pub counted: bool,
}

/// A run's exchange, boundary by boundary.
#[derive(Clone, Debug, PartialEq)]
pub struct ExchangePlan {
    /// What it is planned for.
    pub setup: ExchangeSetup,
    /// Counted from the placement (the shards' records were known), or expected.
    pub exact: bool,
    /// Records held away from their home node in every epoch to even the nodes out (they
    /// move once, into epoch 0).
    pub evened: usize,
    /// The boundaries into epochs 1 to `epochs - 1`, in order.
    pub boundaries: Vec<Boundary>,
}

/// Plans the exchange of `setup`. With the shards' records known, the boundaries the table
/// shows (the first [`LISTED`] and the last) are counted on the placement and the others are
/// its [`Expectation`]: linear in the records whatever the epochs. Otherwise every boundary is
/// [`expected`].
///
/// Fails when the fraction is outside `[0, 1]`, there are no nodes (or, with shards, more
/// nodes than shards), or the record size or link speed is not positive.
pub fn plan(setup: &ExchangeSetup) -> Result<ExchangePlan> {
    let invalid = |why: String| Err(LoaderError::InvalidConfig(format!("exchange: {why}")));
    if !(0.0..=1.0).contains(&setup.fraction) {
        return invalid(format!("fraction {} is outside [0, 1]", setup.fraction));
    }
    if setup.nodes == 0 {
        return invalid("no nodes".into());
    }
    for (what, v) in [
        ("record size", setup.record_bytes),
        ("link speed", setup.link_bytes_per_s),
    ] {
        if !(v.is_finite() && v > 0.0) {
            return invalid(format!("{what} {v} is not positive"));
        }
    }
    let (boundaries, evened) = match &setup.records {
        SplitRecords::Shards(shards) => {
            let placement = Placement::new(shards, setup.nodes, setup.fraction, setup.seed)?;
            (planned(setup, &placement), placement.evened())
        }
        SplitRecords::Total(records) => {
            let b = setup.record_bytes;
            let rows = (1..setup.epochs).map(|epoch| {
                let e = expected(*records, setup.nodes, setup.fraction, epoch);
                let moved = e.records_in * setup.nodes as f64;
                let busiest = [e.records_in * b, e.records_in * b, e.held_foreign * b];
                boundary(setup, epoch, moved, busiest, false)
            });
            (rows.collect(), 0)
        }
    };
    Ok(ExchangePlan {
        setup: setup.clone(),
        exact: matches!(setup.records, SplitRecords::Shards(_)),
        evened,
        boundaries,
    })
}

/// The boundaries of `setup` on `placement`: the shown ones counted, the others expected.
fn planned(setup: &ExchangeSetup, placement: &Placement) -> Vec<Boundary> {
    let b = setup.record_bytes;
    let expectation = Expectation::new(placement);
    let mut held: Option<Holdings> = None;
    let mut rows = Vec::new();
    for epoch in 1..setup.epochs {
        if epoch as usize > LISTED && epoch + 1 < setup.epochs {
            let e = expectation.into_epoch(placement, epoch);
            let most = |v: &[f64]| v.iter().copied().fold(0.0, f64::max) * b;
            let moved: f64 = e.records_in.iter().sum();
            let busiest = [
                most(&e.records_in),
                most(&e.records_out),
                most(&e.held_foreign),
            ];
            rows.push(boundary(setup, epoch, moved, busiest, false));
            continue;
        }
        let before = match held.take() {
            Some(h) if h.epoch() + 1 == epoch => h,
            _ => placement.holdings(epoch - 1),
        };
        let after = placement.holdings(epoch);
        let c = ExchangeCost::between(placement, &before, &after, b);
        let busiest = [
            c.busiest_in_bytes(),
            c.busiest_out_bytes(),
            c.busiest_resume_bytes(),
        ];
        rows.push(boundary(setup, epoch, c.records() as f64, busiest, true));
        held = Some(after);
    }
    rows
}

/// The row of the boundary into `epoch`: `records` sent, the busiest node's bytes in, out and
/// on a resume at `epoch`.
fn boundary(
    setup: &ExchangeSetup,
    epoch: u64,
    records: f64,
    busiest: [f64; 3],
    counted: bool,
) -> Boundary {
    let [busiest_in_bytes, busiest_out_bytes, resume_bytes] = busiest;
    let link_s = busiest_in_bytes.max(busiest_out_bytes) / setup.link_bytes_per_s;
    Boundary {
        epoch,
        records,
        busiest_in_bytes,
        busiest_out_bytes,
        total_bytes: records * setup.record_bytes,
        link_s,
        resume_bytes,
        fits: setup.epoch_time.map(|t| link_s <= t.link_spare_s),
        counted,
    }
}

/// Boundaries listed at the head of the table; the rest but the last are left out of it (the
/// total counts them all).
const LISTED: usize = 4;

impl ExchangePlan {
    /// The plan as a table, its heading naming where the records came from (`from`): the
    /// first boundaries, the last, and the run's total.
    pub fn render(&self, from: &str) -> String {
        let s = &self.setup;
        let mut out = String::new();
        let expected = self.boundaries.iter().filter(|b| !b.counted).count();
        let how = match (self.exact, expected) {
            (true, 0) => format!("counted from the placement of seed {}", s.seed),
            (true, n) => format!(
                "counted from the placement of seed {} for the rows shown; the total adds the \
                 expectation of the {n} others on that placement",
                s.seed
            ),
            (false, _) => "expected, as if every node held as many".to_string(),
        };
        let _ = writeln!(
            out,
            "# exchange: Q {} over {} nodes, {} records of {} ({from}; {how}), node links {:.1} \
             Gbit/s each way",
            s.fraction,
            s.nodes,
            s.records.total(),
            bytes(s.record_bytes),
            s.link_bytes_per_s * 8.0 / 1e9,
        );
        let _ = writeln!(
            out,
            "# into epoch e a node receives the records it holds in e that neither its shards \
             nor epoch e-1 gave it, from the node whose shards hold them; link = the busiest \
             node's bytes in or out at the link speed; resume = bytes into the busiest node of \
             a run resumed at e"
        );
        if self.evened > 0 {
            let _ = writeln!(
                out,
                "# the shards do not divide evenly over the nodes: {} records are held away from \
                 their home node in every epoch, received into epoch 0",
                self.evened
            );
        }
        if let Some(t) = s.epoch_time {
            let _ = writeln!(
                out,
                "# an epoch takes {:.1} s and leaves the links {:.1} s for the exchange: fits = \
                 the exchange into e runs within epoch e-1",
                t.seconds, t.link_spare_s
            );
        }
        let _ = writeln!(
            out,
            "# {:>6} {:>14} {:>12} {:>12} {:>12} {:>10} {:>12} {:>5}",
            "epoch", "records", "busiest in", "busiest out", "all nodes", "link", "resume", "fits"
        );
        let last = self.boundaries.len().saturating_sub(1);
        for (i, b) in self.boundaries.iter().enumerate() {
            if i == LISTED && i < last {
                let _ = writeln!(out, "  {:>6}", "...");
            }
            if i >= LISTED && i < last {
                continue;
            }
            let _ = writeln!(
                out,
                "  {:>6} {:>14.0} {:>12} {:>12} {:>12} {:>10} {:>12} {:>5}",
                b.epoch,
                b.records,
                bytes(b.busiest_in_bytes),
                bytes(b.busiest_out_bytes),
                bytes(b.total_bytes),
                format!("{:.2} s", b.link_s),
                bytes(b.resume_bytes),
                match b.fits {
                    Some(true) => "yes",
                    Some(false) => "no",
                    None => "-",
                }
            );
        }
        let sum = |f: fn(&Boundary) -> f64| self.boundaries.iter().map(f).sum::<f64>();
        let _ = writeln!(
            out,
            "# the run's {} boundaries: {:.0} records, {} in all, {:.1} s of the busiest link",
            self.boundaries.len(),
            sum(|b| b.records),
            bytes(sum(|b| b.total_bytes)),
            sum(|b| b.link_s),
        );
        out
    }
}

/// `b` bytes in GiB, MiB or KiB, whichever reads best.
fn bytes(b: f64) -> String {
    if b >= GIB as f64 {
        format!("{:.2} GiB", b / GIB as f64)
    } else if b >= MIB as f64 {
        format!("{:.1} MiB", b / MIB as f64)
    } else {
        format!("{:.1} KiB", b / 1024.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records into and out of every node and held from other nodes, by looking up every
    /// record of every node in the holdings of the epoch before.
    fn brute_force(p: &Placement, epoch: u64) -> (Vec<u64>, Vec<u64>, Vec<u64>) {
        let (before, after) = (p.holdings(epoch - 1), p.holdings(epoch));
        let nodes = p.nodes();
        let (mut into, mut out, mut foreign) = (vec![0; nodes], vec![0; nodes], vec![0; nodes]);
        for n in 0..nodes {
            for &id in after.node(n) {
                let home = p.home(id);
                if home != n {
                    foreign[n] += 1;
                    if !before.node(n).contains(&id) {
                        into[n] += 1;
                        out[home] += 1;
                    }
                }
            }
        }
        (into, out, foreign)
    }

    #[test]
    fn counts_match_a_brute_force_count_over_the_holdings() {
        let shards = [40u64, 37, 52, 41, 39, 33, 45];
        for nodes in [1, 2, 3, 7] {
            for q in [0.0, 0.3, 1.0] {
                let p = Placement::new(&shards, nodes, q, 5).unwrap();
                for epoch in 1..5 {
                    let c = exchange_cost(&p, epoch, 100.0);
                    let (into, out, foreign) = brute_force(&p, epoch);
                    assert_eq!(c.epoch, epoch);
                    assert_eq!(c.records_in, into, "{nodes} nodes, Q {q}, epoch {epoch}");
                    assert_eq!(c.records_out, out, "{nodes} nodes, Q {q}, epoch {epoch}");
                    assert_eq!(c.held_foreign, foreign);
                    assert_eq!(c.total_bytes(), c.records() as f64 * 100.0);
                    let resume = ExchangeCost::resume(&p, &p.holdings(epoch), 100.0);
                    assert_eq!(resume.records_in, foreign);
                    assert_eq!(resume.records(), resume.records_out.iter().sum::<u64>());
                }
                if q == 0.0 || nodes == 1 {
                    assert_eq!(exchange_cost(&p, 3, 1.0).records(), 0);
                }
            }
        }
        // Into epoch 0 nothing moves between epochs; the nodes hold what evens them out.
        let p = Placement::new(&shards, 3, 1.0, 5).unwrap();
        let none = exchange_cost(&p, 0, 1.0);
        assert_eq!(none.records(), 0);
        assert_eq!(none.held_foreign.iter().sum::<u64>() as usize, p.evened());
        assert!(p.evened() > 0);
    }

    #[test]
    fn the_expectation_follows_the_count() {
        let nodes = 4;
        let shards = vec![2500u64; 8];
        for q in [0.1, 0.5, 1.0] {
            let p = Placement::new(&shards, nodes, q, 9).unwrap();
            let mut held = p.holdings(0);
            for epoch in 1..8 {
                let next = p.holdings(epoch);
                let c = ExchangeCost::between(&p, &held, &next, 1.0);
                let e = expected(20_000, nodes, q, epoch);
                let per_node = c.records() as f64 / nodes as f64;
                let foreign = c.held_foreign.iter().sum::<u64>() as f64 / nodes as f64;
                assert!(
                    (per_node - e.records_in).abs() < 0.015 * 5000.0,
                    "Q {q} epoch {epoch}: {per_node} vs {}",
                    e.records_in
                );
                assert!((foreign - e.held_foreign).abs() < 0.015 * 5000.0);
                held = next;
            }
        }
        // The first 1 / Q boundaries move Q (P - 1) / P of the records, later ones
        // Q ((P - 1) / P)^2.
        assert!((expected(4000, 4, 0.5, 2).records_in - 0.5 * 1000.0 * 0.75).abs() < 1e-9);
        let steady = expected(4000, 4, 0.5, 3).records_in;
        assert!((steady - 0.5 * 1000.0 * 0.75 * 0.75).abs() < 1e-9);
        assert_eq!(expected(4000, 1, 1.0, 3).records_in, 0.0);
    }

    fn setup(records: SplitRecords) -> ExchangeSetup {
        ExchangeSetup {
            fraction: 0.5,
            nodes: 4,
            records,
            record_bytes: 1e5,
            seed: 0,
            link_bytes_per_s: 1e9,
            epochs: 10,
            epoch_time: Some(EpochTime {
                seconds: 100.0,
                link_spare_s: 0.04,
            }),
        }
    }

    #[test]
    fn a_plan_counts_with_shards_and_expects_without() {
        let exact = plan(&setup(SplitRecords::Shards(vec![1000; 8]))).unwrap();
        let guess = plan(&setup(SplitRecords::Total(8000))).unwrap();
        assert!(exact.exact && !guess.exact);
        assert_eq!(exact.boundaries.len(), 9);
        for (a, b) in exact.boundaries.iter().zip(&guess.boundaries) {
            assert_eq!(a.epoch, b.epoch);
            assert!(
                (a.records - b.records).abs() < 0.1 * b.records,
                "{a:?} {b:?}"
            );
        }
        let first = &guess.boundaries[0];
        assert_eq!(first.records, 0.5 * 8000.0 * 0.75);
        assert_eq!(first.busiest_in_bytes, 750.0 * 1e5);
        assert_eq!(first.link_s, 0.075);
        assert_eq!(first.fits, Some(false));
        let text = exact.render("m/manifest.json");
        assert!(
            text.contains("Q 0.5 over 4 nodes, 8000 records of 97.7 KiB"),
            "{text}"
        );
        assert!(text.contains("seed 0"), "{text}");
        assert!(text.contains("the run's 9 boundaries"), "{text}");
        let rows = text.lines().filter(|l| !l.starts_with('#')).count();
        assert_eq!(rows, LISTED + 2, "{text}");
        let mut bad = setup(SplitRecords::Total(8));
        bad.fraction = 2.0;
        assert!(plan(&bad)
            .unwrap_err()
            .to_string()
            .contains("outside [0, 1]"));
        bad.fraction = 1.0;
        bad.link_bytes_per_s = 0.0;
        assert!(plan(&bad).unwrap_err().to_string().contains("link speed"));
    }

    /// A plan of many epochs on many records counts the rows it shows and expects the others
    /// in time linear in the records (a hang guard: counting every boundary of this plan
    /// would take hours).
    #[test]
    fn a_long_plan_takes_time_linear_in_the_records() {
        let mut long = setup(SplitRecords::Shards(vec![16_384; 64]));
        long.epochs = 100_000;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(plan(&long));
        });
        let p = rx
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("a plan of 100,000 epochs over 1M records within two minutes")
            .unwrap();
        assert_eq!(p.boundaries.len(), 99_999);
        let counted: Vec<u64> = p
            .boundaries
            .iter()
            .filter(|b| b.counted)
            .map(|b| b.epoch)
            .collect();
        assert_eq!(counted, [1, 2, 3, 4, 99_999]);
        let steady = &p.boundaries[50_000];
        let e = expected(1 << 20, 4, 0.5, 50_001);
        assert!(
            (steady.records - 4.0 * e.records_in).abs() < 0.01 * steady.records,
            "{steady:?}"
        );
    }

    #[test]
    fn a_manifest_gives_the_records_of_each_shard_and_their_average_size() {
        use crate::manifest::{ShardInfo, SplitInfo};
        let tmp = tempfile::tempdir().unwrap();
        let shards: Vec<ShardInfo> = [(10u64, 4096u64), (30, 12288)]
            .iter()
            .enumerate()
            .map(|(s, &(records, bytes))| ShardInfo {
                file: format!("train-{s:05}.ddl"),
                records,
                bytes,
                crc32c: 0,
                node: 0,
            })
            .collect();
        let split = |shards: Vec<ShardInfo>| SplitInfo {
            records: shards.iter().map(|s| s.records).sum(),
            shards,
        };
        let manifest = Manifest {
            format_version: crate::format::VERSION,
            classes: Vec::new(),
            splits: [
                ("train".to_string(), split(shards)),
                ("val".into(), split(vec![])),
            ]
            .into_iter()
            .collect(),
            pack: serde_json::json!({}),
            nodes: 1,
        };
        manifest.save(tmp.path()).unwrap();
        let (records, bytes) = SplitRecords::of_manifest(tmp.path(), "train").unwrap();
        assert_eq!(
            (records, bytes),
            (SplitRecords::Shards(vec![10, 30]), 409.6)
        );
        let e = SplitRecords::of_manifest(tmp.path(), "val")
            .unwrap_err()
            .to_string();
        assert!(e.contains("no records"), "{e}");
    }
}
