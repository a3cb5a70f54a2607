//! ddl-sim: the training-step simulator over ddl-comm's cost model, for `ddl-bench sim` and
//! `ddl-plan`; no training run needs it.
//!
//! - [`step`]: the collectives and bytes of one training step, data-parallel or with the
//!   head split over the ranks, and their predicted time.
//! - [`timeline`]: a step whose allreduce overlaps backward and, under `priority`, the next
//!   forward, simulated with the cost model's predictions; [`bucket_schedule`]: that
//!   simulation for the buckets of a model's [`resnet`] stages, under `fifo` and `priority`.
//! - [`contention`]: how compute and communication on the same cores slow each other, and
//!   its measurement; [`StepModel`]: a cost model with that contention, the file
//!   [`calibrate`] writes.

#![warn(missing_docs)]

pub mod bucket_schedule;
pub mod calibrate;
pub mod contention;
pub mod model;
pub mod resnet;
pub mod step;
pub mod timeline;

pub use contention::Contention;
pub use model::StepModel;
