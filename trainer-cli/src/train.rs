//! `ddl-train`'s command line, lowered from the table of settings: each [`Setting`] of a
//! [`TrainConfig`] field gives its [`Flag`] (name, help, default, choices, check, heading),
//! which becomes one clap argument whose id is the setting's name, and whose values set that
//! field ([`TrainConfig::set_flag`]). Nothing here names a setting's flag or default: the table
//! in ddl-trainer's config.rs does.

use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Command};

use ddl_trainer::config::spell;
use ddl_trainer::flag::{Flag, Heading, Takes};
use ddl_trainer::Setting;
use ddl_trainer::{TrainConfig, TrainError};

/// What `ddl-train` does, the first line of its help.
const ABOUT: &str = "Train an image classifier data-parallel on shards written by ddl-pack";

/// The rest of `--help`'s opening.
const LONG_ABOUT: &str = "Train an image classifier data-parallel on shards written by \
ddl-pack.

Runs as one process per node (or per GPU) under mpirun or srun, or alone as one rank. Each \
rank trains a replica on each of its devices; the gradients are summed across replicas and \
ranks every step.";

/// Examples, after the flags in `--help`.
const EXAMPLES: &str = "Examples:
  ddl-train --data shards --model resnet50 --epochs 90 --checkpoint-dir ckpt
  mpirun -np 4 ddl-train --data shards --batch 64 --precision bf16 --compile
  ddl-train --data shards --checkpoint-dir ckpt --resume";

/// What `ddl-train`'s command line gives: the run's settings (with a default stop request,
/// which the binary replaces with the one its signal handlers raise) and where to write the
/// run's trace.
#[derive(Debug)]
pub struct Args {
    /// The settings of the run.
    pub config: TrainConfig,
    /// `--trace FILE`: a Chrome trace of the run.
    pub trace: Option<PathBuf>,
}

/// The flags of the settings, in the order `--help` lists them: by heading, then as the table
/// has them.
pub fn flags() -> Vec<Flag<Setting>> {
    let mut flags: Vec<Flag<Setting>> = Setting::TRAIN.iter().filter_map(|s| s.flag()).collect();
    flags.sort_by_key(|f| f.heading);
    flags
}

/// `ddl-train`'s command line: an argument per setting of [`TrainConfig`], and `--trace`.
pub fn command() -> Command {
    let command = Command::new("ddl-train")
        .version(env!("CARGO_PKG_VERSION"))
        .about(ABOUT)
        .long_about(LONG_ABOUT)
        .after_long_help(EXAMPLES)
        .max_term_width(100);
    let trace = Arg::new("trace")
        .long("trace")
        .value_name("FILE")
        .value_parser(clap::value_parser!(PathBuf))
        .help("Write a Chrome trace (Perfetto, chrome://tracing) of the run to FILE")
        .long_help(
            "Write a Chrome trace (Perfetto, chrome://tracing) of the run to FILE on rank 0 and \
             to STEM.rankN.json beside it on rank N (trace.json -> trace.rank1.json).",
        )
        .help_heading(Heading::Diagnostics.title());
    flags()
        .iter()
        .fold(command, |c, f| c.arg(argument(f)))
        .arg(trace)
}

/// The clap argument of `flag`: `-h` gives its summary alone, on one line; `--help` its whole
/// doc, its default and its choices with their help.
fn argument(flag: &Flag<Setting>) -> Arg {
    let mut arg = Arg::new(flag.setting.name())
        .long(flag.long_name())
        .help(spell(&flag.summary()))
        .long_help(long_help(flag))
        .help_heading(flag.heading.title())
        .hide_default_value(true)
        .hide_possible_values(true);
    if let Some(short) = flag.short {
        arg = arg.short(short);
    }
    if let Some(name) = flag.requires {
        arg = arg.requires(name.name());
    }
    if let Some(name) = flag.conflicts {
        arg = arg.conflicts_with(name.name());
    }
    if let Some(name) = flag.required_unless {
        arg = arg.required_unless_present(name.name());
    }
    let action = match flag.takes {
        Takes::Switch => {
            let on = flag.default.as_deref() == Some("true");
            return arg.action(if on {
                ArgAction::SetFalse
            } else {
                ArgAction::SetTrue
            });
        }
        Takes::One => ArgAction::Set,
        Takes::List => {
            arg = arg.value_delimiter(',');
            ArgAction::Append
        }
        Takes::Repeated => ArgAction::Append,
    };
    let value_name = match flag.value_name {
        Some(name) => name.to_string(),
        None => flag.setting.name().to_uppercase(),
    };
    if let Some(default) = &flag.default {
        arg = arg.default_value(default.clone());
    }
    // A closure is a value parser whose errors clap words as its own ("invalid value 'x'
    // for '--flag <FLAG>': ...").
    let check = flag.check;
    let parse = move |s: &str| check(s).map(|()| s.to_string());
    arg.value_name(value_name)
        .action(action)
        .value_parser(parse)
}

/// `flag`'s `--help` text: its doc, then its choices, one line each, and its default.
fn long_help(flag: &Flag<Setting>) -> String {
    let mut help = spell(&flag.long_help());
    if !flag.choices.is_empty() {
        help.push_str("\n\nPossible values:");
        for choice in &flag.choices {
            let shown = if choice.syntax.is_empty() {
                choice.name
            } else {
                choice.syntax
            };
            help.push_str(&format!("\n  - {shown}"));
            if !choice.help.is_empty() {
                help.push_str(&format!(": {}", spell(choice.help)));
            }
        }
    }
    if let (Some(default), false) = (&flag.default, flag.takes == Takes::Switch) {
        help.push_str(&format!("\n\n[default: {default}]"));
    }
    help
}

impl Args {
    /// The settings the command line `matches` (of [`command`]) gives: [`TrainConfig`]'s
    /// defaults, and each flag typed set from its values.
    pub fn from_matches(matches: &ArgMatches) -> anyhow::Result<Args> {
        let mut config = TrainConfig::default();
        for flag in flags() {
            let id = flag.setting.name();
            if matches.value_source(id) != Some(ValueSource::CommandLine) {
                continue;
            }
            let values: Vec<String> = match flag.takes {
                Takes::Switch => vec![matches.get_flag(id).to_string()],
                _ => matches
                    .get_many::<String>(id)
                    .into_iter()
                    .flatten()
                    .cloned()
                    .collect(),
            };
            let values: Vec<&str> = values.iter().map(String::as_str).collect();
            let setting = flag.setting;
            config
                .set_flag(setting, &values)
                .map_err(|m| TrainError::config(setting, m))?;
        }
        let trace = matches.get_one::<PathBuf>("trace").cloned();
        Ok(Args { config, trace })
    }

    /// The settings of the command line `args` (the program's name first), or clap's usage
    /// error, or an error of a value that the setting refuses as a whole.
    pub fn try_parse_from<I, T>(args: I) -> anyhow::Result<Args>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        Args::from_matches(&command().try_get_matches_from(args)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ddl_comm::Algorithm;

    fn parse(args: &[&str]) -> TrainConfig {
        let args = std::iter::once("ddl-train").chain(args.iter().copied());
        Args::try_parse_from(args).expect("parse").config
    }

    fn json(c: &TrainConfig) -> serde_json::Value {
        serde_json::to_value(c).expect("serialize")
    }

    /// Every flag left out means [`TrainConfig::default`]'s value, milestones (written as the
    /// command line spells them) and the switches (`--no-eval`, `--quiet`) included.
    #[test]
    fn flags_left_out_are_the_library_defaults() {
        let want = TrainConfig {
            data: "shards".into(),
            ..TrainConfig::default()
        };
        assert_eq!(json(&parse(&["--data", "shards"])), json(&want));
    }

    /// Flags typed set their settings: a switch that turns one off, lists, a repeated flag,
    /// `auto` as no value and a renamed flag.
    #[test]
    fn flags_typed_set_their_settings() {
        let cfg = parse(&[
            "--data=d",
            "--no-eval",
            "--quiet",
            "--milestones",
            "10,20",
            "--crop-scale=0.2,0.9",
            "--compile",
            "--inductor-option",
            "a=1",
            "--inductor-option",
            "b=2",
            "--overlap",
            "pipeline",
            "--comm-timeout",
            "5",
            "--allreduce",
            "multicolor:2",
            "--mlock",
        ]);
        assert!(!cfg.eval && !cfg.verbose && cfg.compile && cfg.lock);
        assert_eq!(cfg.milestones, [10, 20]);
        assert_eq!(cfg.crop_scale, [0.2, 0.9]);
        assert_eq!(cfg.inductor_options, ["a=1", "b=2"]);
        assert_eq!(cfg.overlap, Some(ddl_trainer::config::Overlap::Pipeline));
        assert_eq!(cfg.comm_timeout_s, 5);
        assert_eq!(cfg.allreduce, "multicolor:2".parse().unwrap());
        assert_eq!(parse(&["--data=d", "--overlap=auto"]).overlap, None);
    }

    /// A list of the wrong length is refused naming the flag.
    #[test]
    fn a_list_of_the_wrong_length_names_its_flag() {
        let err = Args::try_parse_from(["ddl-train", "--data=d", "--mean", "0.5,0.5"]);
        let err = err.expect_err("two of three").to_string();
        assert!(
            err.contains("--mean: takes 3 comma-separated values, got 2"),
            "{err}"
        );
    }

    /// Every setting of a training run is an argument of the command line, spelled there as
    /// the library's messages spell it.
    #[test]
    fn every_setting_is_a_flag_spelled_as_messages_spell_it() {
        let flags = ddl_cli::flags(&command());
        for setting in Setting::TRAIN {
            assert_eq!(
                flags.get(setting.name()),
                Some(&setting.to_string()),
                "{setting:?}"
            );
        }
        assert_eq!(
            flags.len(),
            Setting::TRAIN.len() + 1,
            "the settings and --trace"
        );
    }

    /// `-h`: the six headings, in order, and one line per flag.
    #[test]
    fn short_help_has_the_headings_and_a_line_per_flag() {
        let help = command().render_help().to_string();
        let mut at = 0;
        for heading in Heading::ALL {
            let title = format!("\n{}:\n", heading.title());
            let found = help[at..].find(&title);
            at += found.unwrap_or_else(|| panic!("no {title:?} after byte {at}:\n{help}"));
        }
        assert!(help.starts_with(ABOUT), "{help}");
        for flag in flags() {
            assert!(!flag.summary().is_empty(), "{:?} has no help", flag.setting);
        }
        for line in help.lines() {
            assert!(
                line.chars().count() <= 100,
                "a line past 100 columns: {line}"
            );
        }
    }

    /// The choices of `--allreduce` in the help are the algorithms its parser accepts, and
    /// every choice listed parses.
    #[test]
    fn help_lists_the_choices_the_parsers_accept() {
        let help = command().render_long_help().to_string();
        let allreduce = &help[help.find("--allreduce <NAME>").expect("--allreduce")..];
        let allreduce = &allreduce[..allreduce.find("\n      --").expect("a flag after it")];
        for name in Algorithm::names() {
            assert!(allreduce.contains(name), "{name} missing:\n{allreduce}");
        }
        for flag in flags() {
            for choice in &flag.choices {
                let mut cfg = TrainConfig::default();
                let set = cfg.set_flag(flag.setting, &[choice.name]);
                assert!(set.is_ok(), "{:?} {}: {set:?}", flag.setting, choice.name);
            }
        }
    }
}
