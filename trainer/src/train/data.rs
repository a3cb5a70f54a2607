//! The data a rank trains and evaluates on: its node's records of the train split (evened
//! out over the nodes, [`Placement`]) and its shards of the val split, opened as the run's
//! flags say, and the sampler that deals the train records to its replicas.

use std::sync::Arc;

use ddl_comm::Transport;
use ddl_exchange::{Exchange, ExchangeConfig, ExchangeError};
use ddl_loader::dataset::{Dataset, OpenOptions};
use ddl_loader::limits;
use ddl_loader::placement::Placement;
use ddl_loader::sampler::{NodeRecords, Sampler, SamplerConfig, Tail};

use super::run_plan::Plan;
use crate::config::Setting;
use crate::config::TrainConfig;
use crate::error::{Result, TrainError};
use crate::validate;

/// What a rank trains and evaluates on.
pub(super) struct Data {
    /// Its node's train records (with an exchange, those of its shards until epoch 0's
    /// arrive).
    pub train: Arc<Dataset>,
    /// Which of them each replica takes at each step.
    pub sampler: Sampler,
    /// Its node's val records, if it evaluates and has any.
    pub val: Option<Arc<Dataset>>,
    /// Which node holds which train record.
    pub placement: Placement,
    /// The exchange of train records between the nodes (`exchange` above 0 on several nodes).
    pub exchange: Option<Exchange>,
}

/// Opens this rank's share of the train and val splits, its sampler and (collective over
/// `transport`) the exchange of train records between the nodes.
pub(super) fn open_data(
    cfg: &TrainConfig,
    plan: &Plan,
    replicas: usize,
    transport: &Arc<dyn Transport>,
) -> Result<Data> {
    let opts = OpenOptions {
        populate: cfg.populate,
        lock: cfg.lock,
        stage: cfg.stage.clone(),
    };
    let (residency, exchanges) = (plan.residency, exchanges(cfg, plan));
    let shards: Vec<u64> = plan
        .manifest
        .split(&cfg.data, "train")?
        .shards
        .iter()
        .map(|s| s.records)
        .collect();
    let fraction = if exchanges { cfg.exchange } else { 0.0 };
    let placement = Placement::new(&shards, residency.nodes, fraction, cfg.seed)
        .map_err(|e| TrainError::config(Setting::Exchange, e.to_string()))?;
    // Without an exchange, the records that even the nodes out are read from the directory.
    let train_set = Arc::new(if exchanges || placement.evened() == 0 {
        Dataset::open(&cfg.data, "train", residency, &opts)?
    } else {
        let mine = placement.holdings(0);
        Dataset::open_holding(
            &cfg.data,
            "train",
            residency,
            mine.node(residency.node),
            &opts,
        )?
    });
    let counts = placement.counts();
    let job = NodeRecords {
        fewest: counts.iter().copied().min().unwrap_or(0),
        most: counts.iter().copied().max().unwrap_or(0),
    };
    let sampler = Sampler::try_new(
        counts[residency.node],
        job,
        SamplerConfig {
            seed: cfg.seed,
            ranks_in_node: plan.ranks_in_node,
            rank_in_node: plan.rank_in_node,
            replicas,
            batch_per_replica: cfg.batch,
            tail: Tail::Drop,
            shuffle: true,
        },
    )
    .map_err(|e| TrainError::config(Setting::Batch, e.to_string()))?;
    limits::check_full_step(cfg.batch, plan.ranks_in_node, replicas, job.fewest)
        .map_err(validate::limit_error)?;
    let val_set = if cfg.eval && plan.manifest.splits.contains_key("val") {
        let per_node = Dataset::records_per_node(&plan.manifest, "val", residency.nodes);
        if per_node[residency.node] > 0 {
            Some(Arc::new(Dataset::open(&cfg.data, "val", residency, &opts)?))
        } else {
            None
        }
    } else {
        None
    };
    let exchange = match exchanges {
        true => Some(exchange(cfg, plan, &train_set, transport)?),
        false => None,
    };
    Ok(Data {
        train: train_set,
        sampler,
        val: val_set,
        placement,
        exchange,
    })
}

/// Whether the run exchanges records between nodes: `exchange` above 0 on several nodes.
fn exchanges(cfg: &TrainConfig, plan: &Plan) -> bool {
    cfg.exchange > 0.0 && plan.residency.nodes > 1
}

/// The exchange of `train`'s records between the nodes. The arenas live in the `stage`
/// directory, else in `/dev/shm`.
fn exchange(
    cfg: &TrainConfig,
    plan: &Plan,
    train: &Arc<Dataset>,
    transport: &Arc<dyn Transport>,
) -> Result<Exchange> {
    let base_dir = cfg
        .stage
        .clone()
        .unwrap_or_else(ExchangeConfig::default_base_dir);
    let x = ExchangeConfig {
        fraction: cfg.exchange,
        seed: cfg.seed,
        epochs: u64::from(cfg.epochs),
        base_dir,
        leader: plan.rank_in_node == 0,
        piece_bytes: ExchangeConfig::PIECE_BYTES,
        lock: cfg.lock,
    };
    match Exchange::new(transport.clone(), train.clone(), &cfg.data, x) {
        Ok(x) => Ok(x),
        Err(e @ ExchangeError::Memory { .. }) => {
            Err(TrainError::config(Setting::Exchange, e.to_string()))
        }
        Err(e) => Err(e.into()),
    }
}

/// How the start-up line describes the train records: their count, each node's, how the
/// shards are evened out over the nodes and what an epoch leaves out (`steps` of
/// `global_batch` records).
pub(super) fn records_line(
    cfg: &TrainConfig,
    placement: &Placement,
    steps: u64,
    global_batch: usize,
) -> String {
    let counts = placement.counts();
    let (fewest, most) = (
        counts.iter().copied().min().unwrap_or(0),
        counts.iter().copied().max().unwrap_or(0),
    );
    let per_node = match fewest == most {
        true => format!("{most}"),
        false => format!("{fewest}-{most}"),
    };
    let records = placement.records() as u64;
    let mut line = format!(
        "{records} train images, {per_node} per node on {} node(s)",
        placement.nodes()
    );
    let evened = placement.evened();
    if evened > 0 {
        let how = match placement.exchanges() {
            true => "moved by the exchange into epoch 0".to_string(),
            false => format!("read from {}", cfg.data.display()),
        };
        line += &format!(
            " (the shards do not divide evenly: {evened} records are served by another node \
             than their shard's, {how})"
        );
    }
    let left = records.saturating_sub(steps * global_batch as u64);
    line + &format!(", {left} left out per epoch by the last incomplete step")
}
