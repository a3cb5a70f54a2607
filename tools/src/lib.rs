//! ddl-tools: the libraries behind ddl's command-line tools (`ddl-pack`, `ddl-prof`,
//! `ddl-bench`, `ddl-synth`); the binaries in `src/bin` only parse flags and call these.

#![warn(missing_docs)]

pub mod bench;
pub mod pack_cli;
pub mod prof;
pub mod synth;
