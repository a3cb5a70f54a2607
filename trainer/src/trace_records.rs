//! `trace_records`: the records of every batch a rank trains on, one JSON line per replica
//! and step, in ddl-loader's record-trace format ([`ddl_loader::trace_records`]).
//!
//! A line's `step` is the global step that trained the batch, numbered as the `step` of the
//! metrics' step records and of the checkpoint names (1-based: the batches of a run's first
//! step are step 1). A replica's feed may take batches ahead of its step (the GPU uploader
//! stages the next one while the current one trains, and the loader's read-ahead outlives a
//! run stopped by `max_steps` or a signal), so a batch is written only once the step that
//! trains it is done: [`RecordTrace::watch`] notes each batch as a replica takes it, and
//! [`RecordTrace::trained`] writes those of the steps completed. The lines of a step are in
//! replica order, the steps in order: two runs of the same seed write the same files.
//!
//! A resumed run keeps each file's trace lines up to the checkpoint's step, its own file and,
//! on rank 0, those of the ranks of the checkpoint's layout that this run does not have
//! ([`ddl_loader::trace_records::cut_departed`]); a line that is not a trace line is dropped
//! with a warning naming the file and the line.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use ddl_loader::pipeline::Batch;
use ddl_loader::trace_records::{
    cut_departed, rank_file, Cut, Start, TraceFile, TraceLine, TraceWriter,
};
use ddl_loader::LoaderError;

use crate::config::Setting;
use crate::console::eprint_line;
use crate::error::{Result, TrainError};
use crate::table::BatchIter;

/// Batches the replicas took but whose step is not yet done.
type Taken = Arc<Mutex<Vec<TraceLine>>>;

/// One rank's record trace: its file and the batches taken but not yet trained.
pub(crate) struct RecordTrace {
    writer: TraceWriter,
    rank: usize,
    /// Those of the epoch being trained; a new epoch gets a new list, so a batch a replica's
    /// feed takes from an ended epoch's read-ahead is never written.
    taken: Taken,
}

impl RecordTrace {
    /// Opens the trace of rank `rank` of `ranks` at `path` ([`rank_file`]): emptied for a
    /// new run; for a run resumed after global step `n` from a checkpoint of `before` ranks
    /// (`resumed`), kept up to step `n` and appended to, and on rank 0 the files of the ranks
    /// of that layout that this run does not have cut at step `n`.
    pub(crate) fn open(
        path: &Path,
        rank: usize,
        ranks: usize,
        resumed: Option<(u64, usize)>,
    ) -> Result<RecordTrace> {
        let config = |e: LoaderError| TrainError::config(Setting::TraceRecords, e.to_string());
        if let (Some((after, before)), 0) = (resumed, rank) {
            for (file, cut) in cut_departed(path, before, ranks, after).map_err(config)? {
                warn_unreadable(&file, &cut);
            }
        }
        let file = rank_file(path, rank, ranks);
        let start = resumed.map_or(Start::Fresh, |(after, _)| Start::After(after));
        let (writer, cut) = TraceFile::lock(&file)
            .and_then(|f| f.start(start))
            .map_err(config)?;
        warn_unreadable(&file, &cut);
        Ok(RecordTrace {
            writer,
            rank,
            taken: Taken::default(),
        })
    }

    /// The replicas' `sources` of an epoch whose first step follows global step `base`, each
    /// noting the batches its replica takes. Starts the epoch: the batches taken from an
    /// earlier epoch's sources and never trained (its read-ahead) are forgotten.
    pub(crate) fn watch(&mut self, sources: Vec<BatchIter>, base: u64) -> Vec<BatchIter> {
        self.taken = Taken::default();
        let rank = self.rank;
        sources
            .into_iter()
            .map(|batches| {
                let taken = Arc::clone(&self.taken);
                Box::new(batches.inspect(move |b| {
                    if let Ok(b) = b {
                        lock(&taken).push(line_of(b, rank, base));
                    }
                })) as BatchIter
            })
            .collect()
    }

    /// Writes the batches of the global steps up to `global`, all of them done.
    pub(crate) fn trained(&mut self, global: u64) -> Result<()> {
        let mut done: Vec<TraceLine> = {
            let mut taken = lock(&self.taken);
            let (done, ahead) = taken.drain(..).partition(|l| l.step <= global);
            *taken = ahead;
            done
        };
        done.sort_by_key(|l| (l.step, l.replica));
        for line in &done {
            self.writer.write(line).map_err(write_error)?;
        }
        Ok(())
    }

    /// Writes the lines so far to the file (at a checkpoint, the end of an epoch, a stop): a
    /// run killed later has them on disk up to its last checkpoint.
    pub(crate) fn flush(&mut self) -> Result<()> {
        self.writer.flush().map_err(write_error)
    }
}

/// Says which lines of the trace `file` a resume dropped as not trace lines.
fn warn_unreadable(file: &Path, cut: &Cut) {
    if !cut.unreadable.is_empty() {
        eprint_line(&format!(
            "warning: record trace {}: line(s) {:?} are not trace lines and were removed; \
             the trace lines around them are kept",
            file.display(),
            cut.unreadable
        ));
    }
}

/// The line of batch `b` of rank `rank`, in an epoch whose first step follows global step
/// `base`.
fn line_of(b: &Batch, rank: usize, base: u64) -> TraceLine {
    TraceLine {
        epoch: b.epoch,
        // Wrapping: `base` may stand below 0 when the sampler's steps start past the run's
        // (the rest of an epoch resumed on another layout, `train::elastic`).
        step: base.wrapping_add(b.step as u64 + 1),
        rank,
        replica: b.replica,
        ids: b.indices.clone(),
    }
}

fn lock(taken: &Taken) -> std::sync::MutexGuard<'_, Vec<TraceLine>> {
    taken.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A write error, naming the file.
fn write_error(e: LoaderError) -> TrainError {
    match e {
        LoaderError::Io { path, source, .. } => TrainError::io(path, source),
        other => other.into(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ddl_loader::dataset::{Dataset, OpenOptions, Residency};
    use ddl_loader::pipeline::{Augment, Output, Pipeline, PipelineConfig};
    use ddl_loader::sampler::{Sampler, SamplerConfig, Tail};
    use ddl_loader::trace_records::read;
    use ddl_testkit::{write_manifest, write_shards, Record};

    use super::*;

    /// A pipeline of 2 replicas x 2 images over 12 records: 3 steps an epoch.
    fn pipeline(dir: &Path, epoch: u64, start: usize) -> Pipeline {
        if !dir.join("manifest.json").exists() {
            std::fs::create_dir_all(dir).unwrap();
            let records: Vec<Record> = (0..12)
                .map(|i| Record::jpeg(ddl_testkit::jpeg(40, 36, i), (i % 2) as u32))
                .collect();
            let info = write_shards(dir, "train", &[records], 1);
            write_manifest(dir, 2, vec![("train", info)], 1);
        }
        let residency = Residency { node: 0, nodes: 1 };
        let data =
            Arc::new(Dataset::open(dir, "train", residency, &OpenOptions::default()).unwrap());
        let sampler = Sampler::try_new(
            data.len(),
            data.len(),
            SamplerConfig {
                seed: 3,
                ranks_in_node: 1,
                rank_in_node: 0,
                replicas: 2,
                batch_per_replica: 2,
                tail: Tail::Drop,
                shuffle: true,
            },
        )
        .unwrap();
        let cfg = PipelineConfig {
            image_size: 16,
            output: Output::F32Nchw,
            augment: Augment::Train,
            workers: 1,
            prefetch: 2,
            seed: 3,
            ..PipelineConfig::default()
        };
        Pipeline::start(data, sampler, cfg, epoch, start).unwrap()
    }

    fn sources(p: &Pipeline) -> Vec<BatchIter> {
        (0..2)
            .map(|r| Box::new(p.replica(r)) as BatchIter)
            .collect()
    }

    /// Batches taken ahead of their step are written once it is done, in step and replica
    /// order, and never when their epoch ends first (a run stopped, or the read-ahead of an
    /// epoch's sources).
    #[test]
    fn only_the_batches_of_completed_steps_are_written() {
        let tmp = ddl_testkit::scratch("trace-records");
        let (data, path) = (tmp.path().join("data"), tmp.path().join("t.jsonl"));
        let mut trace = RecordTrace::open(&path, 1, 2, None).unwrap();
        let file = tmp.path().join("t.jsonl.1");

        // Epoch 0 from its step 1 (a run resumed after global step 1).
        let p = pipeline(&data, 0, 1);
        let mut feeds = trace.watch(sources(&p), 0);
        // Replica 1 takes both its batches before replica 0 takes any.
        let r1: Vec<Batch> = feeds[1].by_ref().take(2).map(|b| b.unwrap()).collect();
        let r0 = feeds[0].next().unwrap().unwrap();
        trace.trained(2).unwrap();
        trace.flush().unwrap();
        let lines = read(&file).unwrap();
        let at: Vec<(u64, usize)> = lines.iter().map(|l| (l.step, l.replica)).collect();
        assert_eq!(at, [(2, 0), (2, 1)], "step 3 is not done");
        assert_eq!(lines[0].ids, r0.indices);
        assert_eq!(lines[1].ids, r1[0].indices);
        assert!(lines.iter().all(|l| l.epoch == 0 && l.rank == 1));

        // The next epoch starts: replica 1's batch of step 3 was never trained.
        let p = pipeline(&data, 1, 0);
        let mut feeds = trace.watch(sources(&p), 3);
        let first: Vec<Batch> = feeds
            .iter_mut()
            .map(|f| f.next().unwrap().unwrap())
            .collect();
        trace.trained(7).unwrap();
        trace.flush().unwrap();
        let lines = read(&file).unwrap();
        let at: Vec<(u64, u64, usize)> =
            lines.iter().map(|l| (l.epoch, l.step, l.replica)).collect();
        assert_eq!(at, [(0, 2, 0), (0, 2, 1), (1, 4, 0), (1, 4, 1)]);
        assert_eq!(lines[3].ids, first[1].indices);
    }
}
