//! `ddl._ddl.TraceRecords`: one rank's record trace file, written in ddl-loader's format
//! ([`ddl_loader::trace_records`]) for `ddl.Loader(trace_records=...)`, which decides what
//! each line holds (python/ddl/_trace_records.py).
//!
//! The file is locked from the loader's construction to its close, so that a second loader
//! (or a ddl-train run) given the same path is refused at once; its lines are cut or emptied
//! only when the loader first delivers a batch ([`TraceRecords::start`]).

use std::ffi::CString;
use std::path::{Path, PathBuf};

use ddl_loader::trace_records::{
    cut_departed, rank_file, Cut, Start, TraceFile, TraceLine, TraceWriter,
};
use ddl_loader::LoaderError;
use pyo3::exceptions::{
    PyFileNotFoundError, PyOSError, PyRuntimeError, PyRuntimeWarning, PyValueError,
};
use pyo3::prelude::*;

use crate::errors::loader_error;

/// The Python exception of a trace file's error: a ValueError naming `trace_records` for a
/// file another writer holds, else an `OSError` naming the file.
fn trace_error(e: LoaderError) -> PyErr {
    match &e {
        LoaderError::TraceBusy { .. } => PyValueError::new_err(format!("trace_records: {e}")),
        LoaderError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            PyFileNotFoundError::new_err(e.to_string())
        }
        LoaderError::Io { .. } => PyOSError::new_err(e.to_string()),
        _ => loader_error(e),
    }
}

/// Where a trace file stands.
enum State {
    /// Locked, its content untouched: nothing delivered since the loader was made or restored.
    Locked(TraceFile),
    /// Written to.
    Writing(TraceWriter),
}

/// One rank's record trace file, buffered.
#[pyclass(module = "ddl._ddl")]
pub struct TraceRecords {
    /// None once closed, or forgotten in a forked child.
    state: Option<State>,
    path: PathBuf,
    rank: usize,
    world_size: usize,
}

impl TraceRecords {
    fn gone() -> PyErr {
        PyRuntimeError::new_err(
            "ddl.Loader: the record trace was closed, or left to the parent process",
        )
    }

    fn writer(&mut self) -> PyResult<&mut TraceWriter> {
        match &mut self.state {
            Some(State::Writing(w)) => Ok(w),
            Some(State::Locked(_)) => Err(PyRuntimeError::new_err(
                "ddl.Loader: the record trace was not started",
            )),
            None => Err(Self::gone()),
        }
    }
}

/// Warns (RuntimeWarning) of the lines of the trace `file` a resume dropped as not trace lines.
fn warn_unreadable(py: Python<'_>, file: &Path, cut: &Cut) -> PyResult<()> {
    if cut.unreadable.is_empty() {
        return Ok(());
    }
    let message = format!(
        "ddl.Loader: record trace {}: line(s) {:?} are not trace lines and were removed; the \
         trace lines around them are kept",
        file.display(),
        cut.unreadable
    );
    let message = CString::new(message).unwrap_or_default();
    PyErr::warn(py, &py.get_type::<PyRuntimeWarning>(), &message, 1)
}

#[pymethods]
impl TraceRecords {
    /// Opens and locks the file of rank `rank` of `world_size` at `path` (`path.<rank>` for
    /// several ranks), leaving its content as it is: ValueError while another loader or run
    /// writes it.
    #[new]
    #[pyo3(signature = (path, *, rank, world_size))]
    fn new(py: Python<'_>, path: PathBuf, rank: usize, world_size: usize) -> PyResult<Self> {
        let file = rank_file(&path, rank, world_size);
        let locked = py.detach(|| TraceFile::lock(&file)).map_err(trace_error)?;
        Ok(TraceRecords {
            state: Some(State::Locked(locked)),
            path,
            rank,
            world_size,
        })
    }

    /// Starts writing, unless started: the file emptied, or with `resumed_after` a global step
    /// of a job of `world_size_before` ranks, cut after that step and appended to (on rank 0,
    /// the files of that job's ranks this job does not have are cut there too).
    #[pyo3(signature = (resumed_after, world_size_before))]
    fn start(
        &mut self,
        py: Python<'_>,
        resumed_after: Option<u64>,
        world_size_before: usize,
    ) -> PyResult<()> {
        let locked = match self.state.take() {
            Some(State::Locked(f)) => f,
            other => {
                let started = other.is_some();
                self.state = other;
                return if started { Ok(()) } else { Err(Self::gone()) };
            }
        };
        let (path, ranks) = (self.path.clone(), self.world_size);
        let departed = match (resumed_after, self.rank) {
            (Some(step), 0) => py
                .detach(|| cut_departed(&path, world_size_before, ranks, step))
                .map_err(trace_error)?,
            _ => Vec::new(),
        };
        let start = resumed_after.map_or(Start::Fresh, Start::After);
        let file = locked.path().to_path_buf();
        let (writer, cut) = py.detach(|| locked.start(start)).map_err(trace_error)?;
        self.state = Some(State::Writing(writer));
        for (other, cut) in &departed {
            warn_unreadable(py, other, cut)?;
        }
        warn_unreadable(py, &file, &cut)
    }

    /// Back to the state before [`TraceRecords::start`] (the loader was restored): the lines
    /// so far written, the file still locked.
    fn restart(&mut self) -> PyResult<()> {
        self.state = match self.state.take() {
            Some(State::Writing(w)) => Some(State::Locked(w.into_file().map_err(trace_error)?)),
            Some(locked) => Some(locked),
            None => return Err(Self::gone()),
        };
        Ok(())
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
        match &mut self.state {
            Some(State::Writing(w)) => w.flush().map_err(trace_error),
            _ => Ok(()),
        }
    }

    /// Writes the buffered lines and closes the file, which releases its lock.
    fn close(&mut self) -> PyResult<()> {
        self.flush()?;
        self.state = None;
        Ok(())
    }

    /// In a child process just forked: lets go of the file without writing the lines the
    /// parent buffered (the parent writes them) or touching its lock (the parent's).
    fn forget_after_fork(&mut self) {
        std::mem::forget(self.state.take());
    }
}
