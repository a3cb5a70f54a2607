//! Per-step and per-epoch metrics as JSON lines.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{Result, TrainError};
use crate::table::StepStats;

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
    /// Wall time of the step on rank 0 (under `comm_order` priority, from sending the step
    /// to the replicas to every rank's backward being done: the previous step's allreduce
    /// that overlaps this step's forward included, this step's that overlaps the next one's
    /// left out).
    pub step_s: f64,
    /// Mean time rank 0's replicas waited on the loader.
    pub data_wait_s: f64,
    /// Mean time rank 0's replicas' forward pass waited for the previous step's buckets to be
    /// reduced (`comm_order` priority; 0 under `fifo`, whose steps end after every bucket).
    pub forward_wait_s: f64,
    /// Mean time rank 0's replicas were busy: the step but for waiting on the loader and on
    /// reduced gradients, in the forward pass or after backward (on a GPU, that includes
    /// waiting for the device to compute the loss).
    pub compute_s: f64,
    /// Time rank 0 spent in allreduce calls.
    pub allreduce_s: f64,
    /// Bytes rank 0 sent to the other ranks in the step's collectives, as messages (counted
    /// where they leave the rank; shared memory and MPI_Allreduce move theirs unseen).
    pub bytes_sent: u64,
}

/// One line per buffer size class whose algorithm `allreduce` auto settled on by trying
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

impl StepRecord {
    /// The record of global step `step` of `epoch` run with learning rate `lr` by rank 0 of
    /// `ranks`, which measured `stats` and sent `bytes_sent`.
    pub fn new(
        (step, epoch, lr): (u64, u64, f64),
        stats: &StepStats,
        ranks: usize,
        bytes_sent: u64,
    ) -> StepRecord {
        let wall = stats.wall.as_secs_f64();
        StepRecord {
            kind: "step",
            step,
            epoch,
            loss: stats.loss,
            lr,
            images_per_s: (stats.images * ranks) as f64 / wall.max(1e-9),
            step_s: wall,
            data_wait_s: stats.data_wait.as_secs_f64(),
            forward_wait_s: stats.forward_wait.as_secs_f64(),
            compute_s: stats.compute.as_secs_f64(),
            allreduce_s: stats.allreduce.as_secs_f64(),
            bytes_sent,
        }
    }
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
    /// `on_bad_record`).
    pub bad_records: u64,
    /// Val records left out of the evaluation as bad, all ranks (null without evaluation).
    pub val_bad_records: Option<u64>,
    /// Side of the epoch's train images (`image_size_schedule`, else `image_size`).
    pub image_size: u32,
    /// The record exchange into this epoch (`exchange`; absent without one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exchange: Option<ExchangeRecord>,
}

/// What the record exchange into an epoch moved, over all nodes (see ddl-exchange).
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct ExchangeRecord {
    /// Records the nodes received.
    pub records: u64,
    /// Bytes of those records.
    pub bytes: u64,
    /// Seconds the slowest node's transfer took (during the epoch before, on its own thread).
    pub transfer_s: f64,
    /// Seconds the epoch's start waited for the transfers, the longest wait of any rank.
    pub wait_s: f64,
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
