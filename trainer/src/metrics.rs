//! Per-step and per-epoch metrics as JSON lines.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{Result, TrainError};

/// One line per optimizer step (`"type": "step"`).
#[derive(Clone, Debug, Serialize)]
pub struct StepRecord {
    /// Always `"step"`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Global step (1-based: steps completed).
    pub step: u64,
    /// Epoch of the step.
    pub epoch: u64,
    /// Training loss of rank 0's replicas (mean).
    pub loss: f64,
    /// Learning rate used.
    pub lr: f64,
    /// Global images per second of this step.
    pub images_per_s: f64,
    /// Mean time rank 0's replicas waited on the loader.
    pub data_wait_s: f64,
    /// Mean time rank 0's replicas were busy: the step but for waiting on the loader and on
    /// reduced gradients (on a GPU, that includes waiting for the device to compute the loss).
    pub compute_s: f64,
    /// Time rank 0 spent in allreduce calls.
    pub allreduce_s: f64,
    /// Bytes rank 0 sent to the other ranks in the step's collectives, as messages (counted
    /// where they leave the rank; shared memory and MPI_Allreduce move theirs unseen).
    pub bytes_sent: u64,
}

/// One line per buffer size class whose algorithm `--allreduce auto` settled on by trying
/// the candidates (`"type": "allreduce_tuned"`).
#[derive(Clone, Debug, Serialize)]
pub struct TunedRecord {
    /// Always `"allreduce_tuned"`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Global step after which the ranks agreed.
    pub step: u64,
    /// Bytes of the class's first buffer (f32).
    pub bytes: usize,
    /// The algorithm kept.
    pub algorithm: String,
    /// Each candidate's time per call, mean over the ranks of their medians, seconds.
    pub timings: Vec<(String, f64)>,
    /// Seconds the trial calls took beyond what the kept algorithm would have.
    pub cost_s: f64,
}

/// One line per epoch (`"type": "epoch"`).
#[derive(Clone, Debug, Serialize)]
pub struct EpochRecord {
    /// Always `"epoch"`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Epoch index (0-based).
    pub epoch: u64,
    /// Mean training loss over all ranks and steps of the epoch (null when this run trained
    /// no step of it: resumed at its end).
    pub train_loss: Option<f64>,
    /// Mean validation loss (null without a val split).
    pub val_loss: Option<f64>,
    /// Validation top-1 accuracy in [0, 1].
    pub val_top1: Option<f64>,
    /// Validation top-5 accuracy in [0, 1].
    pub val_top5: Option<f64>,
    /// Validation images evaluated over all ranks (every val record once).
    pub val_images: Option<u64>,
    /// Wall time of the training part of the epoch.
    pub epoch_s: f64,
    /// Global training images per second.
    pub images_per_s: f64,
    /// Fraction of step time replicas were blocked on the loader (mean over ranks).
    pub data_wait_frac: f64,
    /// Fraction of step time spent in allreduce calls (mean over ranks).
    pub allreduce_frac: f64,
    /// Optimizer steps in this epoch (this run).
    pub steps: u64,
    /// Bad records met in training this epoch, all ranks (replaced or skipped, see
    /// `--on-bad-record`).
    pub bad_records: u64,
    /// Val records left out of the evaluation as bad, all ranks (null without evaluation).
    pub val_bad_records: Option<u64>,
}

/// Appends JSON lines to a file, flushing after each.
pub struct MetricsWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl MetricsWriter {
    /// Creates (or, with `append`, extends) the metrics file.
    pub fn open(path: &Path, append: bool) -> Result<MetricsWriter> {
        let file = OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(path)
            .map_err(|e| TrainError::io(path, e))?;
        Ok(MetricsWriter {
            path: path.to_path_buf(),
            out: BufWriter::new(file),
        })
    }

    /// Writes one record as a line.
    pub fn write<T: Serialize>(&mut self, record: &T) -> Result<()> {
        let line =
            serde_json::to_string(record).map_err(|e| TrainError::io(&self.path, e.into()))?;
        writeln!(self.out, "{line}")
            .and_then(|_| self.out.flush())
            .map_err(|e| TrainError::io(&self.path, e))
    }
}
