//! The error type of the trainer library.

use std::path::PathBuf;

use crate::config::{joined, Setting};
use crate::device::spec::DeviceSpecError;

/// Everything that can go wrong while configuring or running a training job.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A setting's value is invalid; names the setting (or the settings that can lift it).
    #[error("invalid {}: {message}", joined(.settings))]
    Config {
        /// The settings whose values are wrong (usually one).
        settings: Vec<Setting>,
        /// What is wrong with it.
        message: String,
    },
    /// The compiled step (`compile`) could not be compiled, loaded or run.
    #[error("compile: {0}")]
    Compile(String),
    /// A libtorch call failed.
    #[error("torch: {0}")]
    Torch(#[from] tch::TchError),
    /// The data loader failed.
    #[error("loader: {0}")]
    Loader(#[from] ddl_loader::LoaderError),
    /// A collective operation failed.
    #[error("comm: {0}")]
    Comm(#[from] ddl_comm::CommError),
    /// The record exchange between nodes failed.
    #[error(transparent)]
    Exchange(#[from] ddl_exchange::ExchangeError),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A checkpoint file is damaged or does not fit the model.
    #[error("checkpoint {path}: {message}")]
    Checkpoint {
        /// The checkpoint file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A weights file (`init_from`, `export`, `ddl-export`, `ddl-predict`) is unreadable
    /// or does not fit the model; names the file and the tensor.
    #[error(transparent)]
    Weights(Box<crate::weights::error::WeightsError>),
    /// Model replicas (inside this rank or across ranks) hold different weights.
    #[error("replica mismatch: {0}")]
    ReplicaMismatch(String),
    /// A replica thread died or stopped answering.
    #[error("replica {replica}: {message}")]
    Replica {
        /// Local replica index.
        replica: usize,
        /// What happened.
        message: String,
    },
    /// Training diverged (non-finite loss).
    #[error("non-finite loss at global step {step}")]
    NonFinite {
        /// The global step at which the loss became NaN or infinite.
        step: u64,
    },
    /// A checkpoint could not be written (disk full, ...); its partial file was removed.
    #[error(
        "checkpoint {path}: cannot write {needed} bytes ({}{}): {source}; the partial file was \
         removed. Free space there, or resume with a lower {kc} (older \
         checkpoints are pruned before the next one is written)",
        mib(*.needed),
        .available.map_or(String::new(), |a| format!(", {a} bytes ({}) free on its file system", mib(a))),
        kc = Setting::KeepCheckpoints
    )]
    CheckpointWrite {
        /// The checkpoint file.
        path: PathBuf,
        /// Size of the checkpoint.
        needed: u64,
        /// Free bytes on the file system (`statvfs`), if known.
        available: Option<u64>,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A checkpoint would exceed this process's file-size limit (`ulimit -f`, RLIMIT_FSIZE); its
    /// partial file was removed.
    #[error(
        "checkpoint {path}: its {needed} bytes ({}) exceed this process's file-size limit \
         (ulimit -f): raise the limit (ulimit -f unlimited) and run the same command with \
         {resume}; the partial file was removed",
        mib(*.needed),
        path = .path.display(),
        resume = Setting::Resume
    )]
    CheckpointTooLarge {
        /// The checkpoint file.
        path: PathBuf,
        /// Size of the checkpoint.
        needed: u64,
    },
    /// The checkpoint directory holds files of another run and this run would mix with them.
    #[error(
        "{cd} {dir} holds {count} checkpoint file(s) of another run (newest {newest}): \
         add {resume} to continue that run, {restart} to move its files into a dated \
         subdirectory and start over, or choose an empty directory",
        dir = .dir.display(),
        cd = Setting::CheckpointDir,
        resume = Setting::Resume,
        restart = Setting::Restart
    )]
    CheckpointDirInUse {
        /// The directory.
        dir: PathBuf,
        /// Checkpoint files (and partial ones) in it.
        count: usize,
        /// Name of the newest.
        newest: String,
    },
    /// `resume` found checkpoint files, every one of them damaged: nothing to continue from,
    /// and nothing was trained or removed.
    #[error(
        "{resume}: every checkpoint in {dir} ({damaged} file(s), each named in a warning above) \
         is damaged, so there is nothing to continue from; nothing was trained and nothing \
         removed. Restore an intact checkpoint there, or move the damaged ones aside (or rerun \
         without {resume} and with {restart}, which moves them into a dated subdirectory) to \
         start over",
        dir = .dir.display(),
        resume = Setting::Resume,
        restart = Setting::Restart
    )]
    NoIntactCheckpoint {
        /// The checkpoint directory.
        dir: PathBuf,
        /// Damaged checkpoint files.
        damaged: usize,
    },
    /// Another run holds the checkpoint directory's lock (see `train::dir_lock`).
    #[error(
        "{cd} {dir}: another ddl-train run is using it ({holder}); two runs in one \
         directory would prune and replace each other's checkpoints: wait for that run to end, \
         or give this one another {cd}",
        dir = .dir.display(),
        cd = Setting::CheckpointDir
    )]
    CheckpointDirLocked {
        /// The directory.
        dir: PathBuf,
        /// Who holds it: "pid PID on host HOST".
        holder: String,
    },
    /// `resume` found a checkpoint written with settings that change the trajectory.
    #[error(
        "{resume}: checkpoint {path} was written by a run with other flags: {}. Rerun with the \
         checkpoint's values to continue it, or start over with {restart} (or another \
         {cd})",
        .differences.join("; "),
        path = .path.display(),
        resume = Setting::Resume,
        restart = Setting::Restart,
        cd = Setting::CheckpointDir
    )]
    ResumeMismatch {
        /// The checkpoint file.
        path: PathBuf,
        /// One line per differing setting, with both values.
        differences: Vec<String>,
    },
    /// Rank 0 failed with this message in a decision it shares with every rank.
    #[error("{0}")]
    FromRoot(String),
    /// A SIGTERM or SIGINT (or the job's time limit ahead) stopped the run after a step; all
    /// ranks agreed on it.
    #[error(
        "stopped {} after global step {global_step} (epoch {epoch}, step {step}): {}",
        .signal.cause(),
        .checkpoint.as_ref().map_or(
            format!("no {}, so nothing was saved", Setting::CheckpointDir),
            |p| format!("checkpoint {} written; run the same command with {} to continue", p.display(), Setting::Resume)
        )
    )]
    Preempted {
        /// The signal (or the time limit).
        signal: crate::signal::StopSignal,
        /// Optimizer steps completed.
        global_step: u64,
        /// Epoch of the last step.
        epoch: u64,
        /// Steps completed in that epoch.
        step: u64,
        /// The checkpoint to resume from, if the run has a checkpoint directory.
        checkpoint: Option<PathBuf>,
    },
}

impl From<DeviceSpecError> for TrainError {
    fn from(e: DeviceSpecError) -> Self {
        TrainError::config(Setting::Devices, e.to_string())
    }
}

impl From<crate::weights::error::WeightsError> for TrainError {
    fn from(e: crate::weights::error::WeightsError) -> Self {
        TrainError::Weights(Box::new(e))
    }
}

/// `bytes` in MiB for messages.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", ddl_loader::units::mib(bytes))
}

impl TrainError {
    /// Shorthand for a configuration error naming `setting`.
    pub fn config(setting: Setting, message: impl Into<String>) -> Self {
        TrainError::Config {
            settings: vec![setting],
            message: message.into(),
        }
    }

    /// Shorthand for an I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        TrainError::Io {
            path: path.into(),
            source,
        }
    }
}

/// Result alias of the trainer library.
pub type Result<T> = std::result::Result<T, TrainError>;
