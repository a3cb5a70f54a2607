//! Multi-node emulation in one process: with `--residency rank` every rank is its own node
//! holding only its shards (here unevenly: 2 shards vs 1), both take the same number of steps
//! (the smallest node's), evaluation counts every val record exactly once across nodes, and
//! the replicas of both ranks stay identical.

use crate::common;

#[test]
fn ranks_as_nodes_with_uneven_shards() {
    let tmp = ddl_testkit::scratch("residency");
    let dir = tmp.path();
    let data = dir.join("data");
    // 3 train shards of 16 records: node 0 holds 32, node 1 holds 16. 3 val shards of 3.
    common::make_dataset(&data, 4, 12, 3, 3, 3, 32);
    let mut cfg = common::config(&data, "resnet_small", 4, "cpu:2");
    cfg.residency = ddl_trainer::config::ResidencyMode::Rank;
    cfg.eval = true;
    cfg.check_replicas = true;
    cfg.epochs = 1;
    cfg.metrics = Some(dir.join("m.jsonl"));
    // Both ranks on one physical node; --residency rank makes them two nodes.
    let summaries = common::run_all(&cfg, 2);
    // Smallest node: 16 records / (1 rank x 2 replicas x 4) = 2 steps on both ranks.
    assert_eq!(summaries[0].global_steps, 2);
    assert_eq!(summaries[1].global_steps, 2);
    assert_eq!(summaries[0].param_checksum, summaries[1].param_checksum);
    let epoch = &summaries[0].epochs[0];
    assert!(epoch.val_top1.is_some());
    assert_eq!(
        epoch.val_images,
        Some(12),
        "every val record counted exactly once"
    );
    let text = std::fs::read_to_string(dir.join("m.jsonl")).unwrap();
    assert_eq!(
        text.lines()
            .filter(|l| l.contains("\"type\":\"step\""))
            .count(),
        2
    );
}
