//! Each setting as a command line takes it: the descriptor ([`Flag`]) that a table of
//! settings makes for each of its rows (`ddl-train`'s in config.rs), generic over the table's
//! settings so that it sits below them. How a value is typed is [`FlagValue`]'s. A binary
//! lowers the descriptors to its own argument parser (`ddl-train` to clap's); the library
//! depends on none.

pub use crate::flag_value::{Choice, FlagValue, Named, Takes};

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

/// How a user types one setting `S` of a table: what a binary lowers to an argument of its
/// command line. `ddl-train`'s table (config.rs) makes one per row
/// ([`crate::config::Setting::flag`]).
#[derive(Clone, Debug)]
pub struct Flag<S> {
    /// The setting it sets.
    pub setting: S,
    /// The setting's name (its field): the long name with `-` for `_`, unless `long` says.
    pub name: &'static str,
    /// The group `--help` lists it under.
    pub heading: Heading,
    /// The long name, without `--`, where it is not the setting's name with `-` for `_`.
    pub long: Option<&'static str>,
    /// The one-letter name, if any.
    pub short: Option<char>,
    /// The doc of the setting's row: its first paragraph is the short help, the whole the long;
    /// the settings it names are in backquotes (`` `batch` ``), for the table to spell.
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
    pub requires: Option<S>,
    /// A setting that cannot be given with this one.
    pub conflicts: Option<S>,
    /// A setting without which this one must be given.
    pub required_unless: Option<S>,
}

impl<S> Flag<S> {
    /// The descriptor of `setting`, named `name`, of type `T` with `doc`, before the row's own
    /// attributes.
    pub(crate) fn of<T: FlagValue>(
        setting: S,
        name: &'static str,
        heading: Heading,
        doc: &'static str,
        default: &T,
    ) -> Flag<S> {
        Flag {
            setting,
            name,
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
            None => self.name.replace('_', "-"),
        }
    }

    /// The short help: the first paragraph of the doc without its final period (settings in
    /// backquotes, as the doc names them).
    pub fn summary(&self) -> String {
        let first = paragraphs(self.doc).into_iter().next().unwrap_or_default();
        first.strip_suffix('.').unwrap_or(&first).to_string()
    }

    /// The long help: every paragraph of the doc (settings in backquotes).
    pub fn long_help(&self) -> String {
        paragraphs(self.doc).join("\n\n")
    }
}

/// The paragraphs of a doc comment (`///` lines, blank lines between paragraphs), each on
/// one line.
fn paragraphs(doc: &str) -> Vec<String> {
    doc.split("\n\n")
        .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|p| !p.is_empty())
        .collect()
}
