//! Opening what a `ddl._ddl.Loader` serves: its node's shards and sampler, and its part in
//! the exchange of records between the nodes.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ddl_exchange::{Exchange, ExchangeConfig};
use ddl_loader::dataset::{Dataset, OpenOptions, Residency};
use ddl_loader::elastic::Layout;
use ddl_loader::pipeline::PipelineConfig;
use ddl_loader::sampler::{NodeRecords, Sampler, SamplerConfig};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use super::args::value_error;
use crate::errors::{exchange_error, loader_error};

/// What `Loader` needs once its node's shards are open.
pub(super) struct Opened {
    pub(super) dataset: Arc<Dataset>,
    pub(super) sampler: Sampler,
    pub(super) pipeline: PipelineConfig,
    /// Train: how the job takes the split (for an elastic resume); None for val.
    pub(super) layout: Option<Layout>,
    /// Where the split is, to read a remainder from every shard.
    pub(super) path: PathBuf,
    pub(super) split: String,
    pub(super) opts: OpenOptions,
}

/// The record exchange between the nodes and what it moved so far.
pub(super) struct Exchanging {
    pub(super) exchange: Exchange,
    /// The epoch whose exchange is counted in the totals last.
    pub(super) counted: Option<u64>,
}

/// Opens this node's shards of `split` in `path` (without the GIL), or the records `holding`
/// read from every shard they are in, and its sampler over `records`: this node's (`.0`) and
/// the job's fewest and most per node (`.1`).
pub(super) fn open_node(
    py: Python<'_>,
    (path, split): (&Path, &str),
    residency: Residency,
    opts: &OpenOptions,
    holding: Option<Vec<u32>>,
    records: (usize, NodeRecords),
    sampling: SamplerConfig,
) -> PyResult<(Arc<Dataset>, Sampler)> {
    let dataset = py
        .detach(|| match &holding {
            Some(ids) => Dataset::open_holding(path, split, residency, ids, opts),
            None => Dataset::open(path, split, residency, opts),
        })
        .map_err(loader_error)?;
    let sampler = Sampler::try_new(records.0, records.1, sampling).map_err(loader_error)?;
    Ok((Arc::new(dataset), sampler))
}

/// Joins the exchange of `o`'s train records between the nodes of ddl.dist's job (collective:
/// every rank of the job makes its loader with the same `exchange`), this rank at `place`
/// (`node`, `nodes`, `rank_in_node`, `ranks_in_node`), which must be ddl.dist's. The node's
/// first rank leads its transfers; the arenas live in `/dev/shm`.
pub(super) fn open_exchange(
    py: Python<'_>,
    o: &Opened,
    fraction: f64,
    seed: u64,
    place: (usize, usize, usize, usize),
) -> PyResult<Exchanging> {
    let d = crate::dist::dist().map_err(|_| {
        PyRuntimeError::new_err(format!(
            "exchange: {fraction} moves records between the job's {} nodes through ddl.dist: \
             call ddl.dist.init() before making the loader",
            place.1
        ))
    })?;
    let (_, _, local_rank, local_size, dnode, dnodes) = d.world.place();
    if (dnode, dnodes, local_rank, local_size) != place {
        return Err(value_error(
            "exchange",
            format!(
                "the loader is at node {} of {}, local rank {} of {}, but ddl.dist at node \
                 {dnode} of {dnodes}, local rank {local_rank} of {local_size}: leave rank and \
                 world_size to ddl.dist",
                place.0, place.1, place.2, place.3
            ),
        ));
    }
    let cfg = ExchangeConfig {
        fraction,
        seed,
        // Unknown here: every epoch prepares the next one's records.
        epochs: u64::MAX,
        base_dir: ExchangeConfig::default_base_dir(),
        leader: local_rank == 0,
        piece_bytes: ExchangeConfig::PIECE_BYTES,
        lock: false,
    };
    let transport = d.world.transport();
    let home = Arc::clone(&o.dataset);
    let exchange = py
        .detach(|| Exchange::new(transport, home, &o.path, cfg))
        .map_err(exchange_error)?;
    Ok(Exchanging {
        exchange,
        counted: None,
    })
}
