//! ddl-cli: what every ddl binary does the same way at its edges, kept out of the libraries
//! that do the work (a library, the Python extension included, writes no terminal lines of its
//! own choosing and leaves its host's signals alone):
//!
//! - [`output`]: lines written to stderr in one piece, stdout that ends the process with one
//!   line when it fails ([`outln!`]);
//! - [`signals`]: ending quietly when the reader of the output goes away;
//! - [`errors`]: an error with its causes on one line, each cause once, control characters
//!   escaped;
//! - [`launcher`]: the rank an MPI launcher gave this process;
//! - [`parse`]: clap's usage errors in one piece, a tool's body and its exit status;
//! - [`flags`]: how a user types each argument of a clap command line, for messages that name
//!   a setting by its flag.
//!
//! The last two, clap's, come with the feature `clap`, which the binaries' crates turn on.

pub mod errors;
#[cfg(feature = "clap")]
pub mod flags;
pub mod launcher;
pub mod output;
#[cfg(feature = "clap")]
pub mod parse;
pub mod signals;

pub use errors::{error_chain, error_line, escape_controls};
#[cfg(feature = "clap")]
pub use flags::flags;
pub use launcher::{launcher_rank, under_launcher};
pub use output::{stderr_line, write_stderr, write_stdout};
#[cfg(feature = "clap")]
pub use parse::{parse, parse_from, run};
pub use signals::init_binary_signals;
