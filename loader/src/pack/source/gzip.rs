//! Reading gzip-compressed tars (`winter21_whole.tar.gz`, Hugging Face's
//! `train_images_0.tar.gz`) as they were downloaded: a gzip stream cannot be read from the
//! middle, so such a tar is listed in one pass (`tars.rs`: decompressing it all, every gzip
//! member's checksum verified at its end), its members are addressed by their offset in the
//! decompressed stream, and the packer reads them in that order
//! ([`super::read_in_place_order`]), each archive through one [`Cursor`] that only moves
//! forward.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;
use std::sync::{Arc, Mutex};

use flate2::read::MultiGzDecoder;

/// The two bytes every gzip member starts with.
const MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Read-ahead of the compressed file.
const BUFFER: usize = 1 << 20;

/// Whether `head` (a file's first bytes) starts a gzip stream.
pub(super) fn is_gzip(head: &[u8]) -> bool {
    head.starts_with(&MAGIC)
}

/// Opens `path` as a stream of its decompressed bytes (every gzip member in turn, as pigz and
/// bgzip write several).
pub(super) fn open(path: &Path) -> std::io::Result<MultiGzDecoder<BufReader<File>>> {
    let file = File::open(path)?;
    Ok(MultiGzDecoder::new(BufReader::with_capacity(BUFFER, file)))
}

/// A position in one archive's decompressed stream.
struct Cursor {
    stream: MultiGzDecoder<BufReader<File>>,
    pos: u64,
}

/// The readers of the gzip-compressed archives of a pack: one forward-only cursor per archive,
/// reopened at the start only when asked for bytes behind it (which the packer's in-place order
/// avoids). A stream that fails (damaged data) fails every later read at once, rather than
/// being decompressed again from the start for each.
#[derive(Default)]
pub(crate) struct Readers(Mutex<HashMap<u32, Arc<Mutex<Reader>>>>);

/// One archive's state.
#[derive(Default)]
struct Reader {
    cursor: Option<Cursor>,
    /// The decompressed offset at which the stream failed, and why.
    failed: Option<(u64, String)>,
}

impl std::fmt::Debug for Readers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Readers")
    }
}

impl Readers {
    /// Reads `at.len()` members of archive `archive` (at `path`), member `i` at decompressed
    /// offset `at[i].0` with `at[i].1` bytes, in the order given.
    pub(super) fn read(
        &self,
        archive: u32,
        path: &Path,
        at: &[(u64, u64)],
    ) -> Vec<std::io::Result<Vec<u8>>> {
        let reader = self
            .0
            .lock()
            .expect("gzip readers")
            .entry(archive)
            .or_default()
            .clone();
        let mut reader = reader.lock().expect("a gzip reader");
        at.iter()
            .map(|&(offset, size)| reader.read(path, offset, size))
            .collect()
    }
}

impl Reader {
    /// The `size` bytes at decompressed `offset` of the archive at `path`.
    fn read(&mut self, path: &Path, offset: u64, size: u64) -> std::io::Result<Vec<u8>> {
        if let Some((at, why)) = &self.failed {
            if offset + size > *at {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "the gzip stream failed at the member at decompressed byte {at}: {why}"
                    ),
                ));
            }
        }
        let mut cursor = match self.cursor.take() {
            Some(c) if c.pos <= offset => c,
            _ => Cursor {
                stream: open(path)?,
                pos: 0,
            },
        };
        match cursor.read(offset, size) {
            Ok(bytes) => {
                self.cursor = Some(cursor);
                Ok(bytes)
            }
            Err(e) => {
                self.failed = Some((offset, e.to_string()));
                Err(e)
            }
        }
    }
}

impl Cursor {
    /// Moves to `offset` (at or after the cursor) and reads `size` bytes.
    fn read(&mut self, offset: u64, size: u64) -> std::io::Result<Vec<u8>> {
        let skip = offset - self.pos;
        let skipped = std::io::copy(&mut (&mut self.stream).take(skip), &mut std::io::sink())?;
        if skipped < skip {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let mut buf = vec![0u8; size as usize];
        self.stream.read_exact(&mut buf)?;
        self.pos = offset + size;
        Ok(buf)
    }
}
