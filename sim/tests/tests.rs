//! The crate's integration tests, one binary (as ripgrep's tests/tests.rs): each module
//! is one concern; linking once instead of once per file keeps CI short.

mod common;
mod contention;
mod model;
mod step;
