//! Configuration errors fail before training and name the flag.

use crate::common;

use std::path::Path;
use std::sync::Arc;

use ddl_comm::{thread_group, Topology, Transport};
use ddl_trainer::config::ResidencyMode;
use ddl_trainer::{train, RankInfo, TrainConfig};

fn err(cfg: &TrainConfig) -> String {
    let t: Arc<dyn Transport> = Arc::new(thread_group(1).pop().unwrap());
    train(cfg, t, Topology::new(1, 1), RankInfo::single())
        .unwrap_err()
        .to_string()
}

#[test]
fn bad_flags_are_named() {
    let tmp = ddl_testkit::scratch("config");
    let dir = tmp.path();
    let data = dir.join("data");
    common::make_dataset(&data, 3, 4, 0, 2, 0, 24);
    let ok = common::config(&data, "convnet_nobn", 2, "cpu:1");

    let mut c = ok.clone();
    c.data = dir.join("missing");
    assert!(err(&c).contains("--data"));
    let mut c = ok.clone();
    c.data = dir.to_path_buf();
    assert!(err(&c).contains("--data"), "a directory without manifest");
    // A GPU this machine does not have.
    let mut c = ok.clone();
    c.devices = "cuda:7".parse().unwrap();
    assert!(err(&c).contains("--devices"));
    let mut c = ok.clone();
    c.batch = 100;
    assert!(
        err(&c).contains("--batch"),
        "12 records cannot fill a batch of 100"
    );
    let mut c = ok.clone();
    c.resume = true;
    assert!(err(&c).contains("--resume"));

    // Out-of-range numbers are refused before anything runs, naming the flag.
    let cases: Vec<(&str, Box<Break>)> = vec![
        ("--lr", Box::new(|c| c.lr = Some(-1.0))),
        ("--lr", Box::new(|c| c.lr = Some(f64::NAN))),
        ("--lr", Box::new(|c| c.lr = Some(0.0))),
        ("--base-lr", Box::new(|c| c.base_lr = f64::INFINITY)),
        ("--momentum", Box::new(|c| c.momentum = -1.0)),
        ("--momentum", Box::new(|c| c.momentum = 1.0)),
        ("--weight-decay", Box::new(|c| c.weight_decay = -1e-4)),
        ("--gamma", Box::new(|c| c.gamma = 0.0)),
        ("--gamma", Box::new(|c| c.gamma = 2.0)),
        ("--comm-timeout", Box::new(|c| c.comm_timeout_s = 0)),
        ("--bucket-mb", Box::new(|c| c.bucket_mb = f64::NAN)),
        ("--warmup-epochs", Box::new(|c| c.warmup_epochs = -1.0)),
        ("--label-smoothing", Box::new(|c| c.label_smoothing = 1.0)),
        ("--eval-resize", Box::new(|c| c.eval_resize = 8)),
        ("--workers", Box::new(|c| c.workers = 1025)),
        ("--prefetch", Box::new(|c| c.prefetch = 1025)),
        ("--image-size", Box::new(|c| c.image_size = 7)),
        ("--restart", Box::new(|c| c.restart = true)),
        (
            "--cost-model",
            Box::new(|c| c.cost_model = Some("/nonexistent/model.json".into())),
        ),
        // (1000 prefetched + 1 + 1 in flight) batches of 2 x 3 x 8192^2 f32: 1.6 TB.
        (
            "--image-size",
            Box::new(|c| {
                c.image_size = 8192;
                c.prefetch = 1000;
            }),
        ),
    ];
    for (flag, change) in cases {
        let mut c = ok.clone();
        change(&mut c);
        let e = err(&c);
        assert!(e.contains(flag), "{flag}: {e}");
    }
    let mut c = ok.clone();
    c.image_size = 8192;
    c.prefetch = 1000;
    let e = err(&c);
    assert!(e.contains("bytes") && e.contains("MemAvailable"), "{e}");

    // Three ranks, each its own node, but only two train shards.
    let mut c = ok.clone();
    c.residency = ResidencyMode::Rank;
    let group = thread_group(3);
    let errors: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = group
            .into_iter()
            .map(|t| {
                let c = c.clone();
                s.spawn(move || {
                    let t: Arc<dyn Transport> = Arc::new(t);
                    let info = RankInfo {
                        node: 0,
                        nodes: 1,
                        rank_in_node: 0,
                        ranks_in_node: 1,
                        oversubscribed: false,
                    };
                    train(&c, t, Topology::new(1, 3), info)
                        .unwrap_err()
                        .to_string()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for e in errors {
        assert!(e.contains("--residency"), "{e}");
    }
}

/// Sets one out-of-range value in a valid configuration.
type Break = dyn Fn(&mut TrainConfig);

#[test]
fn synthetic_data_refuses_every_setting_that_needs_data_naming_both() {
    // Data, checkpoints, weights in and out and the record trace have nothing to work on in a
    // run on one random batch: each is refused by name beside --synthetic-data.
    let mut ok = common::config(Path::new(""), "convnet_nobn", 2, "cpu:1");
    ok.synthetic_data = true;
    ok.classes = Some(3);
    let cases: Vec<(&str, Box<Break>)> = vec![
        ("--data", Box::new(|c| c.data = "shards".into())),
        (
            "--checkpoint-dir",
            Box::new(|c| c.checkpoint_dir = Some("ck".into())),
        ),
        (
            "--init-from",
            Box::new(|c| c.init_from = Some("w.safetensors".into())),
        ),
        (
            "--export",
            Box::new(|c| c.export = Some("w.safetensors".into())),
        ),
        (
            "--dump-weights",
            Box::new(|c| c.dump_weights = Some("w.f32".into())),
        ),
        (
            "--trace-records",
            Box::new(|c| c.trace_records = Some("t.jsonl".into())),
        ),
    ];
    for (flag, change) in cases {
        let mut c = ok.clone();
        change(&mut c);
        let e = err(&c);
        assert!(
            e.contains(flag) && e.contains("--synthetic-data") && e.contains("random data"),
            "{flag}: {e}"
        );
    }
}
