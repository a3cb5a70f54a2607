//! A replica's batch ([`Batch`]), its reusable storage and the bad records it met.

use std::path::PathBuf;

use crossbeam_channel::Sender;

use crate::transform::Output;

/// The pixels of a batch.
#[derive(Clone, Debug, PartialEq)]
pub enum Images {
    /// float32, `[batch, 3, size, size]`, normalized.
    F32(Vec<f32>),
    /// uint8, `[batch, size, size, 3]`.
    U8(Vec<u8>),
}

impl Images {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Images::F32(v) => v.len(),
            Images::U8(v) => v.len(),
        }
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(super) fn truncate(&mut self, n: usize) {
        match self {
            Images::F32(v) => v.truncate(n),
            Images::U8(v) => v.truncate(n),
        }
    }

    pub(super) fn resize(&mut self, n: usize) {
        match self {
            Images::F32(v) => v.resize(n, 0.0),
            Images::U8(v) => v.resize(n, 0),
        }
    }
}

/// The reusable storage of one batch.
#[derive(Debug)]
pub(super) struct Buffers {
    pub(super) images: Images,
    pub(super) labels: Vec<i64>,
    pub(super) indices: Vec<u64>,
    /// Node-local record per slot, from the sampler.
    pub(super) records: Vec<usize>,
    /// Per-slot outcome (see `SLOT_*`).
    pub(super) status: Vec<u8>,
}

impl Buffers {
    /// Zeroed storage for `batch` images of `image_len` values each.
    pub(super) fn new(output: Output, batch: usize, image_len: usize) -> Buffers {
        Buffers {
            images: match output {
                Output::F32Nchw => Images::F32(vec![0.0; batch * image_len]),
                Output::U8Nhwc => Images::U8(vec![0; batch * image_len]),
            },
            labels: vec![0; batch],
            indices: vec![0; batch],
            records: Vec::with_capacity(batch),
            status: vec![SLOT_OK; batch],
        }
    }
}

pub(super) const SLOT_OK: u8 = 0;
pub(super) const SLOT_REPLACED: u8 = 1;
pub(super) const SLOT_DROPPED: u8 = 2;
pub(super) const SLOT_FAILED: u8 = 3;

/// One replica's batch for one step. Dropping it returns its buffers to the pipeline.
#[derive(Debug)]
pub struct Batch {
    /// The images, `len()` of them.
    pub images: Images,
    /// Class label of each image.
    pub labels: Vec<i64>,
    /// Global id (position in the split, see [`Dataset::global_id`]) of each image's record.
    ///
    /// [`Dataset::global_id`]: crate::dataset::Dataset::global_id
    pub indices: Vec<u64>,
    /// Epoch of the batch.
    pub epoch: u64,
    /// Step within the epoch.
    pub step: usize,
    /// Replica the batch is for.
    pub replica: usize,
    /// Bad records met while filling this batch (skipped or replaced).
    pub skipped: usize,
    pub(super) size: usize,
    pub(super) records: Vec<usize>,
    pub(super) status: Vec<u8>,
    pub(super) recycle: Option<Sender<Buffers>>,
}

impl Batch {
    /// Number of images.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True when the batch has no images (every record was bad under [`OnBadRecord::Skip`]).
    ///
    /// [`OnBadRecord::Skip`]: super::config::OnBadRecord::Skip
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// How many of the first `n` slots the sampler filled were left out as bad records
    /// ([`OnBadRecord::Skip`]); the batch holds the other slots of those `n` first, in slot
    /// order. For a batch whose tail is padding, `n` = the real slots.
    ///
    /// [`OnBadRecord::Skip`]: super::config::OnBadRecord::Skip
    pub fn dropped_among_first(&self, n: usize) -> usize {
        self.status
            .iter()
            .take(n)
            .filter(|&&s| s == SLOT_DROPPED)
            .count()
    }

    /// `[n, 3, size, size]` for float32 NCHW, `[n, size, size, 3]` for uint8 NHWC.
    pub fn shape(&self) -> [usize; 4] {
        let (n, s) = (self.len(), self.size);
        match self.images {
            Images::F32(_) => [n, 3, s, s],
            Images::U8(_) => [n, s, s, 3],
        }
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        if let Some(tx) = self.recycle.take() {
            let _ = tx.send(Buffers {
                images: std::mem::replace(&mut self.images, Images::U8(Vec::new())),
                labels: std::mem::take(&mut self.labels),
                indices: std::mem::take(&mut self.indices),
                records: std::mem::take(&mut self.records),
                status: std::mem::take(&mut self.status),
            });
        }
    }
}

/// A bad record met by the pipeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadRecord {
    /// The shard file.
    pub file: PathBuf,
    /// The record's index within the shard.
    pub record: usize,
    /// Why it is bad (checksum mismatch, decoder message).
    pub reason: String,
}
