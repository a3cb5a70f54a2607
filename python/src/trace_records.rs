//! `ddl._ddl.TraceRecords`: one rank's record trace file, written in ddl-loader's format
//! ([`ddl_loader::trace_records`]) for `ddl.Loader(trace_records=...)`, which decides what
//! each line holds (python/ddl/_trace_records.py).

use std::path::PathBuf;

use ddl_loader::trace_records::{rank_file, Start, TraceLine, TraceWriter};
use ddl_loader::LoaderError;
use pyo3::exceptions::{PyFileNotFoundError, PyOSError, PyRuntimeError};
use pyo3::prelude::*;

use crate::errors::loader_error;

/// The Python exception of a trace file's error: an `OSError` naming the file.
fn trace_error(e: LoaderError) -> PyErr {
    match &e {
        LoaderError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            PyFileNotFoundError::new_err(e.to_string())
        }
        LoaderError::Io { .. } => PyOSError::new_err(e.to_string()),
        _ => loader_error(e),
    }
}

/// One rank's record trace file, buffered.
#[pyclass(module = "ddl._ddl")]
pub struct TraceRecords {
    /// None once forgotten in a forked child.
    writer: Option<TraceWriter>,
    rank: usize,
}

impl TraceRecords {
    fn writer(&mut self) -> PyResult<&mut TraceWriter> {
        self.writer.as_mut().ok_or_else(|| {
            PyRuntimeError::new_err("ddl.Loader: the record trace was left to the parent process")
        })
    }
}

#[pymethods]
impl TraceRecords {
    /// Opens the file of rank `rank` of `world_size` at `path` (`path.<rank>` for several
    /// ranks): emptied, or with `resumed_after` a global step, cut after that step and
    /// appended to.
    #[new]
    #[pyo3(signature = (path, *, rank, world_size, resumed_after))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        rank: usize,
        world_size: usize,
        resumed_after: Option<u64>,
    ) -> PyResult<TraceRecords> {
        let file = rank_file(&path, rank, world_size);
        let start = resumed_after.map_or(Start::Fresh, Start::After);
        let writer = py
            .detach(|| TraceWriter::open(&file, start))
            .map_err(trace_error)?;
        Ok(TraceRecords {
            writer: Some(writer),
            rank,
        })
    }

    /// Writes the line of a batch of `replica` at global step `step` of `epoch` holding the
    /// records `ids` (to the buffer).
    fn write(&mut self, epoch: u64, step: u64, replica: usize, ids: Vec<u64>) -> PyResult<()> {
        let rank = self.rank;
        let line = TraceLine {
            epoch,
            step,
            rank,
            replica,
            ids,
        };
        self.writer()?.write(&line).map_err(trace_error)
    }

    /// Writes the buffered lines to the file.
    fn flush(&mut self) -> PyResult<()> {
        self.writer()?.flush().map_err(trace_error)
    }

    /// In a child process just forked: lets go of the file without writing the lines the
    /// parent buffered (the parent writes them).
    fn forget_after_fork(&mut self) {
        std::mem::forget(self.writer.take());
    }
}
