//! `ddl-plan`'s command line (the binary: `src/bin/ddl-plan.rs`; the library calls:
//! [`ddl_trainer::memory`], `ddl_loader::exchange_cost`).

use std::path::PathBuf;

use clap::Parser;
use ddl_comm::CostModel;
use ddl_loader::units::parse_size;

use ddl_trainer::config::TrainConfig;
use ddl_trainer::model::ModelKind;

/// Print the parameter count, the gradient bucket plan and the model-state memory ddl-train
/// would have for a model and class count.
#[derive(Parser, Debug)]
#[command(name = "ddl-plan", version, about)]
pub struct Args {
    /// The network (as ddl-train's --model).
    #[arg(long, value_parser = crate::named::<ModelKind>(), default_value_t = ModelKind::Resnet50)]
    pub model: ModelKind,
    /// Output classes (21841 for the whole of ImageNet-22k).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(i64).range(2..))]
    pub classes: i64,
    /// Input side in pixels (only resnet_small's stem depends on it).
    #[arg(long, default_value_t = 224)]
    pub image_size: u32,
    /// backward | pipeline | off (as ddl-train's --overlap; auto picks backward on GPUs and
    /// across nodes).
    #[arg(long, default_value = "backward", value_parser = ["backward", "pipeline", "off"])]
    pub overlap: String,
    /// Gradient bucket size in MiB (as ddl-train's --bucket-mb).
    #[arg(long, default_value_t = 25.0)]
    pub bucket_mb: f64,
    /// Replicas per rank (for the per-rank memory of CPU replicas).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub replicas: u64,
    /// Ranks of the job (for the bytes sent per step).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub ranks: u64,
    /// Images per replica per step (as ddl-train's --batch; global batch = this x replicas x
    /// ranks).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..))]
    pub batch: u64,
    /// List the buckets of a run with the head split over the replicas (the comparison of the
    /// two modes is printed either way).
    #[arg(long)]
    pub head_parallel: bool,
    /// Fraction of every node's records exchanged at each epoch boundary (as ddl-train's
    /// --exchange, 0 to 1): adds the records and bytes the exchange sends between the nodes.
    #[arg(long, value_name = "Q")]
    pub exchange: Option<f64>,
    /// Nodes of the job, between which --exchange moves records.
    #[arg(long, default_value_t = 1, requires = "exchange",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub nodes: u64,
    /// Packed dataset whose train split --exchange is counted on (its manifest.json: the
    /// records of each shard and their average size).
    #[arg(long, value_name = "DIR", requires = "exchange")]
    pub data: Option<PathBuf>,
    /// Records of the train split, without --data: the exchange is then the expected one.
    #[arg(long, requires = "exchange", conflicts_with = "data",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub records: Option<u64>,
    /// Average bytes of a record, without --data (e.g. 110KB; KiB/MiB and K/M are powers of
    /// 1024, KB/MB powers of 1000).
    #[arg(long, value_name = "SIZE", requires = "exchange", conflicts_with = "data",
          value_parser = parse_size)]
    pub record_bytes: Option<u64>,
    /// Each node's link, Gbit/s each way (default: InfiniBand EDR, as ddl-bench's minsky
    /// preset has it).
    #[arg(long, default_value_t = default_link_gbps(), requires = "exchange")]
    pub link_gbps: f64,
    /// Epochs of the run (as ddl-train's --epochs): the boundaries into epochs 1 to N - 1.
    #[arg(long, default_value_t = TrainConfig::default().epochs, requires = "exchange",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub epochs: u32,
    /// Seed of the placement (as ddl-train's --seed).
    #[arg(long, default_value_t = TrainConfig::default().seed, requires = "exchange")]
    pub seed: u64,
    /// Seconds of one epoch, when known: says whether each boundary's exchange fits in the
    /// epoch before it (the allreduce's use of the links not counted).
    #[arg(long, value_name = "SECONDS", requires = "exchange")]
    pub epoch_s: Option<f64>,
}

/// The inter-node link of ddl-bench's `minsky` cost model, in Gbit/s.
fn default_link_gbps() -> f64 {
    8.0 / CostModel::minsky().inter.beta / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;
    use ddl_trainer::setting::Setting;

    /// The settings `ddl-plan`'s library calls name in their messages have a flag.
    #[test]
    fn every_setting_it_names_has_a_flag() {
        crate::assert_flags::<Args>(&[Setting::Overlap, Setting::HeadParallel]);
    }
}
