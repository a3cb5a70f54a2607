//! ddl-trainer-cli: the command lines of the trainer's binaries (`ddl-train`, `ddl-predict`,
//! `ddl-export`, `ddl-plan`) and the binaries themselves (`src/bin/`). `ddl-train`'s is
//! lowered from the table of settings ([`ddl_trainer::flag`]); the others are clap structs
//! whose argument ids are the names of the [`Setting`]s their library calls name, spelled as
//! those settings are (a test of each checks it).

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use ddl_trainer::flag::Named;

pub mod export;
pub mod plan;
pub mod predict;
pub mod train;

#[cfg(test)]
use ddl_trainer::Setting;

/// The clap value parser of a [`Named`] type: its names are the possible values, with their
/// help.
pub fn named<T: Named + Send + Sync>() -> impl TypedValueParser<Value = T> {
    let values = T::ALL.iter().map(|v| match v.help() {
        "" => PossibleValue::new(v.name()),
        help => PossibleValue::new(v.name()).help(ddl_trainer::config::spell(help)),
    });
    PossibleValuesParser::new(values).map(|name| T::from_name(&name).expect("a possible value"))
}

/// Asserts that every one of `settings` has a flag in the command line `A`, spelled as the
/// library's messages spell the setting.
#[cfg(test)]
fn assert_flags<A: clap::CommandFactory>(settings: &[Setting]) {
    let flags = ddl_cli::flags(&A::command());
    for setting in settings {
        let flag = flags.get(setting.name());
        assert_eq!(flag, Some(&setting.to_string()), "{setting:?}");
    }
}
