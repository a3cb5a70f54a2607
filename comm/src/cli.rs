//! What every ddl binary does the same way at its edges (all of them link ddl-comm): ending
//! quietly when the reader of its output goes away, writing a line to stderr in one piece, and
//! writing an error with its causes on one line, each cause once.

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
/// the pipe ends the process before, by SIGPIPE: [`init_binary_signals`].) For the
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
/// ddl_comm::outln!("{} records", 42);
/// ```
#[macro_export]
macro_rules! outln {
    () => {
        $crate::cli::write_stdout("\n")
    };
    ($($arg:tt)*) => {
        $crate::cli::write_stdout(&format!("{}\n", format_args!($($arg)*)))
    };
}

/// The signal dispositions of a ddl binary, set first thing in `main` (in binaries only: a
/// library, the Python extension included, leaves its host's signals alone):
///
/// - SIGPIPE to its default, so that a binary whose reader closed the pipe (`ddl-predict ... |
///   head`) ends on its next write without a word, as C tools do (Rust ignores SIGPIPE: the
///   write fails with EPIPE and `println!` panics with a backtrace);
/// - SIGXFSZ ignored, so that a write past the file-size limit (`ulimit -f`) fails with EFBIG,
///   which the binary reports naming the file (a checkpoint's partial file removed), instead of
///   the signal killing it without a line.
pub fn init_binary_signals() {
    // SAFETY: setting a signal's disposition has no preconditions; called at start-up, before
    // any thread that could be writing.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
}

/// `text` with its control characters escaped as JSON escapes them (`\n`, `\t`, `\u001b`...):
/// for names that come from outside (file names, archive members) on the way to a terminal,
/// where a newline would forge a line of output and an escape sequence would act on the
/// terminal. Text without control characters is returned as it is.
///
/// # Examples
///
/// ```
/// use ddl_comm::cli::escape_controls;
/// assert_eq!(escape_controls("n01/a.JPEG"), "n01/a.JPEG");
/// assert_eq!(escape_controls("a\nb\u{1b}[2J"), "a\\nb\\u001b[2J");
/// ```
pub fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `e` and its causes joined by ": ", leaving out a cause whose text the line already ends
/// with: the errors of ddl's libraries include their cause in their own message (so that
/// `to_string()` alone says everything) and also return it as their `source()`, and printing
/// the whole chain wrote "Permission denied (os error 13): Permission denied (os error 13)".
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !line.ends_with(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = c.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("read {path}: {source}")]
    struct Read {
        path: &'static str,
        #[source]
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("packing")]
    struct Packing(#[source] Read);

    #[test]
    fn each_cause_is_written_once() {
        let denied = || std::io::Error::from_raw_os_error(13);
        let e = Packing(Read {
            path: "/x",
            source: denied(),
        });
        assert_eq!(error_chain(&e), format!("packing: read /x: {}", denied()));
    }
}
