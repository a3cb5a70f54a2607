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
//! job killed after its last checkpoint may have left ([`Start::After`]); the files of the
//! ranks a resume on fewer ranks no longer has are cut at the same step ([`cut_departed`]).
//!
//! One writer per file: a writer holds the file's lock (`flock`) from [`TraceFile::lock`] to
//! its end, so that two runs, or two loaders, given the same path are refused instead of
//! overwriting each other's lines.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, BufWriter, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fs4::fs_std::FileExt;
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
    /// A run resumed after global step `n`: the file keeps its trace lines up to step `n`
    /// (the lines after it, a torn last line and any line that is not a trace line are cut
    /// out, [`Cut`]) and the new lines follow.
    After(u64),
}

/// What reopening a trace after a step removed from it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cut {
    /// Whole trace lines past the step (a run killed after its checkpoint wrote them).
    pub past: u64,
    /// Whether the last line was torn (no newline: a kill mid-write); it is removed.
    pub torn: bool,
    /// The 1-based numbers of the whole lines that are not trace lines, removed; the trace
    /// lines around them are kept.
    pub unreadable: Vec<u64>,
}

/// How long a refused lock is tried again: a lock held by this very process's previous
/// writer of the file may linger for the moment a child process being started holds the
/// descriptor (a fork keeps it until its exec closes it).
const LOCK_WAIT: Duration = Duration::from_secs(1);

/// A trace file opened and locked for this writer, its content untouched until
/// [`TraceFile::start`]. The lock goes with the file: released when it is dropped, or by
/// the kernel when the process ends however it ends.
#[derive(Debug)]
pub struct TraceFile {
    path: PathBuf,
    file: File,
}

impl TraceFile {
    /// Opens (creating) `path` and takes its lock, or fails with
    /// [`LoaderError::TraceBusy`] while another writer holds it.
    pub fn lock(path: &Path) -> Result<TraceFile> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| LoaderError::io("open", path, e))?;
        let since = Instant::now();
        while !file
            .try_lock_exclusive()
            .map_err(|e| LoaderError::io("lock", path, e))?
        {
            if since.elapsed() > LOCK_WAIT {
                return Err(LoaderError::TraceBusy {
                    path: path.to_path_buf(),
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(TraceFile {
            path: path.to_path_buf(),
            file,
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Starts writing as `start` says: the writer, and what a resume cut from the file.
    pub fn start(mut self, start: Start) -> Result<(TraceWriter, Cut)> {
        let (end, cut) = match start {
            Start::Fresh => (0, Cut::default()),
            Start::After(step) => cut_after(&self.file, &self.path, step)?,
        };
        self.file
            .set_len(end)
            .and_then(|()| self.file.seek(SeekFrom::Start(end)))
            .map_err(|e| LoaderError::io("truncate", &self.path, e))?;
        let writer = TraceWriter {
            path: self.path,
            out: BufWriter::new(self.file),
        };
        Ok((writer, cut))
    }
}

/// Writes a record trace, buffered: lines reach the file at [`TraceWriter::flush`] (or when
/// the buffer fills, and when the writer is dropped).
#[derive(Debug)]
pub struct TraceWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl TraceWriter {
    /// Opens the trace file `path` as `start` says ([`TraceFile::lock`], then
    /// [`TraceFile::start`]).
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
    /// // A second writer of the same file is refused while the first holds it.
    /// assert!(TraceWriter::open(&path, Start::Fresh).is_err());
    /// drop(w);
    /// // Resumed after step 2: step 3 is written again.
    /// let mut w = TraceWriter::open(&path, Start::After(2))?;
    /// w.write(&line(3))?;
    /// w.flush()?;
    /// assert_eq!(read(&path)?, vec![line(1), line(2), line(3)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open(path: &Path, start: Start) -> Result<TraceWriter> {
        Ok(TraceFile::lock(path)?.start(start)?.0)
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

    /// Writes the buffered lines and gives the file back, still locked (to start it again).
    pub fn into_file(self) -> Result<TraceFile> {
        let path = self.path;
        let file = self
            .out
            .into_inner()
            .map_err(|e| LoaderError::io("write", &path, e.into_error()))?;
        Ok(TraceFile { path, file })
    }
}

/// Moves the trace lines of `file` up to global step `step` to its front, in place, and
/// returns where they end and what was left out: the lines past `step`, a torn last line and
/// every line that is not a trace line.
fn cut_after(file: &File, path: &Path, step: u64) -> Result<(u64, Cut)> {
    let mut reader = BufReader::new(file);
    reader
        .seek(SeekFrom::Start(0))
        .map_err(|e| LoaderError::io("read", path, e))?;
    let (mut read, mut keep, mut number) = (0u64, 0u64, 0u64);
    let (mut cut, mut line) = (Cut::default(), Vec::new());
    loop {
        line.clear();
        let n = reader
            .read_until(b'\n', &mut line)
            .map_err(|e| LoaderError::io("read", path, e))? as u64;
        if n == 0 {
            return Ok((keep, cut));
        }
        number += 1;
        if line.last() != Some(&b'\n') {
            cut.torn = true;
        } else {
            match serde_json::from_slice::<TraceLine>(&line) {
                Err(_) => cut.unreadable.push(number),
                Ok(l) if l.step > step => cut.past += 1,
                Ok(_) => {
                    if keep != read {
                        file.write_all_at(&line, keep)
                            .map_err(|e| LoaderError::io("write", path, e))?;
                    }
                    keep += n;
                }
            }
        }
        read += n;
    }
}

/// Cuts, after global step `step`, the trace files at `path` of the ranks a job of `before`
/// ranks had and one of `now` ranks does not write ([`rank_file`]): a resume on fewer ranks
/// (or on one, or from one) leaves no lines past its checkpoint in any file of the old
/// layout. Each file is locked while it is cut; a missing one is skipped. Returns the cut of
/// each file cut.
pub fn cut_departed(
    path: &Path,
    before: usize,
    now: usize,
    step: u64,
) -> Result<Vec<(PathBuf, Cut)>> {
    let kept: Vec<PathBuf> = (0..now).map(|r| rank_file(path, r, now)).collect();
    let mut cuts = Vec::new();
    for file in (0..before).map(|r| rank_file(path, r, before)) {
        if kept.contains(&file) || !file.exists() {
            continue;
        }
        let (writer, cut) = TraceFile::lock(&file)?.start(Start::After(step))?;
        drop(writer);
        cuts.push((file, cut));
    }
    Ok(cuts)
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

    /// Writes `steps` as trace lines, and `junk` after the `at`-th of them.
    fn write_lines(path: &Path, steps: &[u64], junk: Option<(usize, &str)>) {
        let mut text = String::new();
        for (i, &step) in steps.iter().enumerate() {
            if junk.is_some_and(|(at, _)| at == i) {
                text.push_str(junk.unwrap().1);
            }
            text.push_str(&serde_json::to_string(&line(step)).unwrap());
            text.push('\n');
        }
        std::fs::write(path, text).unwrap();
    }

    fn steps(path: &Path) -> Vec<u64> {
        read(path).unwrap().iter().map(|l| l.step).collect()
    }

    #[test]
    fn a_resume_keeps_the_trace_lines_around_one_that_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        write_lines(&path, &[1, 2, 3, 4, 5, 6], Some((2, "{\"epoch\":0,\"st\n")));
        let (w, cut) = TraceFile::lock(&path)
            .unwrap()
            .start(Start::After(4))
            .unwrap();
        drop(w);
        assert_eq!(steps(&path), [1, 2, 3, 4]);
        assert_eq!(
            cut,
            Cut {
                past: 2,
                torn: false,
                unreadable: vec![3],
            }
        );
    }

    #[test]
    fn a_second_writer_is_refused_naming_the_file_until_the_first_is_done() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let mut first = TraceWriter::open(&path, Start::Fresh).unwrap();
        first.write(&line(1)).unwrap();
        let e = TraceWriter::open(&path, Start::After(0)).unwrap_err();
        assert!(matches!(e, LoaderError::TraceBusy { .. }), "{e}");
        assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        // A writer given back its file keeps the lock.
        let file = first.into_file().unwrap();
        assert!(TraceFile::lock(&path).is_err());
        drop(file);
        assert_eq!(steps(&path), [1], "the refused writer cut nothing");
        drop(TraceWriter::open(&path, Start::Fresh).unwrap());
    }

    #[test]
    fn the_files_of_the_ranks_a_resume_lacks_are_cut_and_no_others() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let file = |r: usize, n: usize| rank_file(&path, r, n);
        for r in 0..3 {
            write_lines(&file(r, 3), &[1, 2, 3, 4], None);
        }
        // 3 ranks to 2: the third rank's file alone (the others are their new ranks').
        let cut = cut_departed(&path, 3, 2, 2).unwrap();
        assert_eq!(cut.len(), 1);
        assert_eq!(cut[0].0, file(2, 3));
        assert_eq!(steps(&file(2, 3)), [1, 2]);
        assert_eq!(steps(&file(0, 3)), [1, 2, 3, 4]);
        // 2 ranks to 1 (whose file is `path` itself): both; and from 1 to 2, `path`.
        assert_eq!(cut_departed(&path, 2, 1, 1).unwrap().len(), 2);
        assert_eq!((steps(&file(0, 2)), steps(&file(1, 2))), (vec![1], vec![1]));
        write_lines(&path, &[1, 2, 3], None);
        assert_eq!(cut_departed(&path, 1, 2, 2).unwrap().len(), 1);
        assert_eq!(steps(&path), [1, 2]);
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
