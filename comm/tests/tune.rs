//! `auto` tunes itself online: the first calls of each size class try the candidates, the
//! ranks agree on the fastest, every call's sums stay exact, and the tuned model, saved and
//! reloaded, chooses the same without trying again.

use crate::common;

use common::on_ranks;
use ddl_comm::allreduce::tune::{MAX_RACE_CALLS, MIN_ROUNDS};
use ddl_comm::{Algorithm, Allreducer, CostModel, MeasuredCurve, Topology};

/// Small integers: exact sums whatever the algorithm.
fn input(rank: usize, len: usize, call: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 31 + rank * 7 + call) % 97) as f32)
        .collect()
}

fn want(ranks: usize, len: usize, call: usize) -> Vec<f32> {
    let inputs: Vec<Vec<f32>> = (0..ranks).map(|r| input(r, len, call)).collect();
    (0..len)
        .map(|i| inputs.iter().map(|v| v[i]).sum())
        .collect()
}

/// Calls `ar` at `len` until its tuning of that size is over, checking every sum; returns
/// how many calls it took.
fn tune(ar: &Allreducer, rank: usize, ranks: usize, len: usize) -> usize {
    let mut calls = 0;
    while ar.tuning(4 * len) {
        let mut buf = input(rank, len, calls);
        ar.allreduce_f32(&mut buf, false).expect("allreduce");
        assert_eq!(buf, want(ranks, len, calls), "rank {rank}, call {calls}");
        calls += 1;
        assert!(
            calls <= 100,
            "rank {rank}: still tuning {len} after 100 calls"
        );
    }
    calls
}

#[test]
fn auto_tunes_each_size_class_once_and_the_ranks_agree() {
    let ranks = 3;
    let out = on_ranks(ranks, move |r, t| {
        let ar = Allreducer::new(t, Algorithm::Auto, Topology::flat(ranks)).expect("auto");
        assert!(ar.tunes(), "no model was measured: auto tunes");
        let small = tune(&ar, r, ranks, 300);
        let large = tune(&ar, r, ranks, 40_000);
        // Another size of the same class is tuned already.
        assert!(!ar.tuning(4 * 35_000));
        let choices = ar.take_tuned();
        assert!(ar.take_tuned().is_empty(), "each choice is handed out once");
        let resolved = (ar.resolve(4 * 300), ar.resolve(4 * 40_000));
        (small, large, choices, resolved)
    });
    let (small, large, choices, resolved) = &out[0];
    assert_eq!(choices.len(), 2, "{choices:?}");
    assert_eq!(choices[0].algorithm, resolved.0);
    assert_eq!(choices[1].algorithm, resolved.1);
    for c in choices {
        let k = c.timings.len();
        assert!(k >= 2, "{c:?}");
        assert!(c.timings.iter().all(|(_, s)| *s > 0.0), "{c:?}");
    }
    for (calls, c) in [(small, &choices[0]), (large, &choices[1])] {
        // Two scouting rounds of every candidate (pruned after each), then a race of the rest:
        // at least MIN_ROUNDS rounds, more up to MAX_RACE_CALLS calls where calls are cheap.
        let k = c.timings.len();
        let race = MAX_RACE_CALLS.max(MIN_ROUNDS * k);
        assert!(*calls >= k && *calls <= 2 * k + race, "{calls}: {c:?}");
    }
    for (r, o) in out.iter().enumerate() {
        assert_eq!(
            o.2.iter().map(|c| &c.algorithm).collect::<Vec<_>>(),
            choices.iter().map(|c| &c.algorithm).collect::<Vec<_>>(),
            "rank {r} chose as rank 0"
        );
        assert_eq!(o.3, *resolved, "rank {r}");
        assert_eq!(
            (o.0, o.1),
            (*small, *large),
            "rank {r}: as many trial calls"
        );
    }
}

#[test]
fn a_saved_tuned_model_chooses_as_the_tuning_did_without_trying_again() {
    let ranks = 2;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tuned.json");
    let saved = path.clone();
    let out = on_ranks(ranks, move |r, t| {
        let ar = Allreducer::new(t.clone(), Algorithm::Auto, Topology::flat(ranks)).unwrap();
        tune(&ar, r, ranks, 5_000);
        let model = ar.tuned_model();
        if r == 0 {
            model.save(&saved).expect("save");
        }
        t.barrier().expect("barrier");
        let loaded = CostModel::load(&saved).expect("load");
        let again = Allreducer::with_model(t, Algorithm::Auto, Topology::flat(ranks), loaded)
            .expect("auto with the saved model");
        assert!(!again.tunes(), "a measured model wins");
        assert!(!again.tuning(4 * 5_000));
        let mut buf = input(r, 5_000, 0);
        again.allreduce_f32(&mut buf, false).expect("allreduce");
        assert_eq!(buf, want(ranks, 5_000, 0));
        (
            ar.resolve(4 * 5_000),
            again.resolve(4 * 5_000),
            again.take_tuned(),
        )
    });
    for (r, (tuned, reloaded, fresh)) in out.into_iter().enumerate() {
        assert_eq!(tuned, reloaded, "rank {r}");
        assert!(fresh.is_empty(), "rank {r}: the reloaded model tuned again");
    }
    assert!(std::fs::read_to_string(&path)
        .unwrap()
        .contains("tuned online"));
}

#[test]
fn a_calibrated_model_of_this_layout_wins_over_tuning() {
    let mut model = CostModel::default();
    model.measured.push(MeasuredCurve {
        algorithm: "rhd".into(),
        nodes: 1,
        ranks_per_node: 2,
        points: vec![(4, 1e-9), (1 << 30, 1e-9)],
    });
    let out = on_ranks(2, move |r, t| {
        let ar = Allreducer::with_model(t, Algorithm::Auto, Topology::flat(2), model.clone())
            .expect("auto");
        let mut buf = input(r, 1000, 0);
        ar.allreduce_f32(&mut buf, false).expect("allreduce");
        assert_eq!(buf, want(2, 1000, 0));
        (ar.tunes(), ar.resolve(4000))
    });
    for (tunes, resolved) in out {
        assert!(!tunes);
        assert_eq!(resolved, Algorithm::Rhd);
    }
}
