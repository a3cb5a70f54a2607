//! End-to-end tests of the pipeline on tiny generated shards.

use crate::common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{sampler, solid_dataset, write_dataset, TestRecord, PALETTE};
use ddl_loader::dataset::{Dataset, OpenOptions, Residency};
use ddl_loader::pipeline::{Augment, Batch, Images, OnBadRecord, Output, Pipeline, PipelineConfig};
use ddl_loader::sampler::Tail;
use ddl_loader::shard::ShardReader;
use ddl_loader::transform::Normalizer;
use ddl_loader::LoaderError;
use ddl_testkit::scratch;

const ONE_NODE: Residency = Residency { node: 0, nodes: 1 };

fn open(dir: &std::path::Path) -> Arc<Dataset> {
    Arc::new(Dataset::open(dir, "train", ONE_NODE, &OpenOptions::default()).unwrap())
}

fn config(output: Output, augment: Augment, workers: usize, on_bad: OnBadRecord) -> PipelineConfig {
    PipelineConfig {
        image_size: 32,
        output,
        augment,
        workers,
        prefetch: 2,
        seed: 11,
        on_bad_record: on_bad,
        ..PipelineConfig::default()
    }
}

/// Runs a whole epoch, consuming the replicas in lockstep, handing each batch (step-major)
/// to `f` and dropping it after, as a trainer does: the pipeline has a bounded number of
/// buffers, so holding on to every batch would stall it.
fn for_each_batch(p: &Pipeline, mut f: impl FnMut(usize, Result<Batch, LoaderError>)) {
    let mut its: Vec<_> = (0..p.replicas()).map(|r| p.replica(r)).collect();
    let mut k = 0;
    for _ in 0..p.batches_per_replica() {
        for it in its.iter_mut() {
            f(k, it.next().expect("a batch for every step"));
            k += 1;
        }
    }
    for it in its.iter_mut() {
        assert!(it.next().is_none(), "no batch after the last step");
    }
}

/// Asserts every image of `b` is (approximately) its label's palette colour.
fn check_colours(b: &Batch, norm: &Normalizer) {
    let s = 32 * 32;
    for (j, &label) in b.labels.iter().enumerate() {
        let c = PALETTE[label as usize];
        match &b.images {
            Images::F32(v) => {
                let img = &v[j * 3 * s..(j + 1) * 3 * s];
                for ch in 0..3 {
                    let lo = norm.value(ch, c[ch].saturating_sub(4));
                    let hi = norm.value(ch, c[ch].saturating_add(4));
                    for &x in &img[ch * s..(ch + 1) * s] {
                        assert!(
                            x >= lo && x <= hi,
                            "image {j} label {label} channel {ch}: {x}"
                        );
                    }
                }
            }
            Images::U8(v) => {
                for px in v[j * 3 * s..(j + 1) * 3 * s].chunks_exact(3) {
                    for ch in 0..3 {
                        assert!(
                            (px[ch] as i32 - c[ch] as i32).abs() <= 4,
                            "image {j} label {label}: {px:?} vs {c:?}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn batches_have_right_shapes_labels_and_cover_the_epoch() {
    let dir = scratch("shapes");
    solid_dataset(dir.path(), 48, 3);
    let ds = open(dir.path());
    assert_eq!(ds.len(), 48);
    let norm = Normalizer::new(
        ddl_loader::transform::IMAGENET_MEAN,
        ddl_loader::transform::IMAGENET_STD,
    );
    for (output, augment) in [
        (Output::F32Nchw, Augment::Train),
        (Output::U8Nhwc, Augment::Train),
        (Output::F32Nchw, Augment::Eval { resize: 36 }),
    ] {
        let p = Pipeline::start(
            Arc::clone(&ds),
            sampler(48, 2, 4, Tail::Drop, 5),
            config(output, augment, 2, OnBadRecord::Replace),
            3,
            0,
        )
        .unwrap();
        assert_eq!(p.batches_per_replica(), 6);
        let mut seen = HashSet::new();
        for_each_batch(&p, |k, b| {
            let b = b.unwrap();
            assert_eq!((b.step, b.replica, b.epoch), (k / 2, k % 2, 3));
            let want = match output {
                Output::F32Nchw => [4, 3, 32, 32],
                Output::U8Nhwc => [4, 32, 32, 3],
            };
            assert_eq!(b.shape(), want);
            assert_eq!(b.images.len(), 4 * 3 * 32 * 32);
            assert_eq!(b.skipped, 0);
            check_colours(&b, &norm);
            for (&id, &label) in b.indices.iter().zip(&b.labels) {
                // Record k of the solid dataset has label k % 4 and global id k.
                assert_eq!(label, (id % 4) as i64);
                assert!(seen.insert(id), "record {id} twice in one epoch");
            }
        });
        assert_eq!(seen.len(), 48);
        let st = p.stats();
        assert_eq!((st.batches, st.images, st.skipped), (12, 48, 0));
    }
}

fn collect(p: &Pipeline) -> Vec<(Vec<i64>, Vec<u64>, Images)> {
    let mut out = Vec::new();
    for_each_batch(p, |_, b| {
        let b = b.unwrap();
        out.push((b.labels.clone(), b.indices.clone(), b.images.clone()));
    });
    out
}

#[test]
fn same_seed_same_batches_whatever_the_worker_count() {
    let dir = scratch("determinism");
    // Gradient images so that crops and flips show in the pixels.
    let records: Vec<TestRecord> = (0..30)
        .map(|k| {
            let (w, h) = (60 + k * 7 % 50, 50 + k * 11 % 60);
            let rgb: Vec<u8> = (0..w * h)
                .flat_map(|i| {
                    let (x, y) = (i % w, i / w);
                    [(x * 255 / w) as u8, (y * 255 / h) as u8, (k * 8) as u8]
                })
                .collect();
            (common::jpeg(&rgb, w, h), (k % 4) as u32, h as u16, w as u16)
        })
        .collect();
    write_dataset(dir.path(), "train", &records, 2, 1);
    let ds = open(dir.path());
    let run = |workers: usize, seed: u64| {
        let mut cfg = config(
            Output::F32Nchw,
            Augment::Train,
            workers,
            OnBadRecord::Replace,
        );
        cfg.seed = seed;
        let p =
            Pipeline::start(Arc::clone(&ds), sampler(30, 2, 3, Tail::Pad, 1), cfg, 4, 0).unwrap();
        collect(&p)
    };
    let one = run(1, 7);
    assert_eq!(one.len(), 10);
    assert_eq!(one, run(2, 7));
    assert_eq!(one, run(3, 7));
    let other = run(2, 8);
    // Same records (the sampler seed is unchanged), different crops.
    assert!(one.iter().zip(&other).all(|(a, b)| a.1 == b.1));
    assert!(one.iter().zip(&other).any(|(a, b)| a.2 != b.2));
}

#[test]
fn resume_from_a_step_equals_the_uninterrupted_epoch() {
    let dir = scratch("resume");
    solid_dataset(dir.path(), 40, 2);
    let ds = open(dir.path());
    let cfg = config(Output::U8Nhwc, Augment::Train, 2, OnBadRecord::Replace);
    let full = collect(
        &Pipeline::start(
            Arc::clone(&ds),
            sampler(40, 2, 4, Tail::Drop, 3),
            cfg.clone(),
            2,
            0,
        )
        .unwrap(),
    );
    let resumed = collect(
        &Pipeline::start(Arc::clone(&ds), sampler(40, 2, 4, Tail::Drop, 3), cfg, 2, 3).unwrap(),
    );
    assert_eq!(full.len(), 10);
    assert_eq!(&full[6..], &resumed[..]);
}

/// Flips one byte in the data of node-local record `i`'s shard file.
fn damage(ds: &Dataset, i: usize) -> (std::path::PathBuf, usize) {
    let (reader, r) = ds.locate(i);
    let path = reader.path().to_path_buf();
    let at = reader.header().data_offset + reader.row(r).offset + reader.row(r).length as u64 / 2;
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[at as usize] ^= 0x40;
    std::fs::write(&path, bytes).unwrap();
    (path, r)
}

#[test]
fn damaged_record_is_replaced_skipped_or_fails_its_batch() {
    let dir = scratch("damaged");
    solid_dataset(dir.path(), 24, 2);
    {
        let ds = open(dir.path());
        damage(&ds, 17);
    }
    let ds = open(dir.path());
    assert!(matches!(
        ds.record(17),
        Err(LoaderError::RecordChecksum { .. })
    ));
    let norm = Normalizer::new(
        ddl_loader::transform::IMAGENET_MEAN,
        ddl_loader::transform::IMAGENET_STD,
    );
    let start = |on_bad| {
        Pipeline::start(
            Arc::clone(&ds),
            sampler(24, 1, 4, Tail::Drop, 9),
            config(Output::F32Nchw, Augment::Train, 2, on_bad),
            0,
            0,
        )
        .unwrap()
    };

    let p = start(OnBadRecord::Replace);
    let mut skipped = 0;
    for_each_batch(&p, |_, b| {
        let b = b.unwrap();
        assert_eq!(b.len(), 4);
        check_colours(&b, &norm);
        assert!(!b.indices.contains(&17));
        skipped += b.skipped;
    });
    assert_eq!(skipped, 1);
    let st = p.stats();
    assert_eq!(st.skipped, 1);
    assert_eq!(st.bad_records.len(), 1);
    assert!(
        st.bad_records[0].file.ends_with("train-00001.ddl"),
        "{:?}",
        st.bad_records
    );
    assert_eq!(st.bad_records[0].record, 17 - 12);
    drop(p);

    let p = start(OnBadRecord::Skip);
    let mut lens = Vec::new();
    for_each_batch(&p, |_, b| lens.push(b.unwrap().len()));
    assert_eq!(lens.iter().sum::<usize>(), 23);
    assert_eq!(lens.iter().filter(|&&l| l == 3).count(), 1);
    drop(p);

    let p = start(OnBadRecord::Fail);
    let mut errors = Vec::new();
    for_each_batch(&p, |_, b| {
        if let Err(e) = b {
            errors.push(e.to_string());
        }
    });
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0].contains("train-00001.ddl") && errors[0].contains("record 5"),
        "{}",
        errors[0]
    );
}

#[test]
fn undecodable_record_with_valid_checksum_is_reported() {
    let dir = scratch("undecodable");
    let mut records: Vec<TestRecord> = (0..8).map(common::solid_record).collect();
    records[3] = (
        b"\xFF\xD8\xFF\xE0 definitely not a JPEG body".to_vec(),
        3,
        10,
        10,
    );
    write_dataset(dir.path(), "train", &records, 1, 1);
    let ds = open(dir.path());
    let p = Pipeline::start(
        Arc::clone(&ds),
        sampler(8, 1, 4, Tail::Drop, 2),
        config(
            Output::U8Nhwc,
            Augment::Eval { resize: 32 },
            1,
            OnBadRecord::Replace,
        ),
        0,
        0,
    )
    .unwrap();
    let mut skipped = 0;
    for_each_batch(&p, |_, b| skipped += b.unwrap().skipped);
    let st = p.stats();
    assert_eq!(skipped, 1);
    assert_eq!(st.bad_records.len(), 1);
    assert_eq!(st.bad_records[0].record, 3);
    assert!(
        st.bad_records[0].reason.contains("cannot decode"),
        "{}",
        st.bad_records[0].reason
    );
}

#[test]
fn dropping_the_pipeline_mid_epoch_is_prompt() {
    let dir = scratch("shutdown");
    solid_dataset(dir.path(), 64, 2);
    let ds = open(dir.path());
    let make = || {
        Pipeline::start(
            Arc::clone(&ds),
            sampler(64, 2, 2, Tail::Drop, 4),
            PipelineConfig {
                prefetch: 1,
                ..config(Output::F32Nchw, Augment::Train, 2, OnBadRecord::Replace)
            },
            0,
            0,
        )
        .unwrap()
    };
    // Never consumed: the queues fill and the threads block on them.
    let p = make();
    let mut it = p.replica(0);
    assert!(it.next().unwrap().is_ok());
    let t = Instant::now();
    drop(p);
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "drop took {:?}",
        t.elapsed()
    );
    // The iterator outliving the pipeline ends with an error instead of hanging or stopping
    // silently short of the epoch.
    let rest: Vec<_> = it.collect();
    assert!(rest.len() < 16);
    assert!(matches!(
        rest.last(),
        Some(Err(LoaderError::PipelineStopped { replica: 0, .. }))
    ));
    // Dropped while a consumer holds a batch.
    let p = make();
    let held = p.replica(1).next().unwrap().unwrap();
    let t = Instant::now();
    drop(p);
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(held.len(), 2);
}

#[test]
fn invalid_configurations_are_errors() {
    let dir = scratch("invalid");
    solid_dataset(dir.path(), 8, 1);
    let ds = open(dir.path());
    let bad = [
        PipelineConfig {
            workers: 0,
            ..PipelineConfig::default()
        },
        PipelineConfig {
            prefetch: 0,
            ..PipelineConfig::default()
        },
        PipelineConfig {
            image_size: 0,
            ..PipelineConfig::default()
        },
        PipelineConfig {
            augment: Augment::Eval { resize: 100 },
            ..PipelineConfig::default()
        },
        PipelineConfig {
            std: [0.0, 1.0, 1.0],
            ..PipelineConfig::default()
        },
    ];
    for cfg in bad {
        assert!(
            Pipeline::start(
                Arc::clone(&ds),
                sampler(8, 1, 2, Tail::Drop, 0),
                cfg.clone(),
                0,
                0
            )
            .is_err(),
            "{cfg:?}"
        );
    }
    // Sampler for another record count, and a start step past the end.
    assert!(Pipeline::start(
        Arc::clone(&ds),
        sampler(9, 1, 2, Tail::Drop, 0),
        PipelineConfig::default(),
        0,
        0
    )
    .is_err());
    assert!(Pipeline::start(
        Arc::clone(&ds),
        sampler(8, 1, 2, Tail::Drop, 0),
        PipelineConfig::default(),
        0,
        5
    )
    .is_err());
    // A shard that is not a shard.
    let reader = ShardReader::open(&dir.path().join("manifest.json"));
    assert!(reader.is_err());
}

#[test]
fn next_epoch_reuses_the_pipeline_and_matches_a_fresh_start() {
    let dir = scratch("next-epoch");
    solid_dataset(dir.path(), 40, 2);
    let ds = open(dir.path());
    let cfg = config(Output::U8Nhwc, Augment::Train, 2, OnBadRecord::Replace);
    let p = Pipeline::start(
        Arc::clone(&ds),
        sampler(40, 2, 4, Tail::Drop, 3),
        cfg.clone(),
        0,
        0,
    )
    .unwrap();
    // Abandon epoch 0 part-way, still holding one of its batches.
    let held = p.replica(0).next().unwrap().unwrap();
    let p = p.next_epoch(1, 0).unwrap();
    drop(held);
    let reused = collect(&p);
    let p = p.next_epoch(2, 2).unwrap();
    let reused_resumed = collect(&p);
    let fresh = |epoch, step| {
        collect(
            &Pipeline::start(
                Arc::clone(&ds),
                sampler(40, 2, 4, Tail::Drop, 3),
                cfg.clone(),
                epoch,
                step,
            )
            .unwrap(),
        )
    };
    assert_eq!(reused.len(), 10);
    assert_eq!(reused, fresh(1, 0));
    assert_eq!(reused_resumed, fresh(2, 2));
}

/// Progressive resizing: the next epoch at another size gives that size's batches from its
/// first one, the same as a fresh pipeline at that size (a resume across the change).
#[test]
fn next_epoch_with_another_size_changes_the_shape_at_the_boundary() {
    let dir = scratch("resize-epoch");
    solid_dataset(dir.path(), 40, 2);
    let ds = open(dir.path());
    let small = config(Output::U8Nhwc, Augment::Train, 2, OnBadRecord::Replace);
    let large = PipelineConfig {
        image_size: 48,
        ..small.clone()
    };
    let start = |cfg: &PipelineConfig, epoch, step| {
        Pipeline::start(
            Arc::clone(&ds),
            sampler(40, 1, 4, Tail::Drop, 3),
            cfg.clone(),
            epoch,
            step,
        )
        .unwrap()
    };
    let p = start(&small, 0, 0);
    let shapes =
        |p: &Pipeline| -> Vec<[usize; 4]> { p.replica(0).map(|b| b.unwrap().shape()).collect() };
    assert!(shapes(&p).iter().all(|s| *s == [4, 32, 32, 3]));
    let p = p.next_epoch_with(large.clone(), 1, 0).unwrap();
    let grown = collect(&p);
    assert_eq!(grown.len(), 10);
    assert_eq!(grown, collect(&start(&large, 1, 0)));
    let p = p.next_epoch_with(large.clone(), 1, 0).unwrap();
    assert!(shapes(&p).iter().all(|s| *s == [4, 48, 48, 3]));
    // The thread pool and buffers stay: workers and output type may not change.
    let other = PipelineConfig {
        workers: 3,
        ..large
    };
    assert!(p.next_epoch_with(other, 2, 0).is_err());
}

/// `Tail::Short`: every batch full but the last, which holds the records left.
#[test]
fn short_tail_ends_with_a_short_batch() {
    let dir = scratch("short-tail");
    solid_dataset(dir.path(), 42, 2);
    let ds = open(dir.path());
    let cfg = config(Output::U8Nhwc, Augment::Train, 2, OnBadRecord::Replace);
    let p = Pipeline::start(ds, sampler(42, 1, 8, Tail::Short, 3), cfg, 0, 0).unwrap();
    let (mut shapes, mut ids) = (Vec::new(), HashSet::new());
    for b in p.replica(0) {
        let b = b.unwrap(); // dropped at once: the pool holds a few batches only
        shapes.push(b.shape()[0]);
        ids.extend(b.indices.iter().copied());
    }
    assert_eq!(shapes, [8, 8, 8, 8, 8, 2]);
    assert_eq!(ids.len(), 42, "every record once");
}

#[test]
fn a_consumer_keeping_every_batch_is_fed_when_it_adds_buffers() {
    let dir = scratch("keep");
    solid_dataset(dir.path(), 40, 2);
    let ds = open(dir.path());
    let cfg = config(Output::U8Nhwc, Augment::Train, 1, OnBadRecord::Replace);
    let p = Pipeline::start(ds, sampler(40, 1, 2, Tail::Drop, 5), cfg, 0, 0).unwrap();
    // 20 batches against a pool of 1 * (2 + 1) + 1 buffers: without more buffers the
    // dispatcher would wait forever for one of the kept batches to come back.
    let mut kept: Vec<Batch> = Vec::new();
    for batch in p.replica(0) {
        p.add_buffers(1);
        kept.push(batch.unwrap());
    }
    assert_eq!(kept.len(), 20);
    let steps: Vec<usize> = kept.iter().map(|b| b.step).collect();
    assert_eq!(steps, (0..20).collect::<Vec<_>>());
}
