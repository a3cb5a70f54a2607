//! The signal dispositions every ddl binary starts with.

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
