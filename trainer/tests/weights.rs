//! Models in and out of a run (in-process ranks): `--export` writes the weights and rank 0
//! replica 0's BatchNorm statistics (the ones evaluation uses) with the val accuracy of exactly
//! those weights; `ddl-export`'s library gives the same file from the checkpoint;
//! `--init-from` then 0 steps then `--export` gives the tensors back bitwise, also with
//! `--reset-head` on another class count (head from the seed); bad files fail before the
//! first step, naming the key.

use crate::common;

use std::path::Path;
use std::sync::Arc;

use ddl_comm::{thread_group, Topology, Transport};
use ddl_trainer::checkpoint::{self, Checkpoint};
use ddl_trainer::export::export_checkpoint;
use ddl_trainer::weights::meta::ModelMeta;
use ddl_trainer::weights::{file, is_head, Entry, StateDict};
use ddl_trainer::{train, RankInfo, TrainConfig, TrainError, TrainSummary};
use safetensors::Dtype;

/// One rank, in-process, returning the run's outcome.
fn run(cfg: &TrainConfig) -> Result<TrainSummary, TrainError> {
    let t: Arc<dyn Transport> = Arc::new(thread_group(1).pop().unwrap());
    train(cfg, t, Topology::new(1, 1), RankInfo::single())
}

fn read(path: &Path) -> (StateDict, ModelMeta) {
    let (dict, map) = file::read(path).unwrap();
    let meta = ModelMeta::from_map(&map, path)
        .unwrap()
        .expect("ddl metadata");
    (dict, meta)
}

#[test]
fn export_is_rank0_replica0_and_checkpoint_export_matches() {
    let tmp = ddl_testkit::scratch("weights-export");
    let dir = tmp.path();
    let data = dir.join("data");
    // 4 classes x 12 = 48 records; batch 4 x 2 replicas x 2 ranks = 16 per step: 3 steps.
    common::make_dataset(&data, 4, 12, 3, 2, 1, 36);
    let mut cfg = common::config(&data, "resnet_small", 4, "cpu:2");
    cfg.eval = true;
    cfg.channels_last = true;
    cfg.checkpoint_dir = Some(dir.join("ck"));
    cfg.export = Some(dir.join("model.safetensors"));
    cfg.metrics = Some(dir.join("metrics.jsonl"));
    let summary = common::run_ranks(&cfg, 2);
    assert_eq!(summary.global_steps, 3);
    let (dict, meta) = read(&dir.join("model.safetensors"));

    // The metadata: classes in label order, the eval transform, the run's val accuracy.
    assert_eq!(meta.model, "resnet_small");
    let manifest = ddl_loader::manifest::Manifest::load(&data).unwrap();
    let wnids: Vec<String> = manifest.classes.iter().map(|c| c.wnid.clone()).collect();
    assert_eq!(meta.classes, wnids);
    assert_eq!((meta.image_size, meta.eval_resize), (32, 37));
    assert_eq!(meta.global_step, Some(3));
    let last = summary.epochs.last().unwrap();
    assert_eq!(meta.val_top1, last.val_top1);
    assert_eq!(meta.val_top5, last.val_top5);
    assert!(meta.val_top1.is_some());
    assert_eq!(meta.flags.as_ref().unwrap()["channels_last"], true);

    // Weights in NCHW and rank 0 replica 0's statistics, as the checkpoint of the same step
    // holds them; another replica's differ.
    let ck = Checkpoint::read(&checkpoint::list(&dir.join("ck")).unwrap().pop().unwrap()).unwrap();
    assert_eq!(ck.meta.global_step, 3);
    let conv = &dict.tensors["conv1.weight"];
    assert_eq!(
        (conv.dtype, conv.shape.clone()),
        (Dtype::F32, vec![16, 3, 3, 3])
    );
    assert_eq!(
        conv.to_f32().unwrap(),
        ck.get("param/conv1.weight").unwrap()
    );
    for stat in ["layer1.0.bn1.running_mean", "layer3.1.bn2.running_var"] {
        let exported = dict.f32_values(stat).unwrap();
        assert_eq!(
            exported,
            ck.get(&format!("buffer/0/0/{stat}")).unwrap(),
            "{stat}"
        );
        assert_ne!(
            exported,
            ck.get(&format!("buffer/1/1/{stat}")).unwrap(),
            "{stat}"
        );
    }
    // num_batches_tracked: the batches these statistics saw, one per step.
    assert_eq!(
        dict.tensors["bn1.num_batches_tracked"],
        Entry::i64_scalar(3)
    );

    // ddl-export of that checkpoint (through its directory): the same file contents.
    let again = dir.join("again.safetensors");
    let out = export_checkpoint(&dir.join("ck"), &again, None).unwrap();
    assert_eq!(out.tensors, dict.tensors.len());
    let (dict2, meta2) = read(&again);
    assert_eq!(dict2, dict);
    assert_eq!(meta2, meta);
}

#[test]
fn init_from_round_trips_and_reset_head_keeps_the_body() {
    let tmp = ddl_testkit::scratch("weights-init");
    let dir = tmp.path();
    let data = dir.join("data");
    common::make_dataset(&data, 3, 8, 0, 1, 0, 36);
    // A trained model: 2 epochs of 3 steps.
    let mut cfg = common::config(&data, "resnet_small", 8, "cpu:1");
    cfg.epochs = 2;
    cfg.export = Some(dir.join("a.safetensors"));
    run(&cfg).unwrap();
    let (a, _) = read(&dir.join("a.safetensors"));
    assert_eq!(a.tensors["bn1.num_batches_tracked"], Entry::i64_scalar(6));

    // --init-from, 0 steps, --export: every tensor back bitwise (num_batches_tracked too).
    let zero = |init: &str, out: &str, data: &Path, reset: bool| {
        let mut c = common::config(data, "resnet_small", 8, "cpu:2");
        c.seed = 11;
        c.max_steps = Some(0);
        c.init_from = Some(dir.join(init));
        c.reset_head = reset;
        c.export = Some(dir.join(out));
        run(&c).unwrap();
        read(&dir.join(out)).0
    };
    assert_eq!(zero("a.safetensors", "b.safetensors", &data, false), a);

    // On 5 classes with --reset-head: the body as imported, the head as seed 11 draws it.
    let data5 = dir.join("data5");
    common::make_dataset(&data5, 5, 4, 0, 1, 0, 36);
    let tuned = zero("a.safetensors", "c.safetensors", &data5, true);
    let mut scratch = common::config(&data5, "resnet_small", 8, "cpu:1");
    scratch.seed = 11;
    scratch.max_steps = Some(0);
    scratch.export = Some(dir.join("s.safetensors"));
    run(&scratch).unwrap();
    let (fresh, _) = read(&dir.join("s.safetensors"));
    assert_eq!(tuned.tensors.len(), a.tensors.len());
    for (k, e) in &tuned.tensors {
        if is_head(k) {
            assert_eq!(e, &fresh.tensors[k], "{k}: the seed's head");
            assert_eq!(e.shape[0], 5, "{k}");
        } else {
            assert_eq!(e, &a.tensors[k], "{k}: imported");
        }
    }
    // Without --reset-head the head's shape is refused, naming it and the flag.
    let mut c = common::config(&data5, "resnet_small", 8, "cpu:1");
    c.init_from = Some(dir.join("a.safetensors"));
    let e = run(&c).unwrap_err().to_string();
    assert!(e.contains("tensor fc.weight has shape [3, 64]"), "{e}");
    assert!(e.contains("--reset-head"), "{e}");
}

#[test]
fn bad_files_fail_before_the_first_step_naming_the_key() {
    let tmp = ddl_testkit::scratch("weights-bad");
    let dir = tmp.path();
    let data = dir.join("data");
    common::make_dataset(&data, 3, 8, 0, 1, 0, 36);
    let mut cfg = common::config(&data, "resnet_small", 8, "cpu:1");
    cfg.max_steps = Some(0);
    cfg.export = Some(dir.join("good.safetensors"));
    run(&cfg).unwrap();
    let (good, meta) = read(&dir.join("good.safetensors"));
    let bytes = std::fs::read(dir.join("good.safetensors")).unwrap();

    let attempt = |name: &str, dict: Option<&StateDict>, raw: Option<&[u8]>| {
        let path = dir.join(name);
        match (dict, raw) {
            (Some(d), _) => file::write(&path, d, &meta.to_map()).unwrap(),
            (_, Some(b)) => std::fs::write(&path, b).unwrap(),
            _ => unreachable!(),
        }
        let mut c = common::config(&data, "resnet_small", 8, "cpu:1");
        c.init_from = Some(path);
        c.checkpoint_dir = Some(dir.join(format!("ck-{name}")));
        let e = run(&c).unwrap_err().to_string();
        // Nothing was trained: no checkpoint was written.
        assert!(checkpoint::list(&dir.join(format!("ck-{name}")))
            .unwrap()
            .is_empty());
        e
    };

    let mut d = good.clone();
    d.tensors.remove("layer2.0.downsample.1.running_mean");
    let e = attempt("missing.safetensors", Some(&d), None);
    assert!(
        e.contains("tensor layer2.0.downsample.1.running_mean missing"),
        "{e}"
    );

    let mut d = good.clone();
    d.tensors.insert(
        "layer1.1.conv2.weight".into(),
        Entry::f32(vec![16, 16, 1, 1], &[0.0; 256]),
    );
    let e = attempt("shape.safetensors", Some(&d), None);
    assert!(
        e.contains("tensor layer1.1.conv2.weight has shape [16, 16, 1, 1]"),
        "{e}"
    );

    let mut d = good.clone();
    let w = d.tensors.get_mut("layer3.0.bn1.weight").unwrap();
    w.dtype = Dtype::F64;
    w.data.extend_from_slice(&w.data.clone());
    let e = attempt("dtype.safetensors", Some(&d), None);
    assert!(e.contains("tensor layer3.0.bn1.weight is F64"), "{e}");

    let e = attempt("cut.safetensors", None, Some(&bytes[..bytes.len() - 100]));
    assert!(e.contains("truncated: tensor "), "{e}");
    // Data is in name order within a dtype: the last F32 tensor is the one cut.
    let name = good
        .tensors
        .keys()
        .filter(|k| good.tensors[*k].dtype == Dtype::F32)
        .max()
        .unwrap();
    assert!(e.contains(&format!("truncated: tensor {name} ")), "{e}");

    // Another architecture's file: named by its metadata.
    let mut other = meta.clone();
    other.model = "resnet18".into();
    let path = dir.join("other.safetensors");
    file::write(&path, &good, &other.to_map()).unwrap();
    let mut c = common::config(&data, "resnet_small", 8, "cpu:1");
    c.init_from = Some(path);
    let e = run(&c).unwrap_err().to_string();
    assert!(
        e.contains("metadata model: the file holds a resnet18"),
        "{e}"
    );
}
