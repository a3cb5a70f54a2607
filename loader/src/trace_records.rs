//! The record trace: which records every batch held, one JSON line per batch, so that a user
//! can audit the order a job served its data in (`ddl-train --trace-records PATH`,
//! `ddl.Loader(trace_records=PATH)`).
//!
//! Each rank writes a file of its own ([`rank_file`]): `PATH` itself in a job of one rank,
//! `PATH.<rank>` (`trace.jsonl.0`, `trace.jsonl.1`, ...) in a job of several. A line is a
//! [`TraceLine`]:
//!
//! ```text
//! {"epoch":0,"step":1,"rank":0,"replica":0,"ids":[17,3,42,8]}
//! ```
//!
//! `ids` are the records' global ids, their positions in the split (`0..N`, in the
//! manifest's shard order, see [`crate::dataset::Dataset::global_id`]), in the batch's order.
//! `step` is a global step, 1-based: the batch of a job's first step is step 1. A resumed run
//! appends to its file, after cutting off the lines past the step it resumes from, which a
//! job killed after its last checkpoint may have left ([`Start::After`]).

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{LoaderError, Result};

/// One line of a record trace: the batch of one replica at one step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceLine {
    /// The epoch the batch belongs to.
    pub epoch: u64,
    /// The global step that trained the batch (1-based: steps completed once it is done).
    pub step: u64,
    /// The rank that trained the batch.
    pub rank: usize,
    /// The local replica (on `rank`) that trained the batch.
    pub replica: usize,
    /// The global ids of the batch's records, in batch order.
    pub ids: Vec<u64>,
}

/// The trace file of rank `rank` of a job of `ranks`: `path` for one rank, `path.<rank>` for
/// several.
///
/// # Examples
///
/// ```
/// use std::path::Path;
/// use ddl_loader::trace_records::rank_file;
///
/// assert_eq!(rank_file(Path::new("trace.jsonl"), 0, 1), Path::new("trace.jsonl"));
/// assert_eq!(rank_file(Path::new("trace.jsonl"), 1, 2), Path::new("trace.jsonl.1"));
/// ```
pub fn rank_file(path: &Path, rank: usize, ranks: usize) -> PathBuf {
    if ranks <= 1 {
        return path.to_path_buf();
    }
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{rank}"));
    PathBuf::from(name)
}

/// How a trace file starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// A new run: the file is created, or emptied.
    Fresh,
    /// A run resumed after global step `n`: the file keeps its lines up to step `n` (the lines
    /// after it, and a torn last line, are cut off) and the new lines follow.
    After(u64),
}

/// Writes a record trace, buffered: lines reach the file at [`TraceWriter::flush`] (or when
/// the buffer fills, and when the writer is dropped).
#[derive(Debug)]
pub struct TraceWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl TraceWriter {
    /// Opens the trace file `path` as `start` says.
    ///
    /// # Examples
    ///
    /// ```
    /// use ddl_loader::trace_records::{read, Start, TraceLine, TraceWriter};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("trace.jsonl");
    /// let line = |step| TraceLine { epoch: 0, step, rank: 0, replica: 0, ids: vec![step] };
    /// let mut w = TraceWriter::open(&path, Start::Fresh)?;
    /// for step in 1..=3 {
    ///     w.write(&line(step))?;
    /// }
    /// drop(w);
    /// // Resumed after step 2: step 3 is written again.
    /// let mut w = TraceWriter::open(&path, Start::After(2))?;
    /// w.write(&line(3))?;
    /// w.flush()?;
    /// assert_eq!(read(&path)?, vec![line(1), line(2), line(3)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open(path: &Path, start: Start) -> Result<TraceWriter> {
        if let Start::After(step) = start {
            cut_after(path, step)?;
        }
        let file = OpenOptions::new()
            .create(true)
            .write(true)
            .append(start != Start::Fresh)
            .truncate(start == Start::Fresh)
            .open(path)
            .map_err(|e| LoaderError::io("open", path, e))?;
        Ok(TraceWriter {
            path: path.to_path_buf(),
            out: BufWriter::new(file),
        })
    }

    /// The file written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `line` (to the buffer).
    pub fn write(&mut self, line: &TraceLine) -> Result<()> {
        serde_json::to_writer(&mut self.out, line)
            .map_err(std::io::Error::from)
            .and_then(|_| self.out.write_all(b"\n"))
            .map_err(|e| LoaderError::io("write", &self.path, e))
    }

    /// Writes the buffered lines to the file.
    pub fn flush(&mut self) -> Result<()> {
        self.out
            .flush()
            .map_err(|e| LoaderError::io("write", &self.path, e))
    }
}

/// The step of a line, read without its ids.
#[derive(Deserialize)]
struct StepOf {
    step: u64,
}

/// Cuts `path` (when it exists) before its first line past global step `step`, or before its
/// first line that is not a whole trace line (torn by a kill).
fn cut_after(path: &Path, step: u64) -> Result<()> {
    let file = match OpenOptions::new().read(true).write(true).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(LoaderError::io("open", path, e)),
    };
    let mut reader = BufReader::new(&file);
    let (mut keep, mut line) = (0u64, Vec::new());
    loop {
        line.clear();
        let n = reader
            .read_until(b'\n', &mut line)
            .map_err(|e| LoaderError::io("read", path, e))?;
        let whole = line.last() == Some(&b'\n');
        let ok = whole && serde_json::from_slice::<StepOf>(&line).is_ok_and(|l| l.step <= step);
        if n == 0 || !ok {
            break;
        }
        keep += n as u64;
    }
    file.set_len(keep)
        .map_err(|e| LoaderError::io("truncate", path, e))
}

/// Every line of the trace file `path` (an error names the file, the line and the column).
pub fn read(path: &Path) -> Result<Vec<TraceLine>> {
    let file = File::open(path).map_err(|e| LoaderError::io("open", path, e))?;
    serde_json::Deserializer::from_reader(BufReader::new(file))
        .into_iter()
        .collect::<std::result::Result<_, _>>()
        .map_err(|source| LoaderError::Json {
            path: path.to_path_buf(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(step: u64) -> TraceLine {
        TraceLine {
            epoch: step / 10,
            step,
            rank: 1,
            replica: 2,
            ids: vec![step, step + 100],
        }
    }

    #[test]
    fn lines_have_the_documented_fields_in_order() {
        let text = serde_json::to_string(&line(3)).unwrap();
        assert_eq!(
            text,
            r#"{"epoch":0,"step":3,"rank":1,"replica":2,"ids":[3,103]}"#
        );
    }

    #[test]
    fn fresh_empties_and_after_cuts_later_and_torn_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let mut w = TraceWriter::open(&path, Start::Fresh).unwrap();
        for step in 1..=5 {
            w.write(&line(step)).unwrap();
        }
        drop(w);
        // A kill mid-line.
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(br#"{"epoch":0,"step":6,"ra"#).unwrap();
        drop(f);

        let w = TraceWriter::open(&path, Start::After(9)).unwrap();
        drop(w);
        let all: Vec<u64> = read(&path).unwrap().iter().map(|l| l.step).collect();
        assert_eq!(all, [1, 2, 3, 4, 5], "the torn line is cut");

        let mut w = TraceWriter::open(&path, Start::After(3)).unwrap();
        w.write(&line(4)).unwrap();
        drop(w);
        let all: Vec<u64> = read(&path).unwrap().iter().map(|l| l.step).collect();
        assert_eq!(all, [1, 2, 3, 4]);

        drop(TraceWriter::open(&path, Start::Fresh).unwrap());
        assert_eq!(read(&path).unwrap(), vec![]);
    }

    #[test]
    fn resuming_without_a_file_creates_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new.jsonl");
        drop(TraceWriter::open(&path, Start::After(7)).unwrap());
        assert!(path.exists());
    }

    #[test]
    fn errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing").join("t.jsonl");
        let e = TraceWriter::open(&path, Start::Fresh).unwrap_err();
        assert!(e.to_string().contains(&path.display().to_string()), "{e}");
    }
}
