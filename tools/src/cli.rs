//! What every ddl tool does around its work: usage errors and run-time errors each written to
//! stderr in one `write` (so that under `mpirun` one rank's message never interleaves with
//! another's), prefixed with the rank under an MPI launcher, and colour only on a terminal.

use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;

/// Environment variables an MPI launcher sets (Open MPI, PMIx, MPICH/PMI, Intel MPI).
const LAUNCHER_VARS: [&str; 4] = [
    "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE",
    "PMIX_RANK",
    "MPI_LOCALNRANKS",
];

/// True when started by an MPI launcher (from the launcher's environment).
pub fn under_launcher() -> bool {
    LAUNCHER_VARS.iter().any(|v| std::env::var_os(v).is_some())
}

/// This process's rank when started by an MPI launcher, from the launcher's environment.
pub fn launcher_rank() -> Option<usize> {
    ["OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())
}

pub use ddl_comm::cli::{stderr_line, write_stderr};

/// `rank N: ` under an MPI launcher, empty otherwise.
fn rank_prefix() -> String {
    launcher_rank().map_or_else(String::new, |r| format!("rank {r}: "))
}

/// The line `[rank N: ]TOOL: error: CONTEXT: CAUSE: ...` (the whole chain on one line, its
/// control characters escaped: an error names files whose names come from outside), with its
/// newline.
pub fn error_line(tool: &str, e: &anyhow::Error) -> String {
    let chain = ddl_comm::cli::error_chain(&**e);
    let chain = ddl_comm::cli::escape_controls(&chain);
    format!("{}{tool}: error: {chain}\n", rank_prefix())
}

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
/// ([`ddl_comm::cli`]).
pub fn run(tool: &str, body: impl FnOnce() -> anyhow::Result<()>) -> ExitCode {
    ddl_comm::cli::init_binary_signals();
    match body() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            write_stderr(&error_line(tool, &e));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_line_holds_the_whole_chain_on_one_line() {
        let e = anyhow::anyhow!("disk full").context("write /x/manifest.json");
        let line = error_line("ddl-pack", &e);
        assert!(
            line.ends_with("ddl-pack: error: write /x/manifest.json: disk full\n"),
            "{line:?}"
        );
        assert_eq!(line.matches('\n').count(), 1, "{line:?}");
    }
}
