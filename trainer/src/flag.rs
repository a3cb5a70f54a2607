//! Each setting as a command line takes it: the descriptors ([`Flag`]) that the table of
//! settings in config.rs makes, one per row, and the one trait ([`FlagValue`]) that says how a
//! value of each setting's type is typed, checked, shown as a default and listed as choices.
//! A binary lowers the descriptors to its own argument parser (`ddl-train` to clap's); the
//! library depends on none.

use std::fmt::Display;
use std::path::PathBuf;

use ddl_comm::{Algorithm, CommOrder, ShardAlgorithm};
use ddl_loader::pipeline::OnBadRecord;

use crate::config::{Overlap, Precision, ResidencyMode};
use crate::device::DeviceSpec;
use crate::model::ModelKind;
use crate::schedule::DecayKind;
use crate::setting::{spell, Setting};
use crate::size_schedule::SizeSchedule;

/// The group a flag is listed under in `--help`, in the order they are listed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Heading {
    /// The dataset, how it is loaded and augmented, and evaluation.
    Data,
    /// The network, the optimizer and the learning-rate schedule.
    Model,
    /// Devices, ranks, nodes and the collectives between them.
    Parallel,
    /// Checkpoints, resuming and the weights written at the end.
    Checkpoints,
    /// GPU arithmetic and the compiled step.
    Gpu,
    /// Metrics, traces and checks.
    Diagnostics,
}

impl Heading {
    /// Every heading, in the order `--help` lists them.
    pub const ALL: [Heading; 6] = [
        Heading::Data,
        Heading::Model,
        Heading::Parallel,
        Heading::Checkpoints,
        Heading::Gpu,
        Heading::Diagnostics,
    ];

    /// The heading as `--help` prints it.
    pub fn title(self) -> &'static str {
        match self {
            Heading::Data => "Data",
            Heading::Model => "Model and optimizer",
            Heading::Parallel => "Parallelism and communication",
            Heading::Checkpoints => "Checkpoints and resume",
            Heading::Gpu => "GPU and compile",
            Heading::Diagnostics => "Diagnostics",
        }
    }
}

/// How a flag takes its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Takes {
    /// No value: the flag turns its setting from its default to the other boolean.
    Switch,
    /// One value.
    One,
    /// Comma-separated values (`30,60,80`), also over several occurrences.
    List,
    /// One value per occurrence, the flag repeated for more.
    Repeated,
}

/// One value a setting may take by name, with what it means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    /// The name as typed.
    pub name: &'static str,
    /// The name with the parameters it may take (`multicolor[:COLORS[:CHUNK_BYTES]]`; empty:
    /// the name alone).
    pub syntax: &'static str,
    /// One line on what it does (empty: none).
    pub help: &'static str,
}

impl Choice {
    /// A choice without parameters.
    pub const fn named(name: &'static str, help: &'static str) -> Choice {
        Choice {
            name,
            syntax: "",
            help,
        }
    }
}

/// A type a setting of a command line has: how its values are parsed from what the user typed,
/// checked one at a time, shown as a default, and named where they are a fixed list.
pub trait FlagValue: Sized {
    /// How a flag of this type takes its values.
    const TAKES: Takes = Takes::One;

    /// The value of the strings typed (one for [`Takes::One`], `"true"` or `"false"` for a
    /// switch, each piece of a list), or what is wrong with them.
    fn parse_flag(values: &[&str]) -> Result<Self, String>;

    /// Whether one string typed (one piece of a list) can be a value: a usage error at once.
    fn check_one(value: &str) -> Result<(), String> {
        Self::parse_flag(&[value]).map(drop)
    }

    /// The value as typed, for `[default: ...]`; `None` where there is nothing to show.
    fn shown(&self) -> Option<String>;

    /// The names it may take, where those are a fixed list (with parameters after `:` for
    /// some, as the parser says).
    fn choices() -> Vec<Choice> {
        Vec::new()
    }
}

/// The value of `values`, which must be one string, with `T`'s own parser.
fn parse_one<T: std::str::FromStr>(values: &[&str]) -> Result<T, String>
where
    T::Err: Display,
{
    match values {
        [one] => one.trim().parse().map_err(|e: T::Err| e.to_string()),
        _ => Err(format!("takes one value, got {}", values.len())),
    }
}

/// [`FlagValue`] for types parsed by their `FromStr` and shown by their `Display`, with the
/// names of their choices where they have a list.
macro_rules! flag_value_from_str {
    ($($ty:ty $(=> $choices:expr)?),* $(,)?) => {$(
        impl FlagValue for $ty {
            fn parse_flag(values: &[&str]) -> Result<Self, String> {
                parse_one(values)
            }
            fn shown(&self) -> Option<String> {
                Some(self.to_string())
            }
            $(fn choices() -> Vec<Choice> {
                $choices.iter().map(|&name| Choice::named(name, "")).collect()
            })?
        }
    )*};
}

flag_value_from_str!(
    u32,
    u64,
    usize,
    f32,
    f64,
    String,
    DeviceSpec,
    ShardAlgorithm => ShardAlgorithm::NAMES,
    CommOrder => CommOrder::NAMES,
);

/// `allreduce`: the algorithms of comm's registry, with their parameters and help.
impl FlagValue for Algorithm {
    fn parse_flag(values: &[&str]) -> Result<Self, String> {
        parse_one(values)
    }

    fn shown(&self) -> Option<String> {
        Some(self.to_string())
    }

    fn choices() -> Vec<Choice> {
        let choice = |d: &ddl_comm::allreduce::Declared| Choice {
            name: d.name,
            syntax: d.syntax,
            help: d.help,
        };
        Algorithm::DECLARED.iter().map(choice).collect()
    }
}

impl FlagValue for bool {
    const TAKES: Takes = Takes::Switch;

    fn parse_flag(values: &[&str]) -> Result<Self, String> {
        parse_one(values)
    }

    /// `true` or `false`: which of the two a switch turns the setting from.
    fn shown(&self) -> Option<String> {
        Some(self.to_string())
    }
}

impl FlagValue for PathBuf {
    fn parse_flag(values: &[&str]) -> Result<Self, String> {
        parse_one(values)
    }

    fn shown(&self) -> Option<String> {
        let empty = self.as_os_str().is_empty();
        (!empty).then(|| self.display().to_string())
    }
}

impl FlagValue for SizeSchedule {
    fn parse_flag(values: &[&str]) -> Result<Self, String> {
        parse_one(values)
    }

    fn shown(&self) -> Option<String> {
        (!self.is_empty()).then(|| self.to_string())
    }
}

impl<T: FlagValue> FlagValue for Option<T> {
    const TAKES: Takes = T::TAKES;

    fn parse_flag(values: &[&str]) -> Result<Self, String> {
        T::parse_flag(values).map(Some)
    }

    fn check_one(value: &str) -> Result<(), String> {
        T::check_one(value)
    }

    fn shown(&self) -> Option<String> {
        self.as_ref().and_then(T::shown)
    }

    fn choices() -> Vec<Choice> {
        T::choices()
    }
}

impl<T: FlagValue> FlagValue for Vec<T> {
    const TAKES: Takes = Takes::List;

    fn parse_flag(values: &[&str]) -> Result<Self, String> {
        values.iter().map(|v| T::parse_flag(&[v])).collect()
    }

    fn check_one(value: &str) -> Result<(), String> {
        T::check_one(value)
    }

    fn shown(&self) -> Option<String> {
        let shown: Option<Vec<String>> = self.iter().map(T::shown).collect();
        shown.filter(|s| !s.is_empty()).map(|s| s.join(","))
    }
}

impl<T: FlagValue, const N: usize> FlagValue for [T; N] {
    const TAKES: Takes = Takes::List;

    fn parse_flag(values: &[&str]) -> Result<Self, String> {
        let n = values.len();
        let parsed = Vec::<T>::parse_flag(values)?;
        parsed
            .try_into()
            .map_err(|_| format!("takes {N} comma-separated values, got {n}"))
    }

    fn check_one(value: &str) -> Result<(), String> {
        T::check_one(value)
    }

    fn shown(&self) -> Option<String> {
        let shown: Option<Vec<String>> = self.iter().map(T::shown).collect();
        shown.map(|s| s.join(","))
    }
}

/// A type whose values are a fixed list of names: what [`FlagValue`] needs of it.
pub trait Named: Copy + 'static {
    /// Every value, in the order the help lists them.
    const ALL: &'static [Self];
    /// The name as typed.
    fn name(self) -> &'static str;
    /// One line on what it does (empty: none).
    fn help(self) -> &'static str {
        ""
    }

    /// The value named `name`.
    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|v| v.name() == name)
    }
}

/// [`FlagValue`] for [`Named`] types.
macro_rules! flag_value_named {
    ($($ty:ty),* $(,)?) => {$(
        impl FlagValue for $ty {
            fn parse_flag(values: &[&str]) -> Result<Self, String> {
                let [one] = values else {
                    return Err(format!("takes one value, got {}", values.len()));
                };
                <$ty as Named>::from_name(one.trim()).ok_or_else(|| {
                    let names: Vec<&str> = Self::ALL.iter().map(|v| v.name()).collect();
                    format!("{one:?} is not one of {}", names.join(", "))
                })
            }
            fn shown(&self) -> Option<String> {
                Some(self.name().to_string())
            }
            fn choices() -> Vec<Choice> {
                Self::ALL.iter().map(|v| Choice::named(v.name(), v.help())).collect()
            }
        }
    )*};
}

flag_value_named!(ModelKind, DecayKind, Precision, ResidencyMode, OnBadRecord);

impl Named for OnBadRecord {
    const ALL: &'static [Self] = &[OnBadRecord::Replace, OnBadRecord::Skip, OnBadRecord::Fail];

    fn name(self) -> &'static str {
        match self {
            OnBadRecord::Replace => "replace",
            OnBadRecord::Skip => "skip",
            OnBadRecord::Fail => "fail",
        }
    }

    fn help(self) -> &'static str {
        match self {
            OnBadRecord::Replace => "with the next good record of the epoch",
            OnBadRecord::Skip => "leave it out: a shorter batch",
            OnBadRecord::Fail => "stop the run",
        }
    }
}

/// `overlap`: `auto` is no value ([`crate::config::auto_overlap`] decides).
impl FlagValue for Option<Overlap> {
    fn parse_flag(values: &[&str]) -> Result<Self, String> {
        match values {
            ["auto"] => Ok(None),
            _ => parse_one::<Overlap>(values).map(Some),
        }
    }

    fn shown(&self) -> Option<String> {
        Some(self.map_or("auto", Overlap::name).to_string())
    }

    fn choices() -> Vec<Choice> {
        Overlap::CHOICES.to_vec()
    }
}

/// How a user types one setting: what a binary lowers to an argument of its command line.
/// The table of settings (config.rs) makes one per row ([`Setting::flag`]).
#[derive(Clone, Debug)]
pub struct Flag {
    /// The setting it sets.
    pub setting: Setting,
    /// The group `--help` lists it under.
    pub heading: Heading,
    /// The long name, without `--`, where it is not the setting's name with `-` for `_`.
    pub long: Option<&'static str>,
    /// The one-letter name, if any.
    pub short: Option<char>,
    /// The doc of the setting's row: its first paragraph is the short help, the whole the long.
    pub doc: &'static str,
    /// The placeholder of its value in the help (`FILE`), where not the setting's name.
    pub value_name: Option<&'static str>,
    /// How it takes its values.
    pub takes: Takes,
    /// The default as typed, for the help (`None`: not shown).
    pub default: Option<String>,
    /// The names its values may take, where they are a fixed list.
    pub choices: Vec<Choice>,
    /// Whether one string typed can be a value (one piece of a list).
    pub check: fn(&str) -> Result<(), String>,
    /// A setting this one needs to be given too.
    pub requires: Option<Setting>,
    /// A setting that cannot be given with this one.
    pub conflicts: Option<Setting>,
    /// A setting without which this one must be given.
    pub required_unless: Option<Setting>,
}

impl Flag {
    /// The descriptor of `setting` of type `T` with `doc`, before the row's own attributes.
    pub(crate) fn of<T: FlagValue>(
        setting: Setting,
        heading: Heading,
        doc: &'static str,
        default: &T,
    ) -> Flag {
        Flag {
            setting,
            heading,
            long: None,
            short: None,
            doc,
            value_name: None,
            takes: T::TAKES,
            default: default.shown(),
            choices: T::choices(),
            check: T::check_one,
            requires: None,
            conflicts: None,
            required_unless: None,
        }
    }

    /// The long name, without `--`.
    pub fn long_name(&self) -> String {
        match self.long {
            Some(long) => long.to_string(),
            None => self.setting.name().replace('_', "-"),
        }
    }

    /// The short help: the first paragraph of the doc without its final period, settings
    /// spelled as flags.
    pub fn summary(&self) -> String {
        let first = paragraphs(self.doc).into_iter().next().unwrap_or_default();
        first.strip_suffix('.').unwrap_or(&first).to_string()
    }

    /// The long help: every paragraph of the doc, settings spelled as flags.
    pub fn long_help(&self) -> String {
        paragraphs(self.doc).join("\n\n")
    }
}

/// The paragraphs of a doc comment (`///` lines, blank lines between paragraphs), each on
/// one line, with the settings it names in backquotes spelled as flags.
fn paragraphs(doc: &str) -> Vec<String> {
    doc.split("\n\n")
        .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|p| !p.is_empty())
        .map(|p| spell(&p))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_check_each_piece_and_count_the_whole() {
        assert_eq!(<[f64; 2]>::parse_flag(&["0.1", "1"]), Ok([0.1, 1.0]));
        let three = <[f64; 2]>::parse_flag(&["0.1", "0.2", "1"]).unwrap_err();
        assert_eq!(three, "takes 2 comma-separated values, got 3");
        assert!(<[f64; 2]>::check_one("x").is_err());
        assert_eq!(vec![30u32, 60].shown().as_deref(), Some("30,60"));
    }

    #[test]
    fn named_values_are_parsed_by_name_and_listed() {
        assert_eq!(
            ModelKind::parse_flag(&["resnet_small"]),
            Ok(ModelKind::ResnetSmall)
        );
        let err = Precision::parse_flag(&["fp8"]).unwrap_err();
        assert_eq!(err, "\"fp8\" is not one of fp32, bf16, fp16");
        let auto = <Option<Overlap>>::parse_flag(&["auto"]);
        assert_eq!(auto, Ok(None));
        let names: Vec<&str> = <Option<Overlap>>::choices()
            .iter()
            .map(|c| c.name)
            .collect();
        assert_eq!(names, ["auto", "backward", "pipeline", "off"]);
    }
}
