//! What every ddl binary does the same way at its edges (all of them link ddl-comm): ending
//! quietly when the reader of its output goes away, and writing an error with its causes on
//! one line, each cause once.

/// Restores SIGPIPE's default action, so that a binary whose reader closed the pipe
/// (`ddl-predict ... | head`) ends on its next write without a word, as C tools do. Rust
/// ignores SIGPIPE: the write fails with EPIPE and `println!` panics with a backtrace. Call
/// it first thing in `main`, in binaries only: a library (the Python extension included)
/// leaves its host's signals alone.
pub fn end_quietly_on_closed_pipe() {
    // SAFETY: setting a signal's disposition to its default has no preconditions; called at
    // start-up, before any thread that could be writing.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
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
