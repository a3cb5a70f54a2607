//! A tool's command line and run: clap's usage errors and the tool's own errors each written
//! to stderr in one `write` (so that under `mpirun` one rank's message never interleaves with
//! another's), prefixed with the rank under an MPI launcher, and colour only on a terminal.

use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use crate::errors::error_line;
use crate::launcher::rank_prefix;
use crate::output::write_stderr;

/// Parses the command line into `A`; see [`parse_from`].
pub fn parse<A: clap::Parser>() -> A {
    parse_from(std::env::args_os())
}

/// Parses `args` into `A`. On a usage error clap's message (coloured only when its stream is a
/// terminal) is written in one piece and the process exits with clap's status: 2 for an error,
/// 0 for `--help` and `--version` (printed to stdout).
pub fn parse_from<A, I, T>(args: I) -> A
where
    A: clap::Parser,
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    match A::try_parse_from(args) {
        Ok(a) => a,
        Err(e) => {
            let styled = e.render();
            if e.use_stderr() {
                let text = if std::io::stderr().is_terminal() {
                    styled.ansi().to_string()
                } else {
                    styled.to_string()
                };
                write_stderr(&format!("{}{text}", rank_prefix()));
            } else {
                let text = if std::io::stdout().is_terminal() {
                    styled.ansi().to_string()
                } else {
                    styled.to_string()
                };
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
            }
            std::process::exit(e.exit_code())
        }
    }
}

/// Runs a tool's `body`: an error is written as one [`error_line`] and gives exit status 1;
/// a reader that closes the output pipe ends the tool quietly
/// ([`crate::init_binary_signals`]).
pub fn run(tool: &str, body: impl FnOnce() -> anyhow::Result<()>) -> ExitCode {
    crate::signals::init_binary_signals();
    match body() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            write_stderr(&error_line(tool, &e));
            ExitCode::FAILURE
        }
    }
}
