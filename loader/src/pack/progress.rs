//! How the packer reports progress to its caller (the CLI draws a bar or prints lines).

/// Receives progress while packing; every method does nothing unless implemented.
pub trait PackProgress: Sync {
    /// Packing starts: `total` inputs, of which `done` are in shards kept from a previous run.
    fn start(&self, _total: u64, _done: u64) {}
    /// `n` more inputs were processed.
    fn advance(&self, _n: u64) {}
    /// Packing finished.
    fn finish(&self) {}
}

/// A [`PackProgress`] that ignores everything.
pub struct NoProgress;

impl PackProgress for NoProgress {}
