//! How a `ddl-train` rank shares the cores. Under Open MPI's default binding a one-rank job
//! runs on one core: the rank says so, naming the fix, instead of training slowly in silence;
//! unbound it says nothing. CPU replicas that outnumber the cores yield them to the
//! communication, and the run says so.

use ddl_tests::{bin, mpirun_with, printed, run_ok, scratch, synth_and_pack, SynthSpec};

/// What the warning starts with (`ddl_comm::Binding::warning`, prefixed by ddl-train).
const WARNING: &str = "ddl-train: the launcher bound this node's 1 rank(s) to 1 of its";

/// What the start line says when the CPU replicas outnumber the cores.
const YIELD: &str = "the CPU replicas outnumber the cores and yield them to the communication";

#[test]
fn a_rank_bound_to_one_core_is_warned_and_replicas_that_outnumber_the_cores_yield() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 {
        eprintln!("skipped: one CPU, nothing for the launcher to withhold");
        return;
    }
    let tmp = scratch("binding");
    let shards = synth_and_pack(
        tmp.path(),
        &SynthSpec {
            classes: 2,
            // One step of batch 4 for every replica of the crowded run.
            per_class: 2 * (cpus + 1),
            val_per_class: 2,
            seed: 7,
            shards: 1,
            max_short_side: 40,
        },
    );
    let train = |bind: &str, replicas: usize| {
        let out = run_ok(
            mpirun_with(&["--bind-to", bind], 1)
                .arg(bin("ddl-train"))
                .arg("--data")
                .arg(&shards)
                .args([
                    "--model",
                    "resnet_small",
                    "--image-size",
                    "32",
                    "--batch",
                    "4",
                ])
                .args(["--devices", &format!("cpu:{replicas}"), "--workers", "2"])
                .args(["--epochs", "1"])
                .args(["--warmup-epochs", "0"]),
        );
        printed(&out)
    };
    let bound = train("core", 1);
    assert!(
        bound.contains(WARNING)
            && bound.contains("3 busy threads")
            && bound.contains("--bind-to none"),
        "{bound}"
    );
    let unbound = train("none", 1);
    assert!(!unbound.contains("the launcher bound"), "{unbound}");
    // One replica per core: the replicas keep their priority.
    assert!(!unbound.contains(YIELD), "{unbound}");
    let crowded = train("none", cpus + 1);
    assert!(
        crowded.contains(YIELD) && crowded.contains(&format!("x {} replica(s)", cpus + 1)),
        "{crowded}"
    );
}
