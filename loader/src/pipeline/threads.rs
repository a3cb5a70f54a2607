//! The pipeline's threads: the dispatcher that hands out one job per `(step, replica)`, the
//! workers that fill a batch's slots (decode, transform, substitutes for bad records), and the
//! sequencer that delivers each replica's batches in step order.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crossbeam_channel::{select, Receiver, Sender};
use rayon::iter::Either;
use rayon::prelude::*;

use super::batch::{
    BadRecord, Batch, Buffers, Images, SLOT_DROPPED, SLOT_FAILED, SLOT_OK, SLOT_REPLACED,
};
use super::config::{OnBadRecord, MAX_BAD_RECORDS_KEPT, MAX_SUBSTITUTES};
use super::shared::{Done, Shared};
use crate::error::{LoaderError, Result};
use crate::transform::{Slot, Transformer};

/// Dispatcher thread: one job per `(step, replica)`, each with a free buffer.
#[allow(clippy::too_many_arguments)]
pub(super) fn dispatch(
    shared: Arc<Shared>,
    pool: Arc<rayon::ThreadPool>,
    start_step: usize,
    steps: usize,
    free_rx: Receiver<Buffers>,
    free_tx: Sender<Buffers>,
    done_tx: Sender<Done>,
    stop_rx: Receiver<()>,
) {
    let replicas = shared.sampler.config().replicas;
    let mut seq = 0usize;
    for step in start_step..steps {
        for replica in 0..replicas {
            let bufs = select! {
                recv(free_rx) -> b => match b { Ok(b) => b, Err(_) => return },
                recv(stop_rx) -> _ => return,
            };
            let (shared, done_tx, free_tx) =
                (Arc::clone(&shared), done_tx.clone(), free_tx.clone());
            let this = seq;
            pool.spawn(move || {
                let result = fill(&shared, step, replica, bufs, free_tx);
                let _ = done_tx.send((this, replica, result));
            });
            seq += 1;
        }
    }
}

/// Sequencer thread: forwards finished batches to their replica queues in job order.
pub(super) fn sequence(
    shared: Arc<Shared>,
    done_rx: Receiver<Done>,
    senders: Vec<Sender<Result<Batch>>>,
    stop_rx: Receiver<()>,
) {
    let mut pending: BTreeMap<usize, (usize, Result<Batch>)> = BTreeMap::new();
    let mut next = 0usize;
    loop {
        let msg = select! {
            recv(done_rx) -> m => m,
            recv(stop_rx) -> _ => return,
        };
        let Ok((seq, replica, result)) = msg else {
            return; // dispatcher finished and every job reported
        };
        pending.insert(seq, (replica, result));
        while let Some((replica, result)) = pending.remove(&next) {
            next += 1;
            if result.is_ok() {
                shared.counters.batches.fetch_add(1, Ordering::Relaxed);
            }
            select! {
                send(senders[replica], result) -> r => { let _ = r; }
                recv(stop_rx) -> _ => return,
            }
        }
    }
}

/// Outcome of filling one slot.
enum SlotResult {
    Ok { label: u32, id: u64 },
    Replaced { label: u32, id: u64 },
    Dropped,
    Failed(String),
}

/// Fills one batch buffer in parallel on the current pool and wraps it as a [`Batch`].
fn fill(
    shared: &Shared,
    step: usize,
    replica: usize,
    mut bufs: Buffers,
    recycle: Sender<Buffers>,
) -> Result<Batch> {
    let n = shared.image_len;
    shared
        .sampler
        .batch_into(shared.epoch, step, replica, &mut bufs.records);
    // The sampler's batch: shorter than the configured one at the end of a `Tail::Short` or
    // `Tail::Even` epoch (empty on the streams `Tail::Even` has no records left for).
    let batch = bufs.records.len();
    bufs.images.resize(batch * n);
    bufs.labels.resize(batch, 0);
    bufs.indices.resize(batch, 0);
    bufs.status.resize(batch, SLOT_OK);
    let failure: Mutex<Option<String>> = Mutex::new(None);
    {
        let records = &bufs.records;
        let meta = bufs
            .labels
            .par_iter_mut()
            .zip(bufs.indices.par_iter_mut())
            .zip(bufs.status.par_iter_mut());
        let work = |j: usize,
                    slot: Slot<'_>,
                    ((label, index), status): ((&mut i64, &mut u64), &mut u8)| {
            match fill_slot(shared, step, replica, j, records[j], slot) {
                SlotResult::Ok { label: l, id } => {
                    (*label, *index, *status) = (l as i64, id, SLOT_OK);
                }
                SlotResult::Replaced { label: l, id } => {
                    (*label, *index, *status) = (l as i64, id, SLOT_REPLACED);
                }
                SlotResult::Dropped => *status = SLOT_DROPPED,
                SlotResult::Failed(e) => {
                    *status = SLOT_FAILED;
                    let mut f = failure.lock().unwrap_or_else(|p| p.into_inner());
                    f.get_or_insert(e);
                }
            }
        };
        let slots = match &mut bufs.images {
            Images::F32(v) => Either::Left(v.par_chunks_mut(n).map(Slot::F32)),
            Images::U8(v) => Either::Right(v.par_chunks_mut(n).map(Slot::U8)),
        };
        slots
            .zip(meta)
            .enumerate()
            .for_each(|(j, (slot, m))| work(j, slot, m));
    }
    let epoch = shared.epoch;
    let stopped = shared.stop.load(Ordering::Relaxed);
    let failed = failure.into_inner().unwrap_or_else(|p| p.into_inner());
    if stopped || failed.is_some() {
        let _ = recycle.send(bufs);
        return Err(match failed {
            Some(reason) => LoaderError::Batch {
                epoch,
                step,
                replica,
                reason,
            },
            None => LoaderError::PipelineStopped {
                replica,
                delivered: 0,
                expected: 0,
            },
        });
    }
    let skipped = bufs.status.iter().filter(|&&s| s != SLOT_OK).count();
    if bufs.status.contains(&SLOT_DROPPED) {
        compact(&mut bufs, n);
    }
    shared
        .counters
        .images
        .fetch_add(bufs.labels.len() as u64, Ordering::Relaxed);
    Ok(Batch {
        images: std::mem::replace(&mut bufs.images, Images::U8(Vec::new())),
        labels: std::mem::take(&mut bufs.labels),
        indices: std::mem::take(&mut bufs.indices),
        epoch,
        step,
        replica,
        skipped,
        size: shared.cfg.image_size as usize,
        records: std::mem::take(&mut bufs.records),
        status: std::mem::take(&mut bufs.status),
        recycle: Some(recycle),
    })
}

/// Moves the kept slots of a batch down over the dropped ones and shortens it.
fn compact(bufs: &mut Buffers, n: usize) {
    let mut kept = 0;
    for j in 0..bufs.status.len() {
        if bufs.status[j] == SLOT_DROPPED {
            continue;
        }
        if kept != j {
            bufs.labels[kept] = bufs.labels[j];
            bufs.indices[kept] = bufs.indices[j];
            match &mut bufs.images {
                Images::F32(v) => v.copy_within(j * n..(j + 1) * n, kept * n),
                Images::U8(v) => v.copy_within(j * n..(j + 1) * n, kept * n),
            }
        }
        kept += 1;
    }
    bufs.labels.truncate(kept);
    bufs.indices.truncate(kept);
    bufs.images.truncate(kept * n);
}

/// Decodes node-local record `record` into `slot`, applying the bad-record rule.
fn fill_slot(
    shared: &Shared,
    step: usize,
    replica: usize,
    j: usize,
    record: usize,
    mut slot: Slot<'_>,
) -> SlotResult {
    if shared.stop.load(Ordering::Relaxed) {
        return SlotResult::Dropped;
    }
    let _span = ddl_trace::span_args(
        "decode",
        "loader",
        &[
            ("step", step as i64),
            ("replica", replica as i64),
            ("slot", j as i64),
        ],
    );
    let worker = rayon::current_thread_index().unwrap_or(0) % shared.workers.len();
    let mut t = shared.workers[worker]
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let started = Instant::now();
    let mut candidate = record;
    let mut attempt = 0usize;
    let result = loop {
        match decode_one(shared, &mut t, candidate, &mut slot) {
            Ok(label) => {
                let id = shared.dataset.global_id(candidate);
                break if attempt == 0 {
                    SlotResult::Ok { label, id }
                } else {
                    SlotResult::Replaced { label, id }
                };
            }
            Err(e) => {
                if attempt == 0 {
                    shared.counters.skipped.fetch_add(1, Ordering::Relaxed);
                }
                report_bad(shared, &e);
                match shared.cfg.on_bad_record {
                    OnBadRecord::Skip => break SlotResult::Dropped,
                    OnBadRecord::Fail => break SlotResult::Failed(e.to_string()),
                    OnBadRecord::Replace => {
                        attempt += 1;
                        if attempt > MAX_SUBSTITUTES || shared.stop.load(Ordering::Relaxed) {
                            break SlotResult::Failed(format!(
                                "node-local record {record} and its substitutes are all bad; last: {e}"
                            ));
                        }
                        candidate =
                            shared
                                .sampler
                                .successor(shared.epoch, step, replica, j, attempt);
                    }
                }
            }
        }
    };
    shared
        .counters
        .busy_ns
        .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
    result
}

/// Reads, checks and transforms one record; errors name the shard file and record.
fn decode_one(shared: &Shared, t: &mut Transformer, i: usize, slot: &mut Slot<'_>) -> Result<u32> {
    let (reader, r) = shared.dataset.locate(i);
    let rec = reader.record(r)?;
    let id = shared.dataset.global_id(i);
    let slot = match slot {
        Slot::F32(s) => Slot::F32(s),
        Slot::U8(s) => Slot::U8(s),
    };
    let applied = t
        .apply(rec.bytes, shared.epoch, id, slot)
        .map_err(|e| LoaderError::Decode {
            path: reader.path().to_path_buf(),
            record: r,
            reason: e.0,
        })?;
    shared
        .counters
        .decoded_pixels
        .fetch_add(applied.decoded_pixels, Ordering::Relaxed);
    Ok(rec.label)
}

/// Logs a bad record and keeps it in the statistics.
fn report_bad(shared: &Shared, e: &LoaderError) {
    tracing::warn!(error = %e, "bad record");
    let (file, record) = match e {
        LoaderError::RecordChecksum { path, record, .. }
        | LoaderError::Decode { path, record, .. } => (path.clone(), *record),
        _ => (PathBuf::new(), 0),
    };
    let mut bad = shared
        .counters
        .bad
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if bad.len() < MAX_BAD_RECORDS_KEPT {
        bad.push(BadRecord {
            file,
            record,
            reason: e.to_string(),
        });
    }
}
