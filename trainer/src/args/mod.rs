//! The command lines of the trainer's binaries (`ddl-train`, `ddl-predict`, `ddl-export`,
//! `ddl-plan`): each flag's spelling, help and default in one clap struct, whose argument ids
//! are the names of the [`Setting`]s they set. A binary parses its own and installs it as the
//! spelling of settings ([`crate::setting::spell_as_flags_of`]); the rest of the library names
//! settings, never flags. Here rather than in the binaries so that the integration tests spell
//! settings as `ddl-train` does, and each command line's test runs with the library's.

pub mod export;
pub mod plan;
pub mod predict;
pub mod train;

#[cfg(test)]
use crate::setting::Setting;

/// Asserts that every one of `settings` has a flag in the command line `A`.
#[cfg(test)]
fn assert_flags<A: clap::CommandFactory>(settings: &[Setting]) {
    let flags = ddl_cli::flags(&A::command());
    let missing: Vec<&Setting> = settings
        .iter()
        .filter(|s| !flags.contains_key(s.name()))
        .collect();
    assert!(missing.is_empty(), "settings without a flag: {missing:?}");
}
