//! The integration tests of the trainer's binaries, one binary (as ripgrep's tests/tests.rs):
//! each module is one concern. Only this crate, which owns `ddl-train`, `ddl-predict`,
//! `ddl-export` and `ddl-plan`, can run them by `CARGO_BIN_EXE_*`.

mod checkpoint_dir;
mod common;
mod flags;
mod link;
