//! The typed error that names the packer option at fault ([`OptionError`]); the rules that
//! raise it are in `options.rs`.

/// An option of [`PackOptions`], as an error names it; a command line maps each to its flag.
///
/// [`PackOptions`]: super::options::PackOptions
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PackOption {
    /// [`PackOptions::shards`] as a count.
    ///
    /// [`PackOptions::shards`]: super::options::PackOptions::shards
    Shards,
    /// [`ConvertOptions::max_short_side`].
    ///
    /// [`ConvertOptions::max_short_side`]: super::convert::ConvertOptions::max_short_side
    MaxShortSide,
    /// [`ConvertOptions::quality`].
    ///
    /// [`ConvertOptions::quality`]: super::convert::ConvertOptions::quality
    Quality,
    /// [`PackOptions::nodes`].
    ///
    /// [`PackOptions::nodes`]: super::options::PackOptions::nodes
    Nodes,
    /// [`PackOptions::synsets`].
    ///
    /// [`PackOptions::synsets`]: super::options::PackOptions::synsets
    Synsets,
    /// [`PackOptions::min_per_class`].
    ///
    /// [`PackOptions::min_per_class`]: super::options::PackOptions::min_per_class
    MinPerClass,
    /// [`PackOptions::val_split`] by [`ValRule::Fraction`].
    ///
    /// [`PackOptions::val_split`]: super::options::PackOptions::val_split
    /// [`ValRule::Fraction`]: super::val_split::ValRule::Fraction
    ValFraction,
    /// [`PackOptions::val_split`] by [`ValRule::PerClass`].
    ///
    /// [`PackOptions::val_split`]: super::options::PackOptions::val_split
    /// [`ValRule::PerClass`]: super::val_split::ValRule::PerClass
    ValPerClass,
    /// [`PackOptions::max_skip_fraction`].
    ///
    /// [`PackOptions::max_skip_fraction`]: super::options::PackOptions::max_skip_fraction
    MaxSkipFraction,
    /// [`PackOptions::order`].
    ///
    /// [`PackOptions::order`]: super::options::PackOptions::order
    Order,
}

impl PackOption {
    /// The option's name in this library (the field of [`PackOptions`]).
    ///
    /// [`PackOptions`]: super::options::PackOptions
    pub fn name(self) -> &'static str {
        match self {
            PackOption::Shards => "shards",
            PackOption::MaxShortSide => "max_short_side",
            PackOption::Quality => "quality",
            PackOption::Nodes => "nodes",
            PackOption::Synsets => "synsets",
            PackOption::MinPerClass => "min_per_class",
            PackOption::ValFraction => "val_split fraction",
            PackOption::ValPerClass => "val_split per_class",
            PackOption::MaxSkipFraction => "max_skip_fraction",
            PackOption::Order => "order",
        }
    }
}

/// An option whose value the packer cannot use, or that the input needs and was not given.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe(PackOption::name))]
pub struct OptionError {
    /// The option at fault.
    pub option: PackOption,
    /// Its value as given, if it was given.
    pub value: Option<String>,
    /// What is wrong, phrased to follow the option and its value.
    pub problem: String,
}

impl OptionError {
    /// The error of `option` with `value`.
    pub fn new(option: PackOption, value: impl ToString, problem: impl Into<String>) -> Self {
        OptionError {
            option,
            value: Some(value.to_string()),
            problem: problem.into(),
        }
    }

    /// The error in words, calling the option what `name` calls it (the library's field name,
    /// or a command line's flag).
    pub fn describe(&self, name: impl Fn(PackOption) -> &'static str) -> String {
        match &self.value {
            Some(v) => format!("{} {v} {}", name(self.option), self.problem),
            None => format!("{} {}", name(self.option), self.problem),
        }
    }
}
