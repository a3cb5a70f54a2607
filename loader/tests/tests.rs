//! The crate's integration tests, one binary (as ripgrep's tests/tests.rs): each module
//! is one concern; linking once instead of once per file keeps CI short.

mod common;
mod dataset;
mod elastic;
mod memory;
mod pack;
mod pack_downloads;
mod pack_split;
mod pack_tfrecord;
mod pipeline;
mod reader_robustness;
mod shard_changed;
mod transform;
