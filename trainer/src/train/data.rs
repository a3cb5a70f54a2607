//! The data a rank trains and evaluates on: its node's shards of the train and val splits,
//! opened as the run's flags say, and the sampler that deals the train records to its replicas.

use std::sync::Arc;

use ddl_comm::Transport;
use ddl_exchange::{Exchange, ExchangeConfig, ExchangeError};
use ddl_loader::dataset::{Dataset, OpenOptions};
use ddl_loader::limits;
use ddl_loader::sampler::{Sampler, SamplerConfig, Tail};

use super::run_plan::Plan;
use crate::config::TrainConfig;
use crate::error::{Result, TrainError};
use crate::setting::Setting;
use crate::validate;

/// What a rank trains and evaluates on.
pub(super) struct Data {
    /// Its node's train records.
    pub train: Arc<Dataset>,
    /// Which of them each replica takes at each step.
    pub sampler: Sampler,
    /// Its node's val records, if it evaluates and has any.
    pub val: Option<Arc<Dataset>>,
    /// Train records of the node with the fewest.
    pub min_node: usize,
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
    let train_set = Arc::new(Dataset::open(&cfg.data, "train", plan.residency, &opts)?);
    let per_node = Dataset::records_per_node(&plan.manifest, "train", plan.residency.nodes);
    let min_node = per_node.iter().copied().min().unwrap_or(0) as usize;
    let sampler = Sampler::try_new(
        train_set.len(),
        min_node,
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
    limits::check_full_step(cfg.batch, plan.ranks_in_node, replicas, min_node)
        .map_err(validate::limit_error)?;
    let val_set = if cfg.eval && plan.manifest.splits.contains_key("val") {
        let per_node = Dataset::records_per_node(&plan.manifest, "val", plan.residency.nodes);
        if per_node[plan.residency.node] > 0 {
            Some(Arc::new(Dataset::open(
                &cfg.data,
                "val",
                plan.residency,
                &opts,
            )?))
        } else {
            None
        }
    } else {
        None
    };
    let exchange = exchange(cfg, plan, &train_set, transport)?;
    Ok(Data {
        train: train_set,
        sampler,
        val: val_set,
        min_node,
        exchange,
    })
}

/// The exchange of `train`'s records between the nodes, when the run exchanges some and has
/// several nodes. The arenas live in the `stage` directory, else in `/dev/shm`.
fn exchange(
    cfg: &TrainConfig,
    plan: &Plan,
    train: &Arc<Dataset>,
    transport: &Arc<dyn Transport>,
) -> Result<Option<Exchange>> {
    if cfg.exchange == 0.0 || plan.residency.nodes < 2 {
        return Ok(None);
    }
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
        Ok(x) => Ok(Some(x)),
        Err(e @ ExchangeError::Memory { .. }) => {
            Err(TrainError::config(Setting::Exchange, e.to_string()))
        }
        Err(e) => Err(e.into()),
    }
}
