//! Lines for the terminal, each written whole: the ranks of a job share one terminal (or one
//! pipe to `mpirun`), and a line printed piece by piece interleaves with other ranks' lines.

use std::io::Write;

/// Writes `line` and a newline to stderr with a single write.
pub fn eprint_line(line: &str) {
    let mut buf = String::with_capacity(line.len() + 1);
    buf.push_str(line);
    buf.push('\n');
    let _ = std::io::stderr().lock().write_all(buf.as_bytes());
}
