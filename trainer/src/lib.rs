//! ddl-trainer: data-parallel training of image classifiers with tch (libtorch).
//!
//! - [`model`]: torchvision ResNet-18/34/50/101/152, a small ResNet and a BatchNorm-free net.
//! - [`compiled`]: the training step compiled ahead of time by Inductor (`compile`).
//! - [`table`]: the data-parallel table (one thread and replica per local device, bucketed
//!   tree sum inside the node, allreduce across ranks overlapped with a staged backward or
//!   pipelined after it: `overlap`).
//! - [`optim`], [`schedule`]: SGD with momentum / Nesterov and decoupled-from-BN weight decay;
//!   linear scaling, warmup, step or cosine decay.
//! - [`checkpoint`]: atomic, checksummed checkpoints that resume bit-exactly.
//! - [`config`]: the run's configuration (the `ddl-train` flags) and the types of its flags,
//!   with each setting's default and class on resume in one table; [`setting`]: the settings
//!   messages name, spelled as the flags of the binary that runs (the binaries and their
//!   command lines are the crate ddl-trainer-cli).
//! - [`train`](mod@train): the per-rank driver used by `ddl-train` (and by tests over in-process ranks).
//! - [`metrics`]: JSON-lines metrics.
//! - [`signal`]: SIGTERM/SIGINT stop a run after a step, with a checkpoint to resume from;
//!   [`slurm`]: what Slurm says about how long such a stop has.
//! - [`run_flags`]: which flags a resumed run must share with its checkpoint.
//! - [`memory`]: the parameter copies and gradient buckets a rank holds (`ddl-plan`).
//! - [`validate`]: range checks of the numeric flags and the batch-memory estimate.
//! - [`weights`]: models in and out: torchvision-compatible state dicts in `.safetensors`
//!   files (`export`, `init_from`), [`export`] of checkpoints (`ddl-export`) and
//!   [`predict`]ion (`ddl-predict`).
//!
//! # Launching
//!
//! `ddl-train` is a plain MPI program: `mpirun -np R ddl-train ...` or `srun ddl-train ...`,
//! or a single process without a launcher. The node index and the rank within the node come
//! from MPI's shared-memory split (ddl-comm's `World`). With `residency` node (default) the
//! ranks of a node share that node's shards; `residency` rank makes every rank its own node
//! (to emulate a multi-node run on one machine). `batch` is per replica: the global batch
//! is batch x replicas per rank x ranks, and the peak learning rate is
//! `base_lr` x global batch / 256.
//!
//! # Checkpoints
//!
//! Rank 0 writes one file per checkpoint holding the weights, the momentum and the BatchNorm
//! statistics of every replica of every rank (gathered over the transport); on `resume`
//! rank 0 picks the newest intact file and broadcasts it, so only rank 0 needs to see the
//! checkpoint directory. See [`checkpoint`] for the format. A checkpoint directory belongs to
//! one run: a new run refuses one holding another run's checkpoints unless it continues them
//! (`resume`, which also refuses a checkpoint written with flags that change the trajectory,
//! see [`run_flags`]) or moves them aside (`restart`).
//!
//! # Determinism
//!
//! On CPU a run is a pure function of its flags and rank count: weights are drawn from
//! `seed` on the CPU and copied to every replica, the loader's batches depend only on
//! (seed, epoch, step, replica), the intra-node sum follows a fixed tree and bucket order, the
//! allreduce algorithms are deterministic, every replica runs with one intra-op thread, and
//! the staged backward of `overlap` backward gives bitwise the gradients of one backward.
//! That is what makes a resumed run bitwise identical to an uninterrupted one.

#![warn(missing_docs)]

pub mod checkpoint;
pub mod comm;
pub mod compiled;
pub mod config;
pub mod console;
pub mod device;
pub mod error;
pub mod export;
pub mod flag;
pub mod flag_value;
pub mod job;
pub mod memory;
pub mod metrics;
pub mod model;
pub mod optim;
pub mod predict;
pub mod run_flags;
pub mod schedule;
pub mod setting;
pub mod signal;
pub mod size_schedule;
pub mod slurm;
pub mod table;
mod trace_records;
pub mod train;
pub mod validate;
pub mod variables;
pub mod weights;

pub use config::Setting;
pub use config::TrainConfig;
pub use error::{Result, TrainError};
pub use train::{train, RankInfo, TrainSummary};
