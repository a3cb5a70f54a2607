//! The crate's integration tests, one binary (as ripgrep's tests/tests.rs): each module
//! is one concern; linking once instead of once per file keeps CI short.

mod checkpoint_dir;
mod common;
mod compiled;
mod config;
mod exactness;
mod exchange;
mod head_parallel;
mod learn;
mod many_classes;
mod model;
mod overlap;
mod residency;
mod resume;
mod served_record;
mod trace;
mod trace_records;
mod weights;
