//! The error type of the trainer library.

use std::path::PathBuf;

/// Everything that can go wrong while configuring or running a training job.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A command-line flag or configuration value is invalid; names the flag.
    #[error("invalid {flag}: {message}")]
    Config {
        /// The flag (e.g. `--devices`) whose value is wrong.
        flag: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// A libtorch call failed.
    #[error("torch: {0}")]
    Torch(#[from] tch::TchError),
    /// The data loader failed.
    #[error("loader: {0}")]
    Loader(#[from] ddl_loader::LoaderError),
    /// A collective operation failed.
    #[error("comm: {0}")]
    Comm(#[from] ddl_comm::CommError),
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
}

impl TrainError {
    /// Shorthand for a configuration error naming `flag`.
    pub fn config(flag: &'static str, message: impl Into<String>) -> Self {
        TrainError::Config {
            flag,
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
