//! ddl-exchange: records move between nodes at every epoch boundary.
//!
//! Every node serves the records the placement ([`ddl_loader::placement`]) gives it in each
//! epoch: those of its own shards, mapped as always, and those of other nodes, received over
//! the job's transport into an *arena* (a shard file in a node-local directory the node's
//! ranks map together, see [`arena`]). Going from epoch `e` to `e + 1`, a node keeps the
//! records of other nodes it holds in both (copied from the old arena into the new one) and
//! receives the others from the nodes whose shards hold them ([`wire`]); the old arena is
//! removed once the new one is served. The transfer for epoch `e + 1` runs on the leader
//! rank's own thread during epoch `e`, so the boundary only waits for what is not done yet.
//!
//! Every rank of the job calls [`Exchange::epoch`] at the start of every epoch; the ranks
//! agree that every node's arena is complete before any serves it, so a failed or
//! interrupted exchange is never half applied.

#![warn(missing_docs)]

mod arena;
pub mod error;
pub mod memory;
mod wire;

use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use ddl_comm::{collective, Transport};
use ddl_loader::dataset::Dataset;
use ddl_loader::placement::{difference, Holdings, Placement};
use ddl_loader::shard::{ShardReader, ShardWriter};

use arena::ArenaDir;
pub use error::{ExchangeError, Result};
pub use wire::Moved;

/// How a job exchanges records.
#[derive(Clone, Debug)]
pub struct ExchangeConfig {
    /// Fraction of every node's records exchanged at each epoch boundary, in `[0, 1]`.
    pub fraction: f64,
    /// Seed of the placement; the same on every rank.
    pub seed: u64,
    /// Epochs of the run: nothing is exchanged into a later one. [`u64::MAX`] for a run of
    /// unknown length (a Python loader): the memory check then assumes a node may hold as many
    /// records of other nodes as it holds in all.
    pub epochs: u64,
    /// Node-local directory under which the arenas live
    /// ([`ExchangeConfig::default_base_dir`] by default).
    pub base_dir: PathBuf,
    /// Whether this rank sends and receives its node's records (one rank per node).
    pub leader: bool,
    /// Target bytes of the piece a node sends a peer at once.
    pub piece_bytes: usize,
    /// `mlock` every arena, as the node's shards are with `--mlock`.
    pub lock: bool,
}

impl ExchangeConfig {
    /// Default target of a piece: large enough to keep a link busy, small enough that one
    /// piece per peer stays a few hundred MiB on a thousand nodes.
    pub const PIECE_BYTES: usize = 8 << 20;

    /// Where the arenas live unless a job says otherwise: memory the node's ranks share
    /// (`/dev/shm`), else the temporary directory.
    pub fn default_base_dir() -> PathBuf {
        let shm = PathBuf::from("/dev/shm");
        if shm.is_dir() {
            shm
        } else {
            std::env::temp_dir()
        }
    }
}

/// What the transfer into the epoch being served moved, and how long it took.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EpochExchange {
    /// Records and bytes this node received and sent.
    pub moved: Moved,
    /// Seconds the transfer took on the leader's thread.
    pub transfer_s: f64,
    /// Seconds the epoch's start waited for it.
    pub wait_s: f64,
}

/// One rank's part in the record exchange of one split; see the crate documentation.
///
/// # Examples
///
/// Two nodes (threads here, each its own leader) with two shards of five records: at
/// `Q = 1` they swap records, and every record is served by exactly one node each epoch.
///
/// ```
/// use std::sync::Arc;
/// use ddl_comm::{thread_group, Transport};
/// use ddl_exchange::{Exchange, ExchangeConfig};
/// use ddl_loader::dataset::{Dataset, OpenOptions, Residency};
/// use ddl_testkit::{write_manifest, write_shards, Record};
///
/// let tmp = ddl_testkit::scratch("exchange-example");
/// let (data, base) = (tmp.path().join("data"), tmp.path().join("arenas"));
/// std::fs::create_dir_all(&data).unwrap();
/// let shard = |s: usize| (0..5).map(|i| Record::jpeg(ddl_testkit::jpeg(8, 8, s * 5 + i), 0)).collect();
/// let split = write_shards(&data, "train", &[shard(0), shard(1)], 2);
/// write_manifest(&data, 1, vec![("train", split)], 2);
///
/// let nodes: Vec<_> = thread_group(2).into_iter().enumerate().map(|(node, t)| {
///     let (data, base) = (data.clone(), base.clone());
///     std::thread::spawn(move || -> ddl_exchange::Result<Vec<Vec<u64>>> {
///         let home = Dataset::open(&data, "train", Residency { node, nodes: 2 }, &OpenOptions::default()).unwrap();
///         let cfg = ExchangeConfig {
///             fraction: 1.0, seed: 3, epochs: 3, base_dir: base, leader: true,
///             piece_bytes: ExchangeConfig::PIECE_BYTES, lock: false,
///         };
///         let mut exchange = Exchange::new(Arc::new(t) as Arc<dyn Transport>, Arc::new(home), &data, cfg)?;
///         (0..3).map(|e| {
///             let served = exchange.epoch(e)?;
///             Ok((0..served.len()).map(|i| served.global_id(i)).collect())
///         }).collect()
///     })
/// }).collect();
/// let served: Vec<Vec<Vec<u64>>> = nodes.into_iter().map(|n| n.join().unwrap().unwrap()).collect();
/// for epoch in 0..3 {
///     let mut all: Vec<u64> = served.iter().flat_map(|node| node[epoch].clone()).collect();
///     all.sort_unstable();
///     assert_eq!(all, (0..10).collect::<Vec<u64>>());
/// }
/// assert_eq!(served[0][0], [0, 1, 2, 3, 4]); // epoch 0: the node's own shard
/// ```
pub struct Exchange {
    shared: Arc<Shared>,
    transport: Arc<dyn Transport>,
    leader: bool,
    epochs: u64,
    lock: bool,
    /// The epoch served, the holdings its records follow (those of an earlier epoch when
    /// nothing changed since: their epoch names the arena) and its view.
    serving: Option<(u64, Holdings, Arc<Dataset>)>,
    /// The leader's transfer into the next epoch.
    next: Option<(u64, JoinHandle<Result<Prepared>>)>,
    last: Option<EpochExchange>,
}

/// What the leader's transfers share with the exchange.
struct Shared {
    transport: Arc<dyn Transport>,
    placement: Placement,
    home: Arc<Dataset>,
    dir: ArenaDir,
    node: usize,
    /// World rank of each node's leader.
    leaders: Vec<usize>,
    per_piece: usize,
}

/// A finished transfer into an epoch.
struct Prepared {
    moved: Moved,
    transfer_s: f64,
}

/// Which records a node keeps in, and receives into, its next arena, and which it sends.
struct Routing {
    /// Records of other nodes held in both epochs (copied from the old arena), ascending.
    kept: Vec<u32>,
    /// Per node: the records this node sends it, ascending.
    sends: Vec<Vec<u32>>,
    /// Per node: the records this node receives from it, ascending.
    receives: Vec<Vec<u32>>,
}

impl Exchange {
    /// Joins the exchange of the records of `home`'s split (opened from `data`). Collective:
    /// every rank of `transport` calls it, with one leader per node.
    ///
    /// Fails on every rank when a node has no leader or several, when the fraction is
    /// outside `[0, 1]`, when a node's memory cannot hold its arenas ([`memory`]) or when
    /// another job holds a node's arena directory.
    pub fn new(
        transport: Arc<dyn Transport>,
        home: Arc<Dataset>,
        data: &std::path::Path,
        cfg: ExchangeConfig,
    ) -> Result<Exchange> {
        let residency = home.residency();
        let node = residency.node;
        let info = home
            .manifest()
            .split(data, home.split())
            .map_err(|source| ExchangeError::Loader { node, source })?;
        let shard_records: Vec<u64> = info.shards.iter().map(|s| s.records).collect();
        let split_bytes: u64 = info.shards.iter().map(|s| s.bytes).sum();
        let placement = Placement::new(&shard_records, residency.nodes, cfg.fraction, cfg.seed)
            .map_err(|source| ExchangeError::Loader { node, source })?;
        let avg = split_bytes as f64 / placement.records().max(1) as f64;
        let leaders = leaders(&*transport, node, residency.nodes, cfg.leader)?;
        let path = ArenaDir::path(&cfg.base_dir, data, home.split(), node);
        let dir = if cfg.leader && cfg.fraction > 0.0 {
            let most = placement.most_foreign(node, cfg.epochs) as u64;
            memory::check(cfg.fraction, node, most, avg, &cfg.base_dir)
                .and_then(|()| ArenaDir::claim(path))
        } else {
            Ok(ArenaDir::shared(path))
        };
        let dir = agree(&*transport, node, u64::MAX, dir)?;
        let per_piece = ((cfg.piece_bytes as f64 / avg.max(1.0)) as usize).max(1);
        Ok(Exchange {
            shared: Arc::new(Shared {
                transport: transport.clone(),
                placement,
                home,
                dir,
                node,
                leaders,
                per_piece,
            }),
            transport,
            leader: cfg.leader,
            epochs: cfg.epochs,
            lock: cfg.lock,
            serving: None,
            next: None,
            last: None,
        })
    }

    /// The records this node serves in `epoch`, once every node's are in place; starts the
    /// transfer into the next epoch whose records differ. Collective: every rank calls it at
    /// the start of each epoch, the same epoch (ranks starting different epochs all fail,
    /// naming them, at once).
    pub fn epoch(&mut self, epoch: u64) -> Result<Arc<Dataset>> {
        let shared = self.shared.clone();
        if !shared.placement.exchanges() {
            return Ok(shared.home.clone());
        }
        same_epoch(&*self.transport, shared.node, epoch)?;
        if let Some((served, h, view)) = &self.serving {
            // The same epoch again, or the next one holding the same records: no transfer.
            let unchanged = *served + 1 == epoch && !shared.placement.changes_into(epoch);
            if *served == epoch || unchanged {
                let (h, view) = (h.clone(), view.clone());
                if *served != epoch {
                    self.last = Some(EpochExchange::default());
                    self.prefetch(epoch, &h, &view)?;
                }
                self.serving = Some((epoch, h, view.clone()));
                return Ok(view);
            }
        }
        // The arenas this node no longer serves once `epoch` is in place.
        let mut done_with: Vec<u64> = self.serving.iter().map(|(_, h, _)| h.epoch()).collect();
        let to = shared.placement.holdings(epoch);
        let from = match self.serving.take() {
            Some((served, h, _)) if served + 1 == epoch => h,
            _ => shared.placement.home_holdings(),
        };
        let waited = Instant::now();
        let prepared = if self.leader {
            match self.next.take() {
                Some((e, handle)) if e == epoch => join(handle, shared.node),
                stale => {
                    // A transfer into an epoch not served (the caller went elsewhere) ends
                    // first: two transfers never share the wire. Every leader ends its own.
                    if let Some((e, handle)) = stale {
                        let _ = join(handle, shared.node);
                        done_with.push(e);
                    }
                    let current = shared.home.clone();
                    write_arena(&shared, epoch, &from, &to, &current)
                }
            }
        } else {
            Ok(Prepared {
                moved: Moved::default(),
                transfer_s: 0.0,
            })
        };
        let wait_s = waited.elapsed().as_secs_f64();
        let prepared = agree(&*self.transport, shared.node, epoch, prepared)?;
        let view = self.view(&from, &to).map(Arc::new);
        // Every rank has mapped the epoch's arena before its leader may remove it.
        let view = agree(&*self.transport, shared.node, epoch, view)?;
        if self.leader {
            for old in done_with.into_iter().filter(|&e| e != epoch) {
                shared.dir.release(old)?;
            }
        }
        self.prefetch(epoch, &to, &view)?;
        self.last = Some(EpochExchange {
            moved: prepared.moved,
            transfer_s: prepared.transfer_s,
            wait_s,
        });
        self.serving = Some((epoch, to, view.clone()));
        Ok(view)
    }

    /// On the leader, starts the transfer into `epoch + 1` from `held` (served as `view` in
    /// `epoch`) when that epoch is in the run and holds other records.
    fn prefetch(&mut self, epoch: u64, held: &Holdings, view: &Arc<Dataset>) -> Result<()> {
        let shared = self.shared.clone();
        let next_epoch = epoch + 1;
        if !self.leader || next_epoch >= self.epochs || !shared.placement.changes_into(next_epoch) {
            return Ok(());
        }
        let (from, view) = (held.clone(), view.clone());
        let handle = std::thread::Builder::new()
            .name("ddl-exchange".into())
            .spawn(move || {
                let next = shared.placement.holdings(next_epoch);
                write_arena(&shared, next_epoch, &from, &next, &view)
            })
            .map_err(|source| ExchangeError::Io {
                op: "start the exchange thread for",
                path: PathBuf::from(format!("epoch {next_epoch}")),
                source,
            })?;
        self.next = Some((next_epoch, handle));
        Ok(())
    }

    /// What the transfer into the epoch being served moved (zeros on a node's other ranks).
    pub fn last(&self) -> Option<EpochExchange> {
        self.last
    }

    /// The placement the exchange follows.
    pub fn placement(&self) -> &Placement {
        &self.shared.placement
    }

    /// The view of the records the node holds in `to`'s epoch, arriving from `from`'s.
    fn view(&self, from: &Holdings, to: &Holdings) -> Result<Dataset> {
        let shared = &self.shared;
        let node = shared.node;
        let loader = |source| ExchangeError::Loader { node, source };
        let routing = routing(&shared.placement, node, from, to);
        let mut arena_ids = routing.kept;
        arena_ids.extend(wire::arrival_order(&routing.receives, shared.per_piece));
        let arena = if arena_ids.is_empty() {
            None
        } else {
            let reader = ShardReader::open(&shared.dir.arena(to.epoch())).map_err(loader)?;
            if self.lock {
                reader.lock().map_err(loader)?;
            }
            Some((reader, arena_ids.as_slice()))
        };
        shared.home.holding(to.node(node), arena).map_err(loader)
    }
}

impl Drop for Exchange {
    /// Waits for a transfer in flight (the other leaders finish theirs too, or fail within
    /// the transport's timeout), so that the arena directory is left clean.
    fn drop(&mut self) {
        if let Some((_, handle)) = self.next.take() {
            let _ = handle.join();
        }
    }
}

/// The world rank of every node's leader; fails on every rank unless each node has one.
fn leaders(t: &dyn Transport, node: usize, nodes: usize, leader: bool) -> Result<Vec<usize>> {
    let comm = |source| ExchangeError::Comm { node, source };
    let mine = [(node as u64).to_le_bytes(), u64::from(leader).to_le_bytes()].concat();
    let all = collective::allgather_bytes(t, mine).map_err(comm)?;
    let mut leaders = vec![Vec::new(); nodes];
    for (rank, b) in all.iter().enumerate() {
        let word = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        let (n, is_leader) = (word(0) as usize, word(8) == 1);
        if is_leader && n < nodes {
            leaders[n].push(rank);
        }
    }
    match leaders.iter().position(|l| l.len() != 1) {
        Some(n) => Err(ExchangeError::Comm {
            node,
            source: ddl_comm::CommError::InvalidArgument(format!(
                "node {n} has {} exchange leaders (ranks {:?}); each node needs one",
                leaders[n].len(),
                leaders[n]
            )),
        }),
        None => Ok(leaders.into_iter().map(|l| l[0]).collect()),
    }
}

/// Fails on every rank, naming each rank's epoch, unless every rank starts `epoch`.
fn same_epoch(t: &dyn Transport, node: usize, epoch: u64) -> Result<()> {
    let all = collective::allgather_bytes(t, epoch.to_le_bytes().to_vec())
        .map_err(|source| ExchangeError::Comm { node, source })?;
    let mut asked: Vec<(u64, Vec<usize>)> = Vec::new();
    for (rank, bytes) in all.iter().enumerate() {
        let e = u64::from_le_bytes(bytes.as_slice().try_into().unwrap_or([0xff; 8]));
        match asked.iter_mut().find(|(a, _)| *a == e) {
            Some((_, ranks)) => ranks.push(rank),
            None => asked.push((e, vec![rank])),
        }
    }
    if asked.len() > 1 {
        return Err(ExchangeError::EpochsDiffer { asked });
    }
    Ok(())
}

/// `result` on every rank once all agree it succeeded; else this rank's error, or on the
/// ranks whose part succeeded, which nodes failed.
fn agree<T>(t: &dyn Transport, node: usize, epoch: u64, result: Result<T>) -> Result<T> {
    let comm = |source| ExchangeError::Comm { node, source };
    let mine = [
        (node as u64).to_le_bytes(),
        u64::from(result.is_ok()).to_le_bytes(),
    ]
    .concat();
    let all = collective::allgather_bytes(t, mine).map_err(comm)?;
    let mut failed: Vec<usize> = all
        .iter()
        .filter(|b| b.len() == 16 && b[8] == 0)
        .map(|b| u64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])) as usize)
        .collect();
    failed.dedup();
    match result {
        Ok(v) if failed.is_empty() => Ok(v),
        Ok(_) => Err(ExchangeError::Elsewhere { epoch, failed }),
        Err(e) => Err(e),
    }
}

/// The transfer thread's result, its panic an error naming the node.
fn join(handle: JoinHandle<Result<Prepared>>, node: usize) -> Result<Prepared> {
    handle.join().unwrap_or_else(|_| {
        Err(ExchangeError::Corrupt {
            node,
            from: node,
            what: "nothing: its exchange thread panicked".into(),
        })
    })
}

/// Which records `node` keeps, sends and receives going from `from` to `to`.
fn routing(placement: &Placement, node: usize, from: &Holdings, to: &Holdings) -> Routing {
    let nodes = placement.nodes();
    let foreign = |ids: Vec<u32>| -> Vec<u32> {
        ids.into_iter()
            .filter(|&id| placement.home(id) != node)
            .collect()
    };
    let new = difference(to.node(node), from.node(node));
    let kept = foreign(difference(to.node(node), &new));
    let mut receives = vec![Vec::new(); nodes];
    for id in new {
        let home = placement.home(id);
        if home != node {
            receives[home].push(id);
        }
    }
    let sends = (0..nodes)
        .map(|p| {
            if p == node {
                return Vec::new();
            }
            difference(to.node(p), from.node(p))
                .into_iter()
                .filter(|&id| placement.home(id) == node)
                .collect()
        })
        .collect();
    Routing {
        kept,
        sends,
        receives,
    }
}

/// The leader's transfer into `epoch`: the arena of the records of other nodes `to` gives
/// this node, those it keeps copied from `current` (the view of `from`'s epoch) and the
/// others received, while it sends its own records the other nodes need.
fn write_arena(
    shared: &Shared,
    epoch: u64,
    from: &Holdings,
    to: &Holdings,
    current: &Dataset,
) -> Result<Prepared> {
    let started = Instant::now();
    let node = shared.node;
    let loader = |source| ExchangeError::Loader { node, source };
    let routing = routing(&shared.placement, node, from, to);
    let count = routing.kept.len() + routing.receives.iter().map(Vec::len).sum::<usize>();
    let mut writer = match count {
        0 => None,
        n => Some(ShardWriter::with_capacity(&shared.dir.arena(epoch), n as u64).map_err(loader)?),
    };
    if let Some(w) = writer.as_mut() {
        let ids = current.global_ids();
        for id in &routing.kept {
            let i = ids.binary_search(id).map_err(|_| {
                loader(ddl_loader::LoaderError::InvalidConfig(format!(
                    "record {id} is to be kept but the records of epoch {} do not hold it",
                    from.epoch()
                )))
            })?;
            let r = current.record(i).map_err(loader)?;
            w.push(r.bytes, r.label, r.height, r.width)
                .map_err(loader)?;
        }
    }
    let routes = wire::Routes {
        node,
        leaders: &shared.leaders,
        sends: &routing.sends,
        receives: &routing.receives,
        per_piece: shared.per_piece,
    };
    let mut arrived = 0u64;
    let mut sink = |_: u32, r: ddl_loader::shard::Record<'_>| -> Result<()> {
        match writer.as_mut() {
            Some(w) => {
                arrived += 1;
                w.push(r.bytes, r.label, r.height, r.width).map_err(loader)
            }
            None => Err(loader(ddl_loader::LoaderError::InvalidConfig(
                "a record arrived for an empty arena".into(),
            ))),
        }
    };
    let mut moved = wire::transfer(&*shared.transport, &routes, &shared.home, &mut sink)?;
    // What the arena holds of other nodes' records, not what the routes expected.
    moved.records_in = arrived;
    if let Some(w) = writer {
        w.finish().map_err(loader)?;
    }
    Ok(Prepared {
        moved,
        transfer_s: started.elapsed().as_secs_f64(),
    })
}
