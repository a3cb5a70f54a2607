//! Node residency: the shards of one split that this node holds in RAM.
//!
//! With `P` nodes, node `n` owns shard `s` of a split when `s % P == n` (the manifest's
//! `ShardInfo::node` records this assignment for the pack-time node count; a reader given
//! another `P` recomputes it). [`Dataset::open`] maps exactly those shards, optionally after
//! copying them to node-local storage (`/dev/shm`), and optionally pre-faults and locks them so
//! that no epoch ever waits on storage.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{LoaderError, Result};
use crate::manifest::Manifest;
use crate::shard::{IndexRow, Record, ShardReader};
use crate::stage::{self, StageClaim};

/// Which node this process runs on and how many nodes share the dataset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Residency {
    /// This node's index, `0..nodes`.
    pub node: usize,
    /// Number of nodes.
    pub nodes: usize,
}

/// How to bring a node's shards into memory.
#[derive(Clone, Debug, Default)]
pub struct OpenOptions {
    /// Pre-fault every page at open (`madvise(WILLNEED)` and a touch per page).
    pub populate: bool,
    /// `mlock` every shard (fails with a message naming `RLIMIT_MEMLOCK` when it is too low).
    pub lock: bool,
    /// Copy the node's shards into this node-local directory first (e.g. `/dev/shm/ddl`) and
    /// map the copies. A file already there with the manifest's size and whole-file crc32c is
    /// reused.
    pub stage: Option<PathBuf>,
}

/// One shard this node owns.
#[derive(Debug)]
struct NodeShard {
    reader: Arc<ShardReader>,
    /// Global id of the shard's first record: records of all earlier shards of the split.
    global_base: u64,
}

/// The records of one split that this node serves, memory-mapped. `Send + Sync`.
///
/// Records are addressed by a node-local index `0..len()`. Opened with [`Dataset::open`], the
/// node serves the shards it owns (shards in split order, records in shard order); a view
/// made with [`Dataset::holding`] serves a given set of records instead, ascending by global
/// id. Each record also has a global id, its position in the whole split (earlier shards'
/// records first), which is the same on every node and for every node count.
#[derive(Debug)]
pub struct Dataset {
    manifest: Manifest,
    split: String,
    residency: Residency,
    shards: Vec<NodeShard>,
    /// `starts[k]` is the node-local index of shard k's first record; one extra entry = len.
    starts: Vec<usize>,
    /// The records a view serves, in place of every record of `shards`.
    held: Option<Held>,
    /// The claim on the stage directory the shards were staged into, held while they are
    /// mapped (by this dataset or a view of it).
    _stage: Option<Arc<StageClaim>>,
}

/// The records a [`Dataset::holding`] view serves.
#[derive(Debug)]
struct Held {
    /// Global ids, ascending.
    ids: Vec<u32>,
    /// Where each lives: the index in `shards` and the record within it.
    at: Vec<(u32, u32)>,
}

impl Dataset {
    /// Opens the shards of `split` in `dir` that node `residency.node` owns.
    ///
    /// Every shard must exist, pass [`ShardReader::open`]'s checks and match the manifest's
    /// record count and size; otherwise the error names the file. With `opts.stage` the shards
    /// are first copied there (see [`OpenOptions::stage`]); `populate` and `lock` apply to the
    /// mapped files.
    ///
    /// # Examples
    ///
    /// A folder tree of JPEGs packed into shards, then opened by the second of two nodes,
    /// which holds half of the records:
    ///
    /// ```
    /// use ddl_loader::dataset::{Dataset, OpenOptions, Residency};
    /// use ddl_loader::pack::{pack, NoProgress, PackOptions};
    ///
    /// let tmp = ddl_testkit::scratch("dataset-example");
    /// let (images, shards) = (tmp.path().join("imagenet"), tmp.path().join("shards"));
    /// for (class, wnid) in ["n01440764", "n01443537"].iter().enumerate() {
    ///     let dir = images.join("train").join(wnid);
    ///     std::fs::create_dir_all(&dir)?;
    ///     for i in 0..4 {
    ///         let jpeg = ddl_testkit::jpeg(32, 32, class * 10 + i);
    ///         std::fs::write(dir.join(format!("{i}.JPEG")), jpeg)?;
    ///     }
    /// }
    /// let mut opts = PackOptions::new(&images, &shards);
    /// opts.nodes = 2;
    /// pack(&opts, &NoProgress)?;
    ///
    /// let second = Residency { node: 1, nodes: 2 };
    /// let data = Dataset::open(&shards, "train", second, &OpenOptions::default())?;
    /// assert_eq!(data.len(), 4);
    /// let record = data.record(0)?;
    /// assert!(record.label < 2 && record.bytes.starts_with(&[0xFF, 0xD8]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open(
        dir: &Path,
        split: &str,
        residency: Residency,
        opts: &OpenOptions,
    ) -> Result<Dataset> {
        let own = |s: usize, _: std::ops::Range<u64>| s % residency.nodes == residency.node;
        Dataset::open_shards(dir, split, residency, opts, own)
    }

    /// A view serving the records `ids` of `split` in `dir` (global ids, ascending) on node
    /// `residency.node`: its own shards and those of other nodes that hold some of `ids`,
    /// opened as [`Dataset::open`] opens a node's shards. How a node serves the records that
    /// even the nodes out when the shards do not ([`crate::placement`]): read from the
    /// directory every node sees, as the rest of an epoch resumed on another layout is.
    ///
    /// Fails as [`Dataset::open`] does, and when `ids` is not ascending or names a record
    /// beyond the split.
    pub fn open_holding(
        dir: &Path,
        split: &str,
        residency: Residency,
        ids: &[u32],
        opts: &OpenOptions,
    ) -> Result<Dataset> {
        let wanted = |s: usize, range: std::ops::Range<u64>| {
            let first = ids.partition_point(|&id| u64::from(id) < range.start);
            s % residency.nodes == residency.node
                || ids
                    .get(first)
                    .is_some_and(|&id| range.contains(&u64::from(id)))
        };
        Dataset::open_shards(dir, split, residency, opts, wanted)?.holding(ids, None)
    }

    /// The shards `s` of `split` in `dir` for which `wanted(s, their global ids)`, opened for
    /// node `residency.node` ([`Dataset::open`]).
    fn open_shards(
        dir: &Path,
        split: &str,
        residency: Residency,
        opts: &OpenOptions,
        wanted: impl Fn(usize, std::ops::Range<u64>) -> bool,
    ) -> Result<Dataset> {
        if residency.nodes == 0 || residency.node >= residency.nodes {
            return Err(LoaderError::InvalidConfig(format!(
                "node {} of {} nodes",
                residency.node, residency.nodes
            )));
        }
        let manifest = Manifest::load(dir)?;
        let info = manifest.split(dir, split)?.clone();
        // The ranks of a node stage one at a time, and never over another job's shards
        // (`stage`); the staging lock is released at the end of this function.
        let (_staging, stage_claim) = match &opts.stage {
            Some(stage) => {
                let (staging, claim) = stage::claim(stage, dir)?;
                (Some(staging), Some(Arc::new(claim)))
            }
            None => (None, None),
        };
        let mut shards = Vec::new();
        let mut starts = vec![0usize];
        let mut global_base = 0u64;
        for (s, sh) in info.shards.iter().enumerate() {
            let base = global_base;
            global_base += sh.records;
            if !wanted(s, base..global_base) {
                continue;
            }
            let source = dir.join(&sh.file);
            let path = match &opts.stage {
                Some(stage) => {
                    let dst = stage.join(&sh.file);
                    stage::stage_file(&source, &dst, sh.bytes, sh.crc32c)?;
                    dst
                }
                None => source,
            };
            let reader = ShardReader::open(&path)?;
            if reader.len() as u64 != sh.records || reader.file_bytes() != sh.bytes {
                return Err(LoaderError::ShardMismatch {
                    path,
                    reason: format!(
                        "{} records and {} bytes, the manifest says {} records and {} bytes",
                        reader.len(),
                        reader.file_bytes(),
                        sh.records,
                        sh.bytes
                    ),
                });
            }
            reader.check_labels(manifest.num_classes())?;
            if opts.populate {
                reader.populate()?;
            }
            if opts.lock {
                reader.lock()?;
            }
            starts.push(starts[starts.len() - 1] + reader.len());
            shards.push(NodeShard {
                reader: Arc::new(reader),
                global_base: base,
            });
        }
        if shards.is_empty() {
            return Err(LoaderError::InvalidConfig(format!(
                "{}: split {split:?} has {} shards, none of them for node {} of {} \
                 (use at most as many nodes as shards)",
                dir.display(),
                info.shards.len(),
                residency.node,
                residency.nodes
            )));
        }
        Ok(Dataset {
            manifest,
            split: split.to_string(),
            residency,
            shards,
            starts,
            held: None,
            _stage: stage_claim,
        })
    }

    /// A view serving the records `ids` (global ids, ascending) of this node's shards and of
    /// `arena`, a shard holding other nodes' records whose global ids are `arena_ids` (one per
    /// record, in file order): what a node holds in an epoch of a record exchange
    /// ([`crate::placement`]). The shards stay mapped once, shared with `self`.
    ///
    /// Fails when `ids` is not ascending, or names a record neither this node's shards nor
    /// the arena hold, or the arena's labels exceed the class count.
    pub fn holding(&self, ids: &[u32], arena: Option<(ShardReader, &[u32])>) -> Result<Dataset> {
        let mut shards: Vec<NodeShard> = self
            .shards
            .iter()
            .map(|s| NodeShard {
                reader: Arc::clone(&s.reader),
                global_base: s.global_base,
            })
            .collect();
        let mut arena_at: Vec<(u32, u32)> = Vec::new();
        if let Some((reader, arena_ids)) = arena {
            if reader.len() != arena_ids.len() {
                return Err(LoaderError::ShardMismatch {
                    path: reader.path().to_path_buf(),
                    reason: format!(
                        "{} records, the exchange expected {}",
                        reader.len(),
                        arena_ids.len()
                    ),
                });
            }
            reader.check_labels(self.manifest.num_classes())?;
            arena_at = arena_ids
                .iter()
                .zip(0u32..)
                .map(|(&id, r)| (id, r))
                .collect();
            arena_at.sort_unstable();
            shards.push(NodeShard {
                reader: Arc::new(reader),
                global_base: u64::MAX,
            });
        }
        let arena_index = (shards.len() - 1) as u32;
        let mut at = Vec::with_capacity(ids.len());
        for (i, &id) in ids.iter().enumerate() {
            if i > 0 && ids[i - 1] >= id {
                return Err(LoaderError::InvalidConfig(format!(
                    "held records are not ascending at {i}: {} then {id}",
                    ids[i - 1]
                )));
            }
            let home = self.home_index(u64::from(id));
            let place = match home {
                Some((k, r)) => (k as u32, r as u32),
                None => match arena_at.binary_search_by_key(&id, |&(a, _)| a) {
                    Ok(p) => (arena_index, arena_at[p].1),
                    Err(_) => {
                        return Err(LoaderError::InvalidConfig(format!(
                            "record {id} of split {:?} is neither in node {}'s shards nor in \
                             the records it received",
                            self.split, self.residency.node
                        )))
                    }
                },
            };
            at.push(place);
        }
        Ok(Dataset {
            manifest: self.manifest.clone(),
            split: self.split.clone(),
            residency: self.residency,
            shards,
            starts: self.starts.clone(),
            held: Some(Held {
                ids: ids.to_vec(),
                at,
            }),
            _stage: self._stage.clone(),
        })
    }

    /// The home shard (index in `shards`) and record of global id `id`, if this node's shards
    /// hold it.
    fn home_index(&self, id: u64) -> Option<(usize, usize)> {
        let home = &self.shards[..self.starts.len() - 1];
        let k = home
            .partition_point(|s| s.global_base <= id)
            .checked_sub(1)?;
        let r = (id - home[k].global_base) as usize;
        (r < home[k].reader.len()).then_some((k, r))
    }

    /// The manifest of the packed dataset.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The split this dataset holds.
    pub fn split(&self) -> &str {
        &self.split
    }

    /// This node's residency.
    pub fn residency(&self) -> Residency {
        self.residency
    }

    /// Number of records on this node.
    pub fn len(&self) -> usize {
        match &self.held {
            Some(held) => held.ids.len(),
            None => self.starts[self.starts.len() - 1],
        }
    }

    /// True when this node holds no records (never, for an opened dataset).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The shard holding node-local record `i` and the record's index within it.
    ///
    /// # Panics
    ///
    /// When `i >= len()` (a caller bug).
    pub fn locate(&self, i: usize) -> (&ShardReader, usize) {
        assert!(
            i < self.len(),
            "record {i} out of range ({} records on this node)",
            self.len()
        );
        if let Some(held) = &self.held {
            let (k, r) = held.at[i];
            return (&self.shards[k as usize].reader, r as usize);
        }
        let k = self.starts.partition_point(|&s| s <= i) - 1;
        (&self.shards[k].reader, i - self.starts[k])
    }

    /// Node-local record `i`, with its checksum verified (errors name shard file and record).
    ///
    /// # Panics
    ///
    /// When `i >= len()` (a caller bug).
    pub fn record(&self, i: usize) -> Result<Record<'_>> {
        let (reader, r) = self.locate(i);
        reader.record(r)
    }

    /// Index row of node-local record `i` (label and size without touching the data).
    ///
    /// # Panics
    ///
    /// When `i >= len()` (a caller bug).
    pub fn row(&self, i: usize) -> IndexRow {
        let (reader, r) = self.locate(i);
        reader.row(r)
    }

    /// Global id of node-local record `i`: its position in the whole split.
    ///
    /// # Panics
    ///
    /// When `i >= len()` (a caller bug).
    pub fn global_id(&self, i: usize) -> u64 {
        assert!(
            i < self.len(),
            "record {i} out of range ({} records on this node)",
            self.len()
        );
        if let Some(held) = &self.held {
            return u64::from(held.ids[i]);
        }
        let k = self.starts.partition_point(|&s| s <= i) - 1;
        self.shards[k].global_base + (i - self.starts[k]) as u64
    }

    /// Global ids of the node's records, ascending (node-local index `i` is the `i`-th).
    pub fn global_ids(&self) -> Vec<u32> {
        match &self.held {
            Some(held) => held.ids.clone(),
            None => (0..self.len()).map(|i| self.global_id(i) as u32).collect(),
        }
    }

    /// Records of `split` on each of `nodes` nodes (node `n` owns shards `s % nodes == n`);
    /// all zeros when the split does not exist: the records a node evaluates (a train split's
    /// nodes hold [`crate::placement::Placement::counts`] instead, evened out).
    pub fn records_per_node(manifest: &Manifest, split: &str, nodes: usize) -> Vec<u64> {
        let mut out = vec![0u64; nodes];
        if nodes == 0 {
            return out;
        }
        if let Some(info) = manifest.splits.get(split) {
            for (s, sh) in info.shards.iter().enumerate() {
                out[s % nodes] += sh.records;
            }
        }
        out
    }

    /// Paths of the mapped shard files, in split order.
    pub fn shard_paths(&self) -> Vec<&Path> {
        self.shards.iter().map(|s| s.reader.path()).collect()
    }

    /// Bytes of this node's shards currently resident in RAM (`mincore`).
    pub fn resident_bytes(&self) -> Result<u64> {
        self.shards.iter().map(|s| s.reader.resident_bytes()).sum()
    }

    /// Total size of this node's shard files.
    pub fn file_bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.reader.file_bytes()).sum()
    }

    /// Checks that no mapped shard changed on disk since it was opened
    /// ([`ShardReader::check_unchanged`]); the error names the first one that did.
    pub fn check_unchanged(&self) -> Result<()> {
        self.shards
            .iter()
            .try_for_each(|s| s.reader.check_unchanged())
    }
}
