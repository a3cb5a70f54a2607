//! Tracing a short run: with ddl-trace enabled, training on two ranks (threads of this
//! process) with two CPU replicas each writes a valid Chrome trace holding the eval and
//! checkpoint spans and the data-wait, forward/backward and intra-node-sum spans of every
//! replica and the allreduce of every bucket (a job of one rank has no allreduce: its
//! gradients never leave the devices). ddl-trace is process-global and the other tests of this
//! binary run beside it, so the traced run has a process of its own (the test binary again,
//! running only [`traced_run_child`]), and every count is per rank times the ranks.

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// Ranks of the traced job.
const RANKS: usize = 2;

/// Set in the child process of [`traced_run_writes_chrome_trace_with_replica_spans`]: the
/// directory of the traced run.
const CHILD_ENV: &str = "DDL_TRACE_CHILD_DIR";

/// The child: trains with tracing on, writes `trace.json` and the number of events written
/// (`events`) into the directory its parent names.
#[test]
fn traced_run_child() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return; // only meaningful when started by the test below
    };
    let dir = Path::new(&dir);
    let data = dir.join("data");
    common::make_dataset(&data, 2, 32, 4, 1, 1, 32);
    let mut cfg = common::config(&data, "resnet_small", 4, "cpu:2");
    // 64 records / (2 ranks x 2 replicas x 4) = 4 steps: one epoch, then eval.
    cfg.max_steps = Some(4);
    cfg.eval = true;
    cfg.checkpoint_dir = Some(dir.join("ckpt"));
    cfg.checkpoint_every = 2;
    // Small buckets so that a step has several.
    cfg.overlap = Some(ddl_trainer::config::Overlap::Pipeline);
    cfg.bucket_mb = 0.05;

    ddl_trace::set_thread_name("main");
    ddl_trace::enable();
    let summary = common::run_ranks(&cfg, RANKS);
    ddl_trace::disable();
    assert_eq!(summary.global_steps, 4);
    let n = ddl_trace::write(&dir.join("trace.json")).unwrap();
    std::fs::write(dir.join("events"), n.to_string()).unwrap();
}

#[test]
fn traced_run_writes_chrome_trace_with_replica_spans() {
    let tmp = ddl_testkit::scratch("trace");
    let dir = tmp.path();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["traced_run_child", "--nocapture", "--test-threads", "1"])
        .env(CHILD_ENV, dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the traced run failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let n: usize = std::fs::read_to_string(dir.join("events"))
        .unwrap()
        .parse()
        .unwrap();
    assert!(n > 0);
    let path = dir.join("trace.json");
    let v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let events = match &v {
        Value::Array(a) => a,
        Value::Object(o) => o["traceEvents"].as_array().expect("traceEvents array"),
        _ => panic!("trace is neither an array nor an object"),
    };
    let complete: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(complete.len(), n);
    for e in &complete {
        assert!(e["name"].is_string(), "{e}");
        assert!(e["cat"].is_string(), "{e}");
        assert!(e["ts"].as_f64().is_some_and(|t| t >= 0.0), "{e}");
        assert!(e["dur"].as_f64().is_some_and(|d| d >= 0.0), "{e}");
        assert!(e["pid"].is_u64(), "{e}");
        assert!(e["tid"].is_u64(), "{e}");
    }
    let named = |name: &str| -> Vec<&Value> {
        complete
            .iter()
            .copied()
            .filter(|e| e["name"] == name)
            .collect()
    };
    let replicas_of = |name: &str| -> BTreeSet<i64> {
        named(name)
            .iter()
            .map(|e| e["args"]["replica"].as_i64().expect("replica arg"))
            .collect()
    };
    for name in [
        "data_wait",
        "forward_backward",
        "intra_node_sum",
        "wait_reduced",
        "sgd_update",
    ] {
        assert_eq!(replicas_of(name), BTreeSet::from([0, 1]), "{name}");
    }
    // One data wait and one forward/backward per replica per step.
    assert_eq!(named("forward_backward").len(), RANKS * 8);
    assert_eq!(named("data_wait").len(), RANKS * 8);
    // One allreduce per bucket per step, each naming its bucket and size.
    let allreduce = named("allreduce");
    let buckets: BTreeSet<i64> = allreduce
        .iter()
        .map(|e| e["args"]["bucket"].as_i64().unwrap())
        .collect();
    assert!(buckets.len() > 1, "expected several buckets: {buckets:?}");
    assert_eq!(allreduce.len(), RANKS * 4 * buckets.len());
    assert!(allreduce
        .iter()
        .all(|e| e["args"]["floats"].as_i64().unwrap() > 0));
    // Every replica sums every bucket every step.
    assert_eq!(named("intra_node_sum").len(), RANKS * 2 * 4 * buckets.len());
    assert!(!named("checkpoint").is_empty());
    assert_eq!(named("eval").len(), RANKS);
    // Replica spans come from threads named after their replica.
    for r in 0..2i64 {
        let tids: BTreeSet<u64> = named("forward_backward")
            .iter()
            .filter(|e| e["args"]["replica"] == r)
            .map(|e| e["tid"].as_u64().unwrap())
            .collect();
        assert_eq!(tids.len(), RANKS);
        for tid in tids {
            assert!(events.iter().any(|m| m["ph"] == "M"
                && m["tid"] == tid
                && m["args"]["name"] == format!("replica {r}")));
        }
    }
}
