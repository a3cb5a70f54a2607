//! ddl-loader: the node-resident shard format (see `FORMAT.md`), ImageNet packing, the sampler
//! and the decode/augment pipeline that feeds every local replica of a node from RAM.

#![warn(missing_docs)]

mod augment;
pub mod dataset;
pub mod decode;
pub mod elastic;
pub mod error;
pub mod eval_image;
pub mod exchange_args;
pub mod exchange_cost;
pub mod fault;
pub mod format;
pub mod limits;
pub mod manifest;
pub mod pack;
pub mod pipeline;
pub mod placement;
pub mod progress;
pub mod sampler;
pub mod shard;
mod stage;
pub mod trace_records;
pub mod transform;
pub mod units;

pub use error::{LoaderError, Result};
