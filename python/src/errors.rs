//! Python exceptions for ddl's errors: every message names the file, record or argument.

use ddl_comm::CommError;
use ddl_exchange::ExchangeError;
use ddl_loader::LoaderError;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyFileNotFoundError, PyValueError};
use pyo3::PyErr;

create_exception!(
    _ddl,
    DdlError,
    PyException,
    "Base class of ddl's errors (a ValueError or FileNotFoundError is raised for bad arguments and missing files)."
);
create_exception!(
    _ddl,
    ShardError,
    DdlError,
    "A shard or manifest is damaged, truncated, changed while mapped or does not match its manifest; the message names the file (and the record)."
);
create_exception!(
    _ddl,
    DistError,
    DdlError,
    "A communication error: a peer rank died or timed out, or MPI failed; the message names the operation and the ranks."
);

/// The Python exception for a loader error.
pub fn loader_error(e: LoaderError) -> PyErr {
    let msg = e.to_string();
    match e {
        LoaderError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            PyFileNotFoundError::new_err(msg)
        }
        LoaderError::InvalidConfig(_) => PyValueError::new_err(msg),
        LoaderError::Truncated { .. }
        | LoaderError::BadMagic { .. }
        | LoaderError::BadVersion { .. }
        | LoaderError::CorruptHeader { .. }
        | LoaderError::IndexChecksum { .. }
        | LoaderError::CorruptIndex { .. }
        | LoaderError::RecordChecksum { .. }
        | LoaderError::Json { .. }
        | LoaderError::Manifest { .. }
        | LoaderError::ShardMismatch { .. }
        | LoaderError::ShardChanged { .. } => ShardError::new_err(msg),
        _ => DdlError::new_err(msg),
    }
}

/// The Python exception for a communication error.
pub fn comm_error(e: CommError) -> PyErr {
    match e {
        CommError::InvalidArgument(_) => PyValueError::new_err(e.to_string()),
        _ => DistError::new_err(e.to_string()),
    }
}

/// The Python exception for an error of the record exchange: a ValueError naming `exchange`
/// when the fraction asks for more memory than the node has, a DistError when a peer failed.
pub fn exchange_error(e: ExchangeError) -> PyErr {
    let msg = format!("exchange: {e}");
    match e {
        ExchangeError::Memory { .. } => PyValueError::new_err(msg),
        ExchangeError::EpochsDiffer { .. } => PyValueError::new_err(format!(
            "{msg}: give every rank's loader the same set_epoch() (or none), and iterate every \
             epoch on every rank"
        )),
        ExchangeError::Comm { .. } | ExchangeError::Elsewhere { .. } => DistError::new_err(msg),
        ExchangeError::Loader { source, .. } => loader_error(source),
        _ => DdlError::new_err(msg),
    }
}
