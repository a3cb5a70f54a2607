//! `exchange`: nodes (ranks under `residency` rank) trade train records at every epoch
//! boundary; the epochs' records say what moved, and bad fractions are refused.

use ddl_trainer::config::ResidencyMode;

use crate::common;

#[test]
fn nodes_trade_records_from_the_second_epoch_on() {
    let tmp = ddl_testkit::scratch("exchange-train");
    let data = tmp.path().join("data");
    // 4 train shards of 8 records: each of the 2 nodes holds 16.
    common::make_dataset(&data, 4, 8, 0, 4, 1, 32);
    let mut cfg = common::config(&data, "resnet_small", 4, "cpu:1");
    cfg.residency = ResidencyMode::Rank;
    cfg.epochs = 3;
    cfg.exchange = 0.5;
    cfg.stage = Some(tmp.path().join("stage"));
    let summaries = common::run_all(&cfg, 2);
    let moved: Vec<u64> = summaries[0]
        .epochs
        .iter()
        .map(|e| e.exchange.expect("an exchange record").records)
        .collect();
    assert_eq!(moved[0], 0, "epoch 0 serves the home shards");
    // Half of each node's 16 records pooled, about half of those dealt to the other node.
    assert!(moved[1] > 0 && moved[2] > 0 && moved[1] <= 32, "{moved:?}");
    assert_eq!(summaries[0].param_checksum, summaries[1].param_checksum);
    let left: Vec<_> = std::fs::read_dir(tmp.path().join("stage"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().starts_with("ddl-exchange"))
        .collect();
    assert!(left.is_empty(), "arenas left behind: {left:?}");
}

#[test]
fn a_fraction_outside_zero_to_one_is_refused_and_one_node_is_a_note() {
    let tmp = ddl_testkit::scratch("exchange-flags");
    let data = tmp.path().join("data");
    common::make_dataset(&data, 2, 4, 0, 2, 1, 32);
    let mut cfg = common::config(&data, "resnet_small", 4, "cpu:1");
    for q in [-0.5, 1.5, f64::NAN] {
        cfg.exchange = q;
        let results = common::try_all(&cfg, 1);
        let e = common::first_error(&results).expect("refused").to_string();
        assert!(e.contains("--exchange"), "{q}: {e}");
    }
    cfg.exchange = 0.25;
    let one = common::run_ranks(&cfg, 1);
    assert!(
        one.epochs[0].exchange.is_none(),
        "one node exchanges nothing"
    );
}
