//! Lines for the terminal, each written whole: the ranks of a job share one terminal (or one
//! pipe to `mpirun`), and a line printed piece by piece interleaves with other ranks' lines.

use std::io::Write;

/// Writes `text` to stderr in one piece: Rust's stderr is unbuffered, so `eprintln!` issues one
/// `write` per formatted fragment, and the ranks of a job share one terminal (or one pipe to
/// `mpirun`), where a line printed piece by piece interleaves with other ranks' lines.
pub fn write_stderr(text: &str) {
    // Nothing sensible is left to do when stderr itself fails.
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// Writes `line` and a newline to stderr in one piece ([`write_stderr`]).
pub fn stderr_line(line: &str) {
    write_stderr(&format!("{line}\n"));
}

/// Writes `text` to stdout and flushes it. When stdout fails (a full disk, a file that cannot
/// grow), ends the process with one line on stderr naming the program and the failure, and
/// status 1: `println!` would panic with a backtrace and status 101. (A reader that closed
/// the pipe ends the process before, by SIGPIPE: [`crate::init_binary_signals`].) For the
/// binaries' output and the lines the trainer prints for them; `outln!` formats.
pub fn write_stdout(text: &str) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        let program = std::env::args_os()
            .next()
            .map(std::path::PathBuf::from)
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "ddl".into());
        stderr_line(&format!("{program}: cannot write to standard output: {e}"));
        std::process::exit(1);
    }
}

/// `println!` for ddl's binaries: the formatted line through [`write_stdout`], which ends the
/// process with one line when stdout fails instead of panicking.
///
/// # Examples
///
/// ```
/// ddl_cli::outln!("{} records", 42);
/// ```
#[macro_export]
macro_rules! outln {
    () => {
        $crate::output::write_stdout("\n")
    };
    ($($arg:tt)*) => {
        $crate::output::write_stdout(&format!("{}\n", format_args!($($arg)*)))
    };
}
