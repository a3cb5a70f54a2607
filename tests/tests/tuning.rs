//! `--allreduce auto` tunes itself on a run's first steps: each buffer size it settles is
//! reported once, as a line and a metrics record naming the winner among the candidates it
//! timed, on synthetic data as on a dataset; `--save-cost-model` writes what it measured.

use ddl_tests::{bin, mpirun, printed, run_ok, scratch};

/// What the line of a settled size starts with (`train/tuning.rs`).
const LINE: &str = "ddl-train: allreduce auto at ";

#[test]
fn auto_reports_each_size_it_settles_once_and_saves_what_it_measured() {
    let tmp = scratch("tuning");
    let metrics = tmp.path().join("metrics.jsonl");
    let model = tmp.path().join("tuned.json");
    let out = run_ok(
        mpirun(2)
            .arg(bin("ddl-train"))
            .args(["--synthetic-data", "--model", "resnet_small"])
            .args(["--image-size", "32", "--batch", "2", "--devices", "cpu:1"])
            .args(["--max-steps", "200", "--allreduce", "auto", "--metrics"])
            .arg(&metrics)
            .arg("--save-cost-model")
            .arg(&model),
    );
    let text = std::fs::read_to_string(&metrics).unwrap();
    let tuned: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["type"] == "allreduce_tuned")
        .collect();
    assert!(!tuned.is_empty(), "no size settled in 200 steps:\n{text}");
    let mut sizes: Vec<u64> = tuned.iter().map(|r| r["bytes"].as_u64().unwrap()).collect();
    sizes.sort_unstable();
    sizes.dedup();
    assert_eq!(sizes.len(), tuned.len(), "a size reported twice:\n{text}");
    for r in &tuned {
        let tried: Vec<&str> = r["timings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t[0].as_str().unwrap())
            .collect();
        assert!(
            tried.len() >= 2 && tried.contains(&r["algorithm"].as_str().unwrap()),
            "{r}"
        );
        assert!((1..=200).contains(&r["step"].as_u64().unwrap()), "{r}");
    }
    let lines = printed(&out);
    assert_eq!(lines.matches(LINE).count(), tuned.len(), "{lines}");
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&model).unwrap()).unwrap();
    assert!(
        saved["source"]
            .as_str()
            .unwrap()
            .starts_with("tuned online")
            && !saved["measured"].as_array().unwrap().is_empty(),
        "{saved}"
    );
}
