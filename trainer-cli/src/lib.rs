//! ddl-trainer-cli: the command lines of the trainer's binaries (`ddl-train`, `ddl-predict`,
//! `ddl-export`, `ddl-plan`) and the binaries themselves (`src/bin/`). Each flag's spelling,
//! help and default is in one clap struct, whose argument ids are the names of the
//! [`Setting`](ddl_trainer::setting::Setting)s they set. A binary parses its own and installs
//! it as the spelling of settings ([`ddl_trainer::setting::spell_as_flags_of`]); the library
//! ddl-trainer names settings, never flags. A library rather than the binaries' own modules so
//! that the trainer's integration tests spell settings as `ddl-train` does.

pub mod export;
pub mod plan;
pub mod predict;
pub mod train;

#[cfg(test)]
use ddl_trainer::setting::Setting;

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
