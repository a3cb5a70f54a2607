//! Lines for the terminal, each written whole: the ranks of a job share one terminal (or one
//! pipe to `mpirun`), and a line printed piece by piece interleaves with other ranks' lines.

/// Writes `line` and a newline to stderr with a single write.
pub use ddl_cli::stderr_line as eprint_line;
