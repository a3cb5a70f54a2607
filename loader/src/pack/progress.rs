//! How the packer reports progress to its caller (the CLI draws a bar or prints lines).

/// Receives progress while packing; every method does nothing unless implemented.
pub trait PackProgress: Sync {
    /// Packing starts: `total` inputs, of which `done` are in shards kept from a previous run.
    fn start(&self, _total: u64, _done: u64) {}
    /// `n` more inputs were processed.
    fn advance(&self, _n: u64) {}
    /// Packing finished.
    fn finish(&self) {}
    /// `input` (`bytes` long, `what` it is in words) is being read to list its images: a pass
    /// over all of it before packing starts, since it cannot be indexed in place (a gzip stream,
    /// TFRecord files whose labels are inside the records).
    fn listing(&self, _input: &std::path::Path, _bytes: u64, _what: &str) {}
}

/// A [`PackProgress`] that ignores everything.
pub struct NoProgress;

impl PackProgress for NoProgress {}
