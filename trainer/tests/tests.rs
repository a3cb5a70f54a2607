//! The crate's integration tests, one binary (as ripgrep's tests/tests.rs): each module
//! is one concern; linking once instead of once per file keeps CI short.

mod checkpoint_dir;
mod common;
mod compiled;
mod config;
// The binaries' spelling of settings, so that messages name flags as users see them.
mod exactness;
mod exchange;
#[path = "../src/cli/flags.rs"]
mod flags;
mod head_parallel;
mod learn;
mod link;
mod many_classes;
mod model;
mod overlap;
mod residency;
mod resume;
mod trace;
mod trace_records;
mod weights;
