//! A many-class head (2,000 classes, as ImageNet-22k subsets have) trains with the same
//! bucketing: the head's weight outgrows the bucket size and gets a bucket of its own, the
//! backbone's buckets stay those of a 10-class model, every parameter is in exactly one bucket,
//! the allreduce runs once per bucket in that order, and evaluation reports top-1 and top-5.

use crate::common;

use std::sync::{Arc, Mutex};

use ddl_comm::{thread_group, Algorithm, Allreducer, Op, Topology, Transport};
use ddl_testkit::{write_manifest, write_shards, Record};
use ddl_trainer::config::Overlap;
use ddl_trainer::model::ModelKind;
use ddl_trainer::table::{Layout, ALIGN};
use ddl_trainer::{train, RankInfo};

const CLASSES: usize = 2000;
/// 256 KiB: resnet_small's 64 x 2000 head weight (500 KiB) is larger, its backbone's
/// parameters are not.
const BUCKET_MB: f64 = 0.25;
const BUCKET_BYTES: usize = 256 << 10;

/// The thread transport, with an `mpi` allreduce (a ring underneath) that records the length
/// of every buffer it reduces.
struct Recording {
    inner: Arc<dyn Transport>,
    ring: Allreducer,
    lengths: Arc<Mutex<Vec<usize>>>,
}

impl Transport for Recording {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn send(&self, to: usize, tag: u32, data: &[u8]) -> ddl_comm::Result<()> {
        self.inner.send(to, tag, data)
    }
    fn recv(&self, from: usize, tag: u32, buf: &mut [u8]) -> ddl_comm::Result<()> {
        self.inner.recv(from, tag, buf)
    }
    fn exchange(&self, ops: &mut [Op<'_>]) -> ddl_comm::Result<()> {
        self.inner.exchange(ops)
    }
    fn split(&self, color: usize, key: usize) -> ddl_comm::Result<Box<dyn Transport>> {
        self.inner.split(color, key)
    }
    fn barrier(&self) -> ddl_comm::Result<()> {
        self.inner.barrier()
    }
    fn timeout(&self) -> std::time::Duration {
        self.inner.timeout()
    }
    fn set_timeout(&self, timeout: std::time::Duration) {
        self.inner.set_timeout(timeout)
    }
    fn has_native_allreduce(&self) -> bool {
        true
    }
    fn native_allreduce_f32(&self, buf: &mut [f32]) -> ddl_comm::Result<()> {
        self.lengths.lock().unwrap().push(buf.len());
        self.ring.allreduce_f32(buf, false)
    }
}

fn plan(classes: i64) -> Layout {
    Layout::of_model(
        ModelKind::ResnetSmall,
        classes,
        32,
        Overlap::Backward,
        BUCKET_BYTES,
        false,
    )
}

/// Bucket lengths and parameter names, in reduction order.
fn buckets(layout: &Layout) -> Vec<(usize, Vec<&str>)> {
    layout
        .buckets
        .iter()
        .map(|b| {
            let names = b.params.iter().map(|&i| layout.params[i].name.as_str());
            (b.len, names.collect())
        })
        .collect()
}

#[test]
fn the_head_of_2000_classes_gets_a_bucket_of_its_own_and_the_buckets_cover_every_parameter() {
    let few = plan(10);
    let many = plan(CLASSES as i64);
    // The head is 64 x C weights and C biases; nothing else depends on C.
    assert_eq!(many.parameters(), few.parameters() + 65 * (CLASSES - 10));
    let (b_many, b_few) = (buckets(&many), buckets(&few));
    // 10 classes: the head (650 parameters) is one bucket; 2,000: weight and bias apart.
    let mut head_few = b_few[0].1.clone();
    head_few.sort();
    assert_eq!(head_few, ["fc.bias", "fc.weight"]);
    assert_eq!(b_many[0], (64 * CLASSES, vec!["fc.weight"]));
    assert_eq!(b_many[1], (CLASSES, vec!["fc.bias"]));
    assert_eq!(b_many.len(), b_few.len() + 1, "{b_many:?}");
    assert_eq!(b_many[2..], b_few[1..], "the backbone's buckets changed");
    // Contiguous, in order, every parameter in exactly one bucket and inside its range, no
    // bucket over the size unless it is one parameter.
    let mut seen = vec![0; many.params.len()];
    let mut next = 0;
    for b in &many.buckets {
        assert_eq!(b.start, next);
        assert!(b.len * 4 <= BUCKET_BYTES || b.params.len() == 1, "{b:?}");
        let mut end = b.start;
        for &i in &b.params {
            seen[i] += 1;
            let p = &many.params[i];
            assert_eq!(p.offset, end, "{}", p.name);
            end += p.numel.next_multiple_of(ALIGN);
        }
        assert_eq!(end, b.start + b.len);
        next = end;
    }
    assert_eq!(next, many.total);
    assert!(seen.iter().all(|&n| n == 1), "{seen:?}");
}

#[test]
fn a_2000_class_head_trains_with_one_allreduce_per_bucket_and_reports_top5() {
    let tmp = ddl_testkit::scratch("many-classes");
    let data = tmp.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    // The manifest lists 2,000 classes; the records use labels all over the range, the last
    // class included (a label table or head too small for it would fail).
    let label = |i: usize| {
        if i == 0 {
            CLASSES - 1
        } else {
            i * 131 % CLASSES
        }
    };
    let records = |n: usize, seed: usize| -> Vec<Record> {
        (0..n)
            .map(|i| Record::jpeg(ddl_testkit::jpeg(40, 36, seed + i), label(i) as u32))
            .collect()
    };
    let train_split = write_shards(&data, "train", &[records(8, 0), records(8, 100)], 1);
    let val_split = write_shards(&data, "val", &[records(8, 200)], 1);
    write_manifest(
        &data,
        CLASSES,
        vec![("train", train_split), ("val", val_split)],
        1,
    );
    // 16 records, 2 ranks x 1 replica x batch 4: one epoch is 2 steps, then the evaluation.
    let mut cfg = common::config(&data, "resnet_small", 4, "cpu:1");
    cfg.eval = true;
    cfg.overlap = Some(Overlap::Backward);
    cfg.bucket_mb = BUCKET_MB;
    cfg.allreduce = Algorithm::Mpi;
    // Whole buckets in the plan's order (priority would cut and reorder them).
    cfg.comm_order = ddl_comm::CommOrder::Fifo;
    let ranks = 2;
    let lengths: Vec<Arc<Mutex<Vec<usize>>>> = (0..ranks).map(|_| Arc::default()).collect();
    let summaries: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = thread_group(ranks)
            .into_iter()
            .zip(&lengths)
            .enumerate()
            .map(|(r, (t, lengths))| {
                let cfg = &cfg;
                s.spawn(move || {
                    let inner: Arc<dyn Transport> = Arc::new(t);
                    let topology = Topology::new(1, ranks);
                    let ring = Allreducer::new(inner.clone(), Algorithm::Ring, topology)?;
                    let transport = Arc::new(Recording {
                        inner,
                        ring,
                        lengths: lengths.clone(),
                    });
                    let info = RankInfo {
                        node: 0,
                        nodes: 1,
                        rank_in_node: r,
                        ranks_in_node: ranks,
                        oversubscribed: false,
                    };
                    anyhow::Ok(train(cfg, transport, topology, info)?)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread panicked").expect("training"))
            .collect()
    });
    let epoch = &summaries[0].epochs[0];
    assert_eq!(summaries[0].global_steps, 2);
    assert!(epoch.train_loss.is_some_and(f64::is_finite), "{epoch:?}");
    assert_eq!(epoch.val_images, Some(8), "{epoch:?}");
    let (top1, top5) = (epoch.val_top1.unwrap(), epoch.val_top5.unwrap());
    assert!((0.0..=1.0).contains(&top5) && top1 <= top5, "{epoch:?}");
    // Every step reduced the gradient bucket by bucket, in the plan's order and sizes (the
    // metrics' small reductions come between steps).
    let want: Vec<usize> = plan(CLASSES as i64).buckets.iter().map(|b| b.len).collect();
    for (r, lengths) in lengths.iter().enumerate() {
        let got = lengths.lock().unwrap();
        let steps = got
            .windows(want.len())
            .filter(|w| *w == want.as_slice())
            .count();
        assert_eq!(
            steps, 2,
            "rank {r}: allreduce lengths {got:?}, buckets {want:?}"
        );
    }
}
