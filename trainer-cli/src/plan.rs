//! `ddl-plan`'s command line (the binary: `src/bin/ddl-plan.rs`; the library calls:
//! [`ddl_trainer::memory`], `ddl_loader::exchange_cost`).

use clap::builder::{PossibleValue, PossibleValuesParser};
use clap::Parser;
use ddl_comm::CostModel;
use ddl_loader::exchange_args::ExchangeFlags;

use ddl_trainer::config::spell;
use ddl_trainer::config::Overlap;
use ddl_trainer::model::ModelKind;

/// Print a ddl-train run's parameters, gradient buckets, memory and bytes sent per step.
///
/// For a model and class count, without data or devices: the parameter count, the gradient
/// bucket plan and the model-state memory ddl-train would have; for a job of --ranks x
/// --replicas x --batch, the memory and bytes sent per step data-parallel and with the head
/// split over the replicas; with --exchange, what the record exchange between --nodes nodes
/// sends at each epoch boundary.
#[derive(Parser, Debug)]
#[command(name = "ddl-plan", version, max_term_width = 100)]
pub struct Args {
    /// The network (as ddl-train's --model).
    #[arg(long, value_name = "NAME", value_parser = crate::named::<ModelKind>(), default_value_t = ModelKind::Resnet50,
          help_heading = "Model")]
    pub model: ModelKind,
    /// Output classes (21841 for the whole of ImageNet-22k).
    #[arg(long, value_name = "N", default_value_t = 1000,
          value_parser = clap::value_parser!(i64).range(2..), help_heading = "Model")]
    pub classes: i64,
    /// Input side in pixels (only resnet_small's stem depends on it).
    #[arg(long, value_name = "PX", default_value_t = 224, help_heading = "Model")]
    pub image_size: u32,
    /// What the gradient allreduce overlaps with (as ddl-train's --overlap).
    ///
    /// ddl-train's auto picks backward on GPUs and across nodes.
    #[arg(long, value_name = "MODE", default_value = "backward", value_parser = overlaps(), help_heading = "Model")]
    pub overlap: String,
    /// Gradient bucket size in MiB (as ddl-train's --bucket-mb).
    #[arg(
        long,
        value_name = "MIB",
        default_value_t = 25.0,
        help_heading = "Model"
    )]
    pub bucket_mb: f64,
    /// Replicas per rank (for the per-rank memory of CPU replicas).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..),
          help_heading = "Job")]
    pub replicas: u64,
    /// Ranks of the job (for the bytes sent per step).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..),
          help_heading = "Job")]
    pub ranks: u64,
    /// Images per replica per step (as ddl-train's --batch).
    ///
    /// The global batch is this x replicas x ranks.
    #[arg(long, value_name = "N", default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..),
          help_heading = "Job")]
    pub batch: u64,
    /// List the buckets of a run with the head split over the replicas.
    ///
    /// The comparison of the two modes is printed either way.
    #[arg(long, help_heading = "Job")]
    pub head_parallel: bool,
    /// The record exchange, and what it is counted on.
    #[command(flatten, next_help_heading = "Record exchange")]
    pub exchange: ExchangeFlags,
    /// Nodes of the job, between which --exchange moves records.
    #[arg(long, value_name = "N", default_value_t = 1, requires = "exchange",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub nodes: u64,
    /// Seconds of one epoch: whether each boundary's exchange fits in the epoch before it.
    ///
    /// The allreduce's use of the links is not counted.
    #[arg(long, value_name = "SECONDS", requires = "exchange")]
    pub epoch_s: Option<f64>,
}

/// `--overlap`'s values: ddl-train's but auto, which depends on the devices.
fn overlaps() -> PossibleValuesParser {
    let values = Overlap::CHOICES.iter().filter(|c| c.name != "auto");
    PossibleValuesParser::new(values.map(|c| PossibleValue::new(c.name).help(spell(c.help))))
}

/// The link between nodes of ddl-bench's `minsky` cost model (InfiniBand EDR), in bytes per
/// second: `--link-gbps`'s default.
pub fn default_link_bytes_per_s() -> f64 {
    1.0 / CostModel::minsky().inter.beta
}

#[cfg(test)]
mod tests {
    use super::*;
    use ddl_trainer::Setting;

    /// The settings `ddl-plan`'s library calls name in their messages have a flag.
    #[test]
    fn every_setting_it_names_has_a_flag() {
        crate::assert_flags::<Args>(&[Setting::Overlap, Setting::HeadParallel]);
    }

    /// The exchange's epochs and seed default to ddl-train's.
    #[test]
    fn the_exchange_defaults_are_ddl_trains() {
        let args = Args::try_parse_from(["ddl-plan"]).expect("parse");
        let train = ddl_trainer::TrainConfig::default();
        assert_eq!(args.exchange.epochs, u64::from(train.epochs));
        assert_eq!(args.exchange.seed, train.seed);
    }
}
