//! What the packer can be told ([`PackOptions`]), each value's rule, and the typed error that
//! names the option at fault ([`OptionError`]). The rules live here only: `pack` checks them
//! for library users, and a command line applies the same functions while it parses, mapping
//! each [`PackOption`] to its own spelling.

use std::path::PathBuf;

use super::convert::{ConvertOptions, MIN_SHORT_SIDE};
use super::option_error::{OptionError, PackOption};
use super::spec::{ShardCount, ShardOrder};
use super::val_split::ValSplit;

/// Everything `ddl-pack` can be told.
#[derive(Clone, Debug)]
pub struct PackOptions {
    /// Input directory.
    pub input: PathBuf,
    /// Output directory (created if missing).
    pub output: PathBuf,
    /// Shard count or size.
    pub shards: ShardCount,
    /// Which inputs each shard holds.
    pub order: ShardOrder,
    /// Image conversion settings.
    pub convert: ConvertOptions,
    /// Class list file (restricts and orders classes).
    pub classes: Option<PathBuf>,
    /// ILSVRC synset list for the devkit validation ground truth.
    pub synsets: Option<PathBuf>,
    /// Drop classes with fewer usable inputs than this (0 keeps all).
    pub min_per_class: u64,
    /// Keep a class without usable training inputs (an empty folder, a class only in val) as
    /// a class with no training records; otherwise such a class is an error
    /// ([`crate::LoaderError::EmptyClasses`]), since leaving it out would relabel every class
    /// after it.
    pub keep_empty_classes: bool,
    /// Carve a validation split out of an input that has none.
    pub val_split: Option<ValSplit>,
    /// Number of nodes the shards are assigned to in the manifest (shard `s` -> node `s % P`).
    pub nodes: usize,
    /// Worker threads; 0 = one per core.
    pub threads: usize,
    /// Largest accepted fraction of skipped inputs; above it the pack fails after writing the
    /// report.
    pub max_skip_fraction: f64,
    /// Use an output directory that holds another ddl pack: take over its files whose names
    /// this pack writes (see `loader/FORMAT.md`). Files ddl-pack did not write are never
    /// touched.
    pub force: bool,
}

/// Shard size when none is given: 1 GiB, large enough that a node reads few files, small
/// enough that a resumed pack redoes little.
pub const DEFAULT_SHARD_BYTES: u64 = 1 << 30;

/// Shorter side limit when none is given: what ImageNet training crops from.
pub const DEFAULT_MAX_SHORT_SIDE: u32 = 256;

/// JPEG quality of re-encoded images when none is given.
pub const DEFAULT_QUALITY: u8 = 90;

/// The share of skipped inputs above which a pack fails by default: one in 1,000 (ImageNet's
/// few damaged files, not a broken input).
pub const DEFAULT_MAX_SKIP_FRACTION: f64 = 0.001;

impl PackOptions {
    /// Options with the documented defaults: 1 GiB shards in interleaved order, shorter side
    /// 256, quality 90, one node, all cores, 0.001 skip fraction, no takeover of another
    /// pack's files.
    pub fn new(input: impl Into<PathBuf>, output: impl Into<PathBuf>) -> Self {
        PackOptions {
            input: input.into(),
            output: output.into(),
            shards: ShardCount::Size(DEFAULT_SHARD_BYTES),
            order: ShardOrder::Interleaved,
            convert: ConvertOptions {
                max_short_side: DEFAULT_MAX_SHORT_SIDE,
                quality: DEFAULT_QUALITY,
                reencode: false,
            },
            classes: None,
            synsets: None,
            min_per_class: 0,
            keep_empty_classes: false,
            val_split: None,
            nodes: 1,
            threads: 0,
            max_skip_fraction: DEFAULT_MAX_SKIP_FRACTION,
            force: false,
        }
    }

    /// Checks every value against its rule before anything is read or written.
    pub fn validate(&self) -> Result<(), OptionError> {
        if let ShardCount::Count(n) = self.shards {
            check_shards(n)?;
        }
        check_max_short_side(self.convert.max_short_side)?;
        check_quality(self.convert.quality)?;
        check_nodes(self.nodes)?;
        check_max_skip_fraction(self.max_skip_fraction)?;
        if let Some(vs) = &self.val_split {
            vs.validate()?;
        }
        Ok(())
    }
}

/// A shard count: at least 1.
pub fn check_shards(n: usize) -> Result<(), OptionError> {
    if n == 0 {
        return Err(OptionError::new(
            PackOption::Shards,
            n,
            "must be at least 1",
        ));
    }
    Ok(())
}

/// A shorter side limit: 0 (keep the size) or at least [`MIN_SHORT_SIDE`].
pub fn check_max_short_side(side: u32) -> Result<(), OptionError> {
    if side != 0 && side < MIN_SHORT_SIDE {
        return Err(OptionError::new(
            PackOption::MaxShortSide,
            side,
            format!(
                "is below {MIN_SHORT_SIDE} pixels (the smallest image size ddl-train trains \
                 at); use 0 to keep the original size"
            ),
        ));
    }
    Ok(())
}

/// A JPEG quality: 1..=100.
pub fn check_quality(quality: u8) -> Result<(), OptionError> {
    if !(1..=100).contains(&quality) {
        return Err(OptionError::new(
            PackOption::Quality,
            quality,
            "is outside 1..=100",
        ));
    }
    Ok(())
}

/// A node count: at least 1.
pub fn check_nodes(nodes: usize) -> Result<(), OptionError> {
    if nodes == 0 {
        return Err(OptionError::new(
            PackOption::Nodes,
            nodes,
            "must be at least 1",
        ));
    }
    Ok(())
}

/// A skip limit: a fraction in 0..=1.
pub fn check_max_skip_fraction(f: f64) -> Result<(), OptionError> {
    if !(0.0..=1.0).contains(&f) {
        return Err(OptionError::new(
            PackOption::MaxSkipFraction,
            f,
            "is outside 0..=1",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rule_names_its_option_and_the_defaults_pass() {
        let mut o = PackOptions::new("in", "out");
        assert_eq!(o.validate(), Ok(()));
        o.convert.max_short_side = 15;
        assert_eq!(o.validate().unwrap_err().option, PackOption::MaxShortSide);
        o.convert.max_short_side = 0;
        o.convert.quality = 0;
        assert_eq!(o.validate().unwrap_err().option, PackOption::Quality);
        o.convert.quality = 100;
        o.nodes = 0;
        assert_eq!(o.validate().unwrap_err().option, PackOption::Nodes);
        o.nodes = 2;
        o.shards = ShardCount::Count(0);
        assert_eq!(o.validate().unwrap_err().option, PackOption::Shards);
        o.shards = ShardCount::Count(1);
        o.max_skip_fraction = 1.5;
        let e = o.validate().unwrap_err();
        assert_eq!(e.option, PackOption::MaxSkipFraction);
        assert_eq!(e.to_string(), "max_skip_fraction 1.5 is outside 0..=1");
        assert_eq!(
            e.describe(|_| "LIMIT"),
            "LIMIT 1.5 is outside 0..=1",
            "a command line names the option its own way"
        );
    }
}
