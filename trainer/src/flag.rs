//! Each setting as a command line takes it: the descriptors ([`Flag`]) that the table of
//! settings in config.rs makes, one per row, and the one trait ([`FlagValue`]) that says how a
//! value of each setting's type is typed, checked, shown as a default and listed as choices.
//! A binary lowers the descriptors to its own argument parser (`ddl-train` to clap's); the
//! library depends on none.

use ddl_comm::{Algorithm, CommOrder, ShardAlgorithm};
use ddl_loader::pipeline::OnBadRecord;

use crate::config::{Overlap, Precision, ResidencyMode, Setting};
use crate::device::DeviceSpec;
use crate::flag_value::{flag_value_from_str, flag_value_named, parse_one};
pub use crate::flag_value::{Choice, FlagValue, Named, Takes};
use crate::model::ModelKind;
use crate::schedule::DecayKind;
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
flag_value_from_str!(
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
impl FlagValue for SizeSchedule {
    fn parse_flag(values: &[&str]) -> Result<Self, String> {
        parse_one(values)
    }

    fn shown(&self) -> Option<String> {
        (!self.is_empty()).then(|| self.to_string())
    }
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

/// `text` with each setting named in backquotes (`` `batch` ``) spelled as this process
/// spells settings: for texts that must be constants.
pub fn spell(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some((before, after)) = rest.split_once('`') {
        let Some((quoted, next)) = after.split_once('`') else {
            break;
        };
        out.push_str(before);
        match Setting::from_name(quoted) {
            Some(s) => out.push_str(&s.to_string()),
            None => out.push_str(&format!("`{quoted}`")),
        }
        rest = next;
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spell_names_settings_only() {
        let text = "with `schedule` cosine, not `cosine`, and a lone ` quote";
        let want = "with --schedule cosine, not `cosine`, and a lone ` quote";
        assert_eq!(spell(text), want);
    }

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
