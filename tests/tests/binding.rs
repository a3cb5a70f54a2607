//! Under Open MPI's default binding a one-rank `ddl-train` job runs on one core: the rank says
//! so, naming the fix, instead of training slowly in silence; unbound it says nothing.

use ddl_tests::{bin, mpirun_with, printed, run_ok, scratch, synth_and_pack, SynthSpec};

/// What the warning starts with (`ddl_comm::Binding::warning`, prefixed by ddl-train).
const WARNING: &str = "ddl-train: the launcher bound this node's 1 rank(s) to 1 of its";

#[test]
fn a_rank_bound_to_one_core_is_warned_and_an_unbound_one_is_not() {
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
            per_class: 8,
            val_per_class: 2,
            seed: 7,
            shards: 1,
            max_short_side: 40,
        },
    );
    let train = |bind: &str| {
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
                    "8",
                ])
                .args(["--devices", "cpu:1", "--workers", "2", "--epochs", "1"])
                .args(["--warmup-epochs", "0"]),
        );
        printed(&out)
    };
    let bound = train("core");
    assert!(
        bound.contains(WARNING)
            && bound.contains("3 busy threads")
            && bound.contains("--bind-to none"),
        "{bound}"
    );
    let unbound = train("none");
    assert!(!unbound.contains("the launcher bound"), "{unbound}");
}
