//! The exchange between emulated nodes (threads over the in-process transport): every
//! record served once per epoch with its own bytes, several ranks per node, and a node lost
//! mid-exchange.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ddl_comm::{
    thread_group_with_timeout, CommError, Op, Result as CommResult, ThreadTransport, Transport,
};
use ddl_exchange::{Exchange, ExchangeConfig, ExchangeError};
use ddl_loader::dataset::{Dataset, OpenOptions, Residency};
use ddl_testkit::{write_manifest, write_shards, Record};

/// Records of shard `s`: `sizes[s]` JPEGs, labelled by their global id modulo 3.
fn dataset(dir: &Path, sizes: &[usize], nodes: usize) {
    std::fs::create_dir_all(dir).unwrap();
    let mut id = 0;
    let shards: Vec<Vec<Record>> = sizes
        .iter()
        .map(|&n| {
            (0..n)
                .map(|_| {
                    id += 1;
                    Record::jpeg(ddl_testkit::jpeg(8 + id % 5, 8, id), (id % 3) as u32)
                })
                .collect()
        })
        .collect();
    let split = write_shards(dir, "train", &shards, nodes);
    write_manifest(dir, 3, vec![("train", split)], nodes);
}

fn config(fraction: f64, epochs: u64, base: &Path, leader: bool) -> ExchangeConfig {
    ExchangeConfig {
        fraction,
        seed: 9,
        epochs,
        base_dir: base.to_path_buf(),
        leader,
        piece_bytes: 4096,
        lock: false,
    }
}

/// What one rank served: per epoch, (global id, crc32c of the record's bytes, label).
type Served = Vec<Vec<(u64, u32, u32)>>;

/// (global id, crc32c of the bytes, label) of every record `d` serves.
fn contents(d: &Dataset) -> Vec<(u64, u32, u32)> {
    (0..d.len())
        .map(|i| {
            let r = d.record(i).expect("record");
            (d.global_id(i), crc32c::crc32c(r.bytes), r.label)
        })
        .collect()
}

/// Runs `body` on every rank of `nodes x ranks_per_node` (the first of each node its leader)
/// with its rank's exchange of `data` at `fraction` over `epochs` epochs, the arenas under
/// `base`: what each rank returned, with its node, in rank order.
fn on_nodes<T: Send + 'static>(
    (data, base): (&Path, &Path),
    (nodes, ranks_per_node): (usize, usize),
    (fraction, epochs): (f64, u64),
    body: impl Fn(usize, &Path, Exchange) -> T + Send + Clone + 'static,
) -> Vec<(usize, T)> {
    let world = thread_group_with_timeout(nodes * ranks_per_node, Duration::from_secs(30));
    let threads: Vec<_> = world
        .into_iter()
        .enumerate()
        .map(|(rank, t)| {
            let (data, base, body) = (data.to_path_buf(), base.to_path_buf(), body.clone());
            std::thread::spawn(move || {
                let node = rank / ranks_per_node;
                let residency = Residency { node, nodes };
                let home = Dataset::open(&data, "train", residency, &OpenOptions::default())
                    .expect("open");
                let leader = rank % ranks_per_node == 0;
                let t: Arc<dyn Transport> = Arc::new(t);
                let cfg = config(fraction, epochs, &base, leader);
                let x = Exchange::new(t, Arc::new(home), &data, cfg).expect("exchange");
                (node, body(node, &base, x))
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join().expect("rank"))
        .collect()
}

/// Runs `nodes x ranks_per_node` ranks for `epochs` epochs at `fraction`: what each served.
fn run(
    data: &Path,
    base: &Path,
    nodes: usize,
    ranks_per_node: usize,
    fraction: f64,
    epochs: u64,
) -> Vec<(usize, Served)> {
    on_nodes(
        (data, base),
        (nodes, ranks_per_node),
        (fraction, epochs),
        move |_, _, mut x| -> Served {
            (0..epochs)
                .map(|e| contents(&x.epoch(e).expect("epoch")))
                .collect()
        },
    )
}

#[test]
fn every_record_is_served_once_per_epoch_with_its_own_bytes() {
    let tmp = ddl_testkit::scratch("exchange-accounting");
    let data = tmp.path().join("data");
    let sizes = [7, 9, 8, 6, 10, 7];
    dataset(&data, &sizes, 1);
    let truth = run(&data, &tmp.path().join("solo"), 1, 1, 0.0, 1)
        .remove(0)
        .1
        .remove(0);
    for (nodes, ranks, q) in [(2, 1, 0.25), (3, 2, 0.5), (3, 1, 1.0)] {
        let base = tmp.path().join(format!("arenas-{nodes}-{q}"));
        let served = run(&data, &base, nodes, ranks, q, 4);
        for epoch in 0..4 {
            let mut all: Vec<(u64, u32, u32)> = served
                .iter()
                .filter(|(_, s)| !s.is_empty())
                .step_by(ranks)
                .flat_map(|(_, s)| s[epoch].clone())
                .collect();
            all.sort_unstable();
            assert_eq!(all, truth, "{nodes} nodes, Q {q}, epoch {epoch}");
            for pair in served.chunks(ranks) {
                assert!(
                    pair.iter().all(|(_, s)| s[epoch] == pair[0].1[epoch]),
                    "ranks of a node agree"
                );
            }
        }
        let node0: Vec<&Vec<(u64, u32, u32)>> = served[0].1.iter().collect();
        assert_ne!(node0[0], node0[3], "records moved ({nodes} nodes, Q {q})");
        assert!(
            std::fs::read_dir(&base).unwrap().next().is_none(),
            "the arenas are removed at the end"
        );
    }
}

/// The transport of a node that is killed as its transfer into epoch 1 begins: at the first
/// message of its exchange thread, its endpoint is dropped, and the other nodes see its
/// channels close, as they see those of a killed process.
struct KilledAtTransfer {
    inner: Mutex<Option<ThreadTransport>>,
    rank: usize,
    size: usize,
}

impl KilledAtTransfer {
    /// Runs `op` on the endpoint while the node lives.
    fn alive<T>(&self, op: impl FnOnce(&ThreadTransport) -> CommResult<T>) -> CommResult<T> {
        let mut inner = self.inner.lock().unwrap();
        if std::thread::current().name() == Some("ddl-exchange") {
            *inner = None;
        }
        let gone = CommError::Disconnected {
            op: "killed",
            rank: self.rank,
            peer: self.rank,
        };
        inner.as_ref().map_or(Err(gone), op)
    }
}

impl Transport for KilledAtTransfer {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn send(&self, to: usize, tag: u32, data: &[u8]) -> CommResult<()> {
        self.alive(|t| t.send(to, tag, data))
    }
    fn recv(&self, from: usize, tag: u32, buf: &mut [u8]) -> CommResult<()> {
        self.alive(|t| t.recv(from, tag, buf))
    }
    fn exchange(&self, ops: &mut [Op<'_>]) -> CommResult<()> {
        self.alive(|t| t.exchange(ops))
    }
    fn split(&self, color: usize, key: usize) -> CommResult<Box<dyn Transport>> {
        self.alive(|t| t.split(color, key))
    }
    fn barrier(&self) -> CommResult<()> {
        self.alive(|t| t.barrier())
    }
    fn timeout(&self) -> Duration {
        LOSS_TIMEOUT
    }
    fn set_timeout(&self, _: Duration) {}
}

/// The transport's timeout in the loss test: a survivor that waited for it instead of seeing
/// the lost node's channels close fails the test.
const LOSS_TIMEOUT: Duration = Duration::from_secs(30);

#[test]
fn a_node_lost_mid_exchange_fails_every_rank_and_serves_nothing_half_exchanged() {
    let tmp = ddl_testkit::scratch("exchange-loss");
    let data = tmp.path().join("data");
    dataset(&data, &[20, 20, 20], 3);
    let base: PathBuf = tmp.path().join("arenas");
    let world = thread_group_with_timeout(3, LOSS_TIMEOUT);
    let threads: Vec<_> = world
        .into_iter()
        .enumerate()
        .map(|(node, t)| {
            let (data, base) = (data.clone(), base.clone());
            std::thread::spawn(move || -> Result<(), ExchangeError> {
                let residency = Residency { node, nodes: 3 };
                let home =
                    Dataset::open(&data, "train", residency, &OpenOptions::default()).unwrap();
                let t: Arc<dyn Transport> = if node == 2 {
                    let inner = Mutex::new(Some(t));
                    Arc::new(KilledAtTransfer {
                        inner,
                        rank: 2,
                        size: 3,
                    })
                } else {
                    Arc::new(t)
                };
                let mut x = Exchange::new(t, Arc::new(home), &data, config(0.5, 3, &base, true))?;
                x.epoch(0)?;
                if node == 2 {
                    // Killed once its transfer into epoch 1 starts: its transport goes with it.
                    drop(x);
                    return Ok(());
                }
                x.epoch(1).map(|_| ())
            })
        })
        .collect();
    let begun = Instant::now();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    // Each survivor sees a node's channels close (node 2's, or those of the survivor that
    // stopped first), none waits out the timeout.
    let mut gone = Vec::new();
    for (node, r) in results.iter().enumerate().take(2) {
        match r.as_ref().expect_err("a survivor must not serve epoch 1") {
            ExchangeError::Comm {
                source: CommError::Disconnected { peer, .. },
                ..
            } => gone.push(*peer),
            e => panic!("node {node} must see a node gone, not wait for it: {e}"),
        }
    }
    assert!(gone.contains(&2), "nobody saw node 2 gone: {gone:?}");
    assert!(begun.elapsed() < LOSS_TIMEOUT, "{:?}", begun.elapsed());
}

#[test]
fn jumping_to_another_epoch_removes_the_arenas_no_longer_served() {
    let tmp = ddl_testkit::scratch("exchange-jump");
    let data = tmp.path().join("data");
    dataset(&data, &[10, 10], 2);
    let base = tmp.path().join("arenas");
    let nodes = on_nodes((&data, &base), (2, 1), (1.0, 6), |node, base, mut x| {
        for e in [0, 1, 3] {
            x.epoch(e).expect("epoch");
        }
        (arena_names(base, node), x)
    });
    for (_, (kept, _exchange)) in nodes {
        for gone in ["epoch-1.ddl", "epoch-2.ddl"] {
            assert!(
                !kept.iter().any(|k| k == gone),
                "{gone} left among {kept:?}"
            );
        }
        assert!(kept.iter().any(|k| k == "epoch-3.ddl"), "{kept:?}");
    }
}

/// Served epochs 0, 1 and 2, then back to 1 while the transfer into 3 (started when 2 was
/// served) is in flight, then on to 3: the stale transfer ends before any other starts (two
/// transfers never share the wire), its arena and 2's are removed, and epoch 1 again and 3
/// serve each record once with its own bytes, as an uninterrupted run does. Shards that do
/// not divide evenly over the nodes (epoch 0 evens them out).
#[test]
fn going_back_an_epoch_while_a_transfer_is_in_flight_serves_that_epoch_again() {
    let tmp = ddl_testkit::scratch("exchange-back");
    let data = tmp.path().join("data");
    dataset(&data, &[60, 45, 70, 50, 65], 2);
    let straight = run(&data, &tmp.path().join("straight"), 2, 1, 0.5, 4);
    let base = tmp.path().join("arenas");
    let nodes = on_nodes((&data, &base), (2, 1), (0.5, 4), |node, base, mut x| {
        let mut served = Vec::new();
        for e in [0, 1, 2, 1, 3] {
            let ids = contents(&x.epoch(e).expect("epoch"));
            if e == 1 && !served.is_empty() {
                // Back at 1: nothing of 2 or of the transfer into 3 is left.
                let names = arena_names(base, node);
                let stale = |n: &String| n == "epoch-2.ddl" || n == "epoch-3.ddl";
                assert!(!names.iter().any(stale), "node {node}: {names:?}");
            }
            served.push((e, ids));
        }
        served
    });
    for (node, served) in nodes {
        for (e, ids) in served {
            let want = &straight[node].1[e as usize];
            assert_eq!(&ids, want, "node {node}, epoch {e}");
        }
    }
}

/// The arena files of node `node` under `base`.
fn arena_names(base: &Path, node: usize) -> Vec<String> {
    let dir = std::fs::read_dir(base)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(&format!("node{node}")))
        .expect("the node's arena directory");
    std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".ddl"))
        .collect()
}
