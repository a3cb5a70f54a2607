//! Where a replica's training batches come from: the loader's batches used in place (CPU),
//! staged through pinned memory and copied to the GPU one batch ahead by an uploader thread
//! (CUDA), or one batch made on the device and used at every step (`synthetic_data`).

use std::thread::JoinHandle;

use crossbeam_channel::{bounded, unbounded, Receiver, Sender};
use ddl_loader::pipeline::{Batch, Images};
use tch::{Device, Kind, Tensor};

use crate::device::{DeviceCtx, Event};
use crate::error::{Result, TrainError};

use super::comm::BatchIter;
use super::tensor_io::{host_view, BatchTensors, Normalizer};

/// Batches staged on the GPU ahead of the replica: one in use, one being copied.
const UPLOAD_SLOTS: usize = 2;

/// A batch ready for a training step: images (normalized f32 NCHW) and labels on the
/// replica's device.
pub(crate) struct StepBatch {
    /// The images.
    pub(crate) images: Tensor,
    /// The labels.
    pub(crate) labels: Tensor,
    /// Records the loader skipped as unreadable in this batch.
    pub(crate) skipped: usize,
    /// The loader batch the CPU tensors view; dropped after them (declaration order).
    _batch: Option<BatchTensors>,
}

impl StepBatch {
    /// Number of images.
    pub(crate) fn len(&self) -> usize {
        self.labels.size().first().copied().unwrap_or(0) as usize
    }
}

/// A replica's source of training batches.
pub(crate) enum Feed {
    /// Nothing attached yet.
    None,
    /// Loader batches used where they are (on the CPU the image tensor views the batch).
    Direct(BatchIter),
    /// Loader batches copied to the GPU by an uploader thread.
    Upload(Uploader),
    /// One batch on the device, every step.
    Synthetic { images: Tensor, labels: Tensor },
}

impl Feed {
    /// The feed of `batches` for a replica on `ctx`'s device.
    pub(crate) fn of(batches: BatchIter, ctx: &DeviceCtx) -> Result<Feed> {
        Ok(match ctx.device() {
            Device::Cuda(_) => Feed::Upload(Uploader::start(batches, ctx.device())?),
            _ => Feed::Direct(batches),
        })
    }

    /// `batch` random images of `size` x `size` pixels (standard normal, as normalized images
    /// are) and labels below `classes` on `device`.
    pub(crate) fn synthetic(
        device: Device,
        batch: usize,
        size: u32,
        classes: i64,
        norm: &Normalizer,
    ) -> Result<Feed> {
        let (b, s) = (batch as i64, i64::from(size));
        let images = Tensor::f_randn([b, 3, s, s], (Kind::Float, device))?;
        let labels = Tensor::f_randint(classes, [b], (Kind::Int64, device))?;
        Ok(Feed::Synthetic {
            images: norm.layout(images)?,
            labels,
        })
    }

    /// The next batch (on the compute stream of `ctx`), or `None` at the end of the epoch.
    pub(crate) fn next(&mut self, ctx: &DeviceCtx, norm: &Normalizer) -> Option<Result<StepBatch>> {
        match self {
            Feed::None => Some(Err(TrainError::Replica {
                replica: 0,
                message: "step requested before any data source was attached".into(),
            })),
            Feed::Direct(it) => Some(it.next()?.map_err(TrainError::from).and_then(|b| {
                let t = BatchTensors::new(b, ctx.device(), norm)?;
                Ok(StepBatch {
                    images: t.images().shallow_clone(),
                    labels: t.labels().shallow_clone(),
                    skipped: t.batch().skipped,
                    _batch: Some(t),
                })
            })),
            Feed::Upload(u) => u.next(ctx, norm),
            Feed::Synthetic { images, labels } => Some(Ok(StepBatch {
                images: images.shallow_clone(),
                labels: labels.shallow_clone(),
                skipped: 0,
                _batch: None,
            })),
        }
    }
}

/// A batch copied to the device by the uploader: uint8 NHWC pixels and labels in slot `slot`.
struct Staged {
    slot: usize,
    pixels: Tensor,
    labels: Tensor,
    skipped: usize,
    /// After the copies, on the uploader's side stream.
    copied: Event,
}

/// The uploader thread of one GPU replica and the channels to it.
pub(crate) struct Uploader {
    staged: Receiver<Result<Staged>>,
    /// Slots the replica is done with, and the event after its last use of each.
    free: Sender<(usize, Event)>,
    _thread: JoinHandle<()>,
}

impl Uploader {
    /// Starts the thread that copies `batches` to `device`.
    fn start(batches: BatchIter, device: Device) -> Result<Uploader> {
        let (staged_tx, staged) = bounded(1);
        let (free, free_rx) = unbounded();
        for slot in 0..UPLOAD_SLOTS {
            let _ = free.send((slot, Event::done()));
        }
        let thread = std::thread::Builder::new()
            .name("uploader".into())
            .spawn(move || upload(batches, device, free_rx, staged_tx))
            .map_err(|e| TrainError::Replica {
                replica: 0,
                message: format!("cannot spawn the uploader thread: {e}"),
            })?;
        Ok(Uploader {
            staged,
            free,
            _thread: thread,
        })
    }

    /// The next staged batch, normalized on the compute stream; its slot goes back to the
    /// uploader with the event after that last use.
    fn next(&mut self, ctx: &DeviceCtx, norm: &Normalizer) -> Option<Result<StepBatch>> {
        let staged = self.staged.recv().ok()?;
        Some(staged.and_then(|s| {
            ctx.wait(&s.copied)?;
            let images = norm.u8_nhwc(&s.pixels)?;
            // The loss reads the labels later: keep a copy, the slot may be refilled before.
            let labels = s.labels.f_detach_copy()?;
            let _ = self.free.send((s.slot, ctx.record()?));
            Ok(StepBatch {
                images,
                labels,
                skipped: s.skipped,
                _batch: None,
            })
        }))
    }
}

/// Pinned host memory and device memory of one staged batch.
struct Slot {
    host: Tensor,
    host_labels: Tensor,
    pixels: Tensor,
    labels: Tensor,
    /// After the last copy out of `host`.
    copied: Event,
}

/// The uploader thread: each loader batch goes into a free slot's pinned memory and from
/// there to the device on the side stream, once the replica is done with the slot.
fn upload(
    batches: BatchIter,
    device: Device,
    free: Receiver<(usize, Event)>,
    out: Sender<Result<Staged>>,
) {
    let ctx = match DeviceCtx::new(device) {
        Ok(c) => c,
        Err(e) => {
            let _ = out.send(Err(e));
            return;
        }
    };
    let mut slots: Vec<Option<Slot>> = (0..UPLOAD_SLOTS).map(|_| None).collect();
    for batch in batches {
        let Ok((i, released)) = free.recv() else {
            return;
        };
        let staged = batch
            .map_err(TrainError::from)
            .and_then(|b| stage(&ctx, &mut slots[i], i, b, &released));
        let failed = staged.is_err();
        if out.send(staged).is_err() || failed {
            return;
        }
    }
}

/// Copies `batch` into slot `i` (allocated or grown on first need) and on to the device.
fn stage(
    ctx: &DeviceCtx,
    slot: &mut Option<Slot>,
    i: usize,
    batch: Batch,
    released: &Event,
) -> Result<Staged> {
    let Images::U8(pixels) = &batch.images else {
        return Err(TrainError::Replica {
            replica: batch.replica,
            message: "a GPU replica needs uint8 batches".into(),
        });
    };
    let (n, labels) = (pixels.len(), batch.labels.len());
    if slot
        .as_ref()
        .is_none_or(|s| s.host.numel() < n || s.labels.numel() < labels)
    {
        *slot = Some(Slot {
            host: ctx.host_buffer(n, Kind::Uint8)?,
            host_labels: ctx.host_buffer(labels, Kind::Int64)?,
            pixels: Tensor::f_zeros([n as i64], (Kind::Uint8, ctx.device()))?,
            labels: Tensor::f_zeros([labels as i64], (Kind::Int64, ctx.device()))?,
            copied: Event::done(),
        });
    }
    let s = slot.as_mut().expect("allocated above");
    // The pinned memory is free once its last copy is done.
    s.copied.synchronize()?;
    let shape = batch.shape().map(|d| d as i64);
    let mut host = s.host.f_narrow(0, 0, n as i64)?;
    let mut host_labels = s.host_labels.f_narrow(0, 0, labels as i64)?;
    // SAFETY: the views do not outlive `batch`.
    host.f_copy_(&unsafe { host_view(&batch.images, batch.shape()) }.f_view([-1])?)?;
    host_labels.f_copy_(&Tensor::f_from_slice(&batch.labels)?)?;
    // The device memory is free once the replica's last use of it is done.
    ctx.wait_side(released)?;
    let mut dev_pixels = s.pixels.f_narrow(0, 0, n as i64)?;
    let mut dev_labels = s.labels.f_narrow(0, 0, labels as i64)?;
    ctx.copy_side(&mut dev_pixels, &host)?;
    s.copied = ctx.copy_side(&mut dev_labels, &host_labels)?;
    Ok(Staged {
        slot: i,
        pixels: dev_pixels.f_view(shape)?,
        labels: dev_labels,
        skipped: batch.skipped,
        copied: ctx.record_side()?,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ddl_loader::dataset::{Dataset, OpenOptions, Residency};
    use ddl_loader::pipeline::{
        Augment, Output, Pipeline, PipelineConfig, IMAGENET_MEAN, IMAGENET_STD,
    };
    use ddl_loader::sampler::{Sampler, SamplerConfig, Tail};
    use ddl_testkit::{write_manifest, write_shards, Record};

    use super::*;

    /// The uploader's protocol (slots taken and given back, copies, the end of the epoch) runs
    /// on the CPU too, where its copies are plain ones: its batches must be the direct path's.
    #[test]
    fn uploaded_batches_equal_the_direct_ones_to_the_end_of_the_epoch() {
        let tmp = ddl_testkit::scratch("feed");
        let dir = tmp.path();
        let records: Vec<Record> = (0..26)
            .map(|i| Record::jpeg(ddl_testkit::jpeg(40 + i, 36, i), (i % 3) as u32))
            .collect();
        let info = write_shards(dir, "train", &[records], 1);
        write_manifest(dir, 3, vec![("train", info)], 1);
        let residency = Residency { node: 0, nodes: 1 };
        let data =
            Arc::new(Dataset::open(dir, "train", residency, &OpenOptions::default()).unwrap());
        let sampler = Sampler::try_new(
            data.len(),
            data.len(),
            SamplerConfig {
                seed: 1,
                ranks_in_node: 1,
                rank_in_node: 0,
                replicas: 1,
                batch_per_replica: 4,
                tail: Tail::Drop,
                shuffle: true,
            },
        )
        .unwrap();
        let cfg = PipelineConfig {
            image_size: 32,
            output: Output::U8Nhwc,
            augment: Augment::Train,
            workers: 1,
            prefetch: 2,
            seed: 1,
            ..PipelineConfig::default()
        };
        let start = || Pipeline::start(data.clone(), sampler.clone(), cfg.clone(), 0, 0).unwrap();
        let (p1, p2) = (start(), start());
        let ctx = DeviceCtx::new(Device::Cpu).unwrap();
        let norm = Normalizer::new(Device::Cpu, true, (IMAGENET_MEAN, IMAGENET_STD)).unwrap();
        let mut direct = Feed::Direct(Box::new(p1.replica(0)));
        let mut uploaded =
            Feed::Upload(Uploader::start(Box::new(p2.replica(0)), Device::Cpu).unwrap());
        let mut steps = 0;
        loop {
            match (direct.next(&ctx, &norm), uploaded.next(&ctx, &norm)) {
                (None, None) => break,
                (Some(a), Some(b)) => {
                    let (a, b) = (a.unwrap(), b.unwrap());
                    assert!(a.images.equal(&b.images), "step {steps}: images differ");
                    assert!(a.labels.equal(&b.labels), "step {steps}: labels differ");
                    assert_eq!(a.images.stride(), b.images.stride());
                    steps += 1;
                }
                (a, b) => panic!(
                    "step {steps}: one feed ended ({}, {})",
                    a.is_none(),
                    b.is_none()
                ),
            }
        }
        assert_eq!(steps, 26 / 4);
    }
}
