//! The step model's file: the cost model's, with the contention in its field `contention`.

use ddl_comm::CostModel;
use ddl_sim::{Contention, StepModel};

/// A model file as `ddl-bench calibrate` wrote it before ddl-sim existed (ddl-comm's
/// `CostModel` held the contention then).
const CALIBRATED: &str = r#"{
  "intra": {
    "name": "intra",
    "alpha": 2e-6,
    "beta": 1e-10,
    "gamma": 5e-11,
    "curve_ranks": 0
  },
  "inter": {
    "name": "inter",
    "alpha": 3e-5,
    "beta": 1e-9,
    "gamma": 5e-11,
    "curve_ranks": 0
  },
  "source": "ddl-bench calibrate on host",
  "copy": 1e-10,
  "shm_sync": 2e-6,
  "contention": {
    "comm_slowdown": 1.5,
    "round_slowdown": 4.0,
    "compute_slowdown": 1.25,
    "compute_threads": 2
  }
}"#;

fn measured() -> Contention {
    Contention {
        comm_slowdown: 1.5,
        round_slowdown: 4.0,
        compute_slowdown: 1.25,
        compute_threads: 2,
    }
}

#[test]
fn a_calibrated_file_loads_with_its_contention_and_keeps_it_through_the_cost_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("model.json");
    std::fs::write(&path, CALIBRATED).expect("write");
    let model = StepModel::load(&path).expect("a calibrated file loads");
    assert_eq!(model.contention, measured());
    assert_eq!(model.cost.source, "ddl-bench calibrate on host");
    assert!(model.cost.other.is_empty(), "{:?}", model.cost.other);
    // ddl-train reads it as a cost model and, saving what it tuned, keeps the contention.
    let cost = CostModel::load(&path).expect("a cost model reads it too");
    assert_eq!(cost.intra, model.cost.intra);
    let again = dir.path().join("again.json");
    cost.save(&again).expect("save");
    assert_eq!(
        StepModel::load(&again).expect("load").contention,
        measured()
    );
    // Saved, it is the file it was read from.
    model.save(&again).expect("save");
    let saved = std::fs::read_to_string(&again).expect("read");
    let value = |s: &str| serde_json::from_str::<serde_json::Value>(s).expect("JSON");
    assert_eq!(value(&saved), value(CALIBRATED));
    assert!(
        saved.contains("\"shm_sync\": 2e-6,\n  \"contention\": {"),
        "{saved}"
    );
}

#[test]
fn a_file_without_contention_has_separate_resources_and_a_bad_one_names_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("model.json");
    CostModel::minsky().save(&path).expect("save");
    let model = StepModel::load(&path).expect("load");
    assert_eq!(model, StepModel::separate(CostModel::minsky()));
    std::fs::write(&path, CALIBRATED.replace("1.25", "\"fast\"")).expect("write");
    let err = StepModel::load(&path).expect_err("a contention of a string");
    assert!(err.to_string().contains("model.json"), "{err}");
    assert!(err.to_string().contains("contention"), "{err}");
}
