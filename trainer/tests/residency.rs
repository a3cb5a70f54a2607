//! Multi-node emulation in one process: with `--residency rank` every rank is its own node
//! holding its shards (here unevenly: 2 shards vs 1, evened out to as many records each),
//! both take the same number of steps and train on every record once, evaluation counts
//! every val record exactly once across nodes, and the replicas of both ranks stay
//! identical.

use crate::common;

#[test]
fn ranks_as_nodes_with_uneven_shards() {
    let tmp = ddl_testkit::scratch("residency");
    let dir = tmp.path();
    let data = dir.join("data");
    // 3 train shards of 16 records: node 0's hold 32, node 1's 16, so node 1 serves 8 of
    // node 0's and each serves 24. 3 val shards of 3.
    common::make_dataset(&data, 4, 12, 3, 3, 3, 32);
    let mut cfg = common::config(&data, "resnet_small", 4, "cpu:2");
    cfg.residency = ddl_trainer::config::ResidencyMode::Rank;
    cfg.eval = true;
    cfg.check_replicas = true;
    cfg.epochs = 1;
    cfg.metrics = Some(dir.join("m.jsonl"));
    cfg.trace_records = Some(dir.join("trace.jsonl"));
    // Both ranks on one physical node; --residency rank makes them two nodes.
    let summaries = common::run_all(&cfg, 2);
    // 24 records / (1 rank x 2 replicas x 4) = 3 steps on both ranks: every record once.
    assert_eq!(summaries[0].global_steps, 3);
    assert_eq!(summaries[1].global_steps, 3);
    let mut trained: Vec<u64> = (0..2)
        .flat_map(|r| {
            ddl_loader::trace_records::read(&dir.join(format!("trace.jsonl.{r}"))).unwrap()
        })
        .flat_map(|l| l.ids)
        .collect();
    trained.sort_unstable();
    assert_eq!(
        trained,
        (0..48).collect::<Vec<u64>>(),
        "every train record once"
    );
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
        3
    );
}
