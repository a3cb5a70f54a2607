//! The record exchange between nodes as a command line asks for it: the range of its fraction
//! (which `ddl-train` checks too) and, with the feature `clap`, the group of flags with which
//! `ddl-plan` and `ddl-bench sim` plan it ([`ExchangeFlags`]), defined once for both.

/// Whether `fraction` can be the share of each node's records exchanged at each epoch boundary:
/// `None` if it can, else what is wrong (for a message that names the flag or setting).
pub fn fraction_error(fraction: f64) -> Option<String> {
    (!(0.0..=1.0).contains(&fraction)).then(|| {
        format!(
            "{fraction} is outside 0..=1 (a fraction of each node's records: 0 keeps each node \
             on its own shards, 1 is a global shuffle every epoch)"
        )
    })
}

#[cfg(feature = "clap")]
pub use flags::{ExchangeFlags, ExchangeFlagsError};

#[cfg(feature = "clap")]
mod flags {
    use std::path::PathBuf;

    use super::fraction_error;
    use crate::error::LoaderError;
    use crate::exchange_cost::{ExchangeSetup, SplitRecords};
    use crate::units::parse_size;

    /// Why [`ExchangeFlags::setup`] failed.
    #[derive(Debug, thiserror::Error)]
    pub enum ExchangeFlagsError {
        /// A flag out of range, or one missing; the message names it.
        #[error("{0}")]
        Flag(String),
        /// The manifest of `--data` could not be read or counted.
        #[error(transparent)]
        Data(#[from] LoaderError),
    }

    /// The flags of a planned record exchange: `--exchange Q` and what it is counted on.
    #[derive(clap::Args, Clone, Debug)]
    pub struct ExchangeFlags {
        /// Fraction of each node's records exchanged at each epoch boundary.
        ///
        /// As ddl-train's --exchange, 0 to 1: adds the records and bytes the exchange sends
        /// between the nodes.
        #[arg(long, value_name = "Q")]
        pub exchange: Option<f64>,
        /// Packed dataset whose train split --exchange is counted on.
        ///
        /// Its manifest.json gives the records of each shard and their average size.
        #[arg(long, value_name = "DIR", requires = "exchange")]
        pub data: Option<PathBuf>,
        /// Records of the train split, without --data (the expected exchange).
        #[arg(long, value_name = "N", requires = "exchange", conflicts_with = "data",
              value_parser = clap::value_parser!(u64).range(1..))]
        pub records: Option<u64>,
        /// Average bytes of a record, without --data (e.g. 110KB).
        ///
        /// KiB/MiB and K/M are powers of 1024, KB/MB powers of 1000.
        #[arg(long, value_name = "SIZE", requires = "exchange", conflicts_with = "data",
              value_parser = parse_size)]
        pub record_bytes: Option<u64>,
        /// Each node's link, Gbit/s each way (default: the cost model's).
        ///
        /// By default the link between nodes of the cost model; ddl-plan's is ddl-bench's
        /// minsky preset, InfiniBand EDR.
        #[arg(long, value_name = "GBPS", requires = "exchange")]
        pub link_gbps: Option<f64>,
        /// Epochs of the run (ddl-train's --epochs).
        ///
        /// The exchange happens at the boundaries into epochs 1 to N - 1.
        #[arg(long, value_name = "N", default_value_t = 90, requires = "exchange",
              value_parser = clap::value_parser!(u64).range(1..))]
        pub epochs: u64,
        /// Seed of the placement (ddl-train's --seed).
        #[arg(long, value_name = "SEED", default_value_t = 0, requires = "exchange")]
        pub seed: u64,
    }

    impl ExchangeFlags {
        /// The exchange these flags ask for between `nodes` nodes, over links of
        /// `link_bytes_per_s` unless `--link-gbps` says otherwise, with no epoch time (the
        /// caller's to give), and where its records were counted from; `None` without
        /// `--exchange`. Fails naming the flag that is out of range or missing.
        pub fn setup(
            &self,
            nodes: usize,
            link_bytes_per_s: f64,
        ) -> Result<Option<(ExchangeSetup, String)>, ExchangeFlagsError> {
            let Some(fraction) = self.exchange else {
                return Ok(None);
            };
            let invalid = |why: String| Err(ExchangeFlagsError::Flag(why));
            if let Some(why) = fraction_error(fraction) {
                return invalid(format!("--exchange {why}"));
            }
            let link_bytes_per_s = match self.link_gbps {
                Some(g) if !(g.is_finite() && g > 0.0) => {
                    return invalid(format!("--link-gbps {g} must be a positive speed"));
                }
                Some(g) => g * 1e9 / 8.0,
                None => link_bytes_per_s,
            };
            let (records, record_bytes, from) = match (&self.data, self.records, self.record_bytes)
            {
                (Some(dir), _, _) => {
                    let (records, bytes) = SplitRecords::of_manifest(dir, "train")?;
                    (records, bytes, format!("{}, train", dir.display()))
                }
                (None, Some(n), Some(b)) => (
                    SplitRecords::Total(n),
                    b as f64,
                    "--records, --record-bytes".to_string(),
                ),
                _ => {
                    let why = "--exchange needs --data DIR, or --records and --record-bytes";
                    return invalid(why.to_string());
                }
            };
            let setup = ExchangeSetup {
                fraction,
                nodes,
                records,
                record_bytes,
                seed: self.seed,
                link_bytes_per_s,
                epochs: self.epochs,
                epoch_time: None,
            };
            Ok(Some((setup, from)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fraction_is_a_share_of_the_records() {
        for ok in [0.0, 0.25, 1.0] {
            assert_eq!(fraction_error(ok), None, "{ok}");
        }
        for bad in [-0.1, 1.5, f64::NAN] {
            let why = fraction_error(bad).expect("refused");
            assert!(why.starts_with(&format!("{bad} is outside 0..=1")), "{why}");
        }
    }
}
