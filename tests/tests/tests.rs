//! The crate's integration tests, one binary (as ripgrep's tests/tests.rs): each module
//! is one concern; linking once instead of once per file keeps CI short.

mod bad_record;
mod binding;
mod compiled_mpi;
mod demo_learns;
mod demo_path;
mod exchange;
mod finetune;
mod full_disk;
mod gpu_bundle;
mod head_parallel;
mod imagenet22k;
mod kill_resume;
mod launchers;
mod models;
mod overlap_mpi;
mod readme;
mod recipe;
mod slurm;
mod synth;
mod tuning;
