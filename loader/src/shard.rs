//! Reading and writing shard files (format version 1, see `format` and `loader/FORMAT.md`).
//!
//! [`ShardReader`] memory-maps a shard, checks its header, index checksum and the bounds of
//! every index row at open, and verifies each record's checksum when it is read.
//! [`ShardWriter`] writes `NAME.ddl.tmp`, fsyncs it, renames it to `NAME.ddl` and fsyncs the
//! directory, so a crash never leaves a half-written file under the final name.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use memmap2::{Advice, Mmap};

use crate::error::{LoaderError, Result};
use crate::fault::Registration;
pub use crate::format::IndexRow;
use crate::format::{
    align_up, min_data_offset, Header, HEADER_LEN, INDEX_OFFSET, INDEX_ROW_LEN, KIND_JPEG,
    RECORD_ALIGN,
};

/// One record as stored in a shard: the encoded image bytes (borrowed from the mapping) and
/// the metadata of its index row.
#[derive(Clone, Copy, Debug)]
pub struct Record<'a> {
    /// The encoded image (a JPEG in format version 1).
    pub bytes: &'a [u8],
    /// Class label.
    pub label: u32,
    /// Image height in pixels.
    pub height: u16,
    /// Image width in pixels.
    pub width: u16,
}

/// What identifies a file's contents without reading them: where it lives, its size and when
/// it was last written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileStamp {
    dev: u64,
    ino: u64,
    len: u64,
    modified: Option<SystemTime>,
}

impl FileStamp {
    fn of(meta: &std::fs::Metadata) -> FileStamp {
        FileStamp {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            modified: meta.modified().ok(),
        }
    }
}

/// A memory-mapped, validated shard. `Send + Sync`: records can be read from many threads.
pub struct ShardReader {
    path: PathBuf,
    map: Mmap,
    header: Header,
    /// The file as it was when mapped.
    stamp: FileStamp,
    /// Names this mapping in a SIGBUS report ([`crate::fault`]).
    _registration: Registration,
}

impl std::fmt::Debug for ShardReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardReader")
            .field("path", &self.path)
            .field("header", &self.header)
            .finish()
    }
}

impl ShardReader {
    /// Opens and maps `path`, checking magic, version, header checksum, offsets against the file
    /// length, the index checksum and the bounds, alignment and order of every index row.
    /// Record checksums are checked when records are read (or by [`ShardReader::verify`]).
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| LoaderError::io("open", path, e))?;
        let meta = file
            .metadata()
            .map_err(|e| LoaderError::io("stat", path, e))?;
        let len = meta.len();
        if len < HEADER_LEN as u64 {
            let mut head = Vec::new();
            (&file)
                .read_to_end(&mut head)
                .map_err(|e| LoaderError::io("read", path, e))?;
            if head.len() >= 8 && head[..8] != crate::format::MAGIC {
                return Err(LoaderError::BadMagic {
                    path: path.to_path_buf(),
                    found: String::from_utf8_lossy(&head[..8]).into_owned(),
                });
            }
            return Err(LoaderError::Truncated {
                path: path.to_path_buf(),
                len,
                needed: HEADER_LEN as u64,
                what: "the 64-byte header",
            });
        }
        // SAFETY: the mapping is read-only; shards are immutable once renamed into place, and
        // every access below is bounds-checked against the mapping's length.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| LoaderError::io("mmap", path, e))?;
        let header = Header::decode(&map[..HEADER_LEN], path, map.len() as u64)?;
        let index_start = INDEX_OFFSET as usize;
        let index_end = index_start + header.record_count as usize * INDEX_ROW_LEN;
        let index = &map[index_start..index_end];
        let actual = crc32c::crc32c(index);
        if actual != header.index_crc32c {
            return Err(LoaderError::IndexChecksum {
                path: path.to_path_buf(),
                records: header.record_count,
                expected: header.index_crc32c,
                actual,
            });
        }
        let mut prev_end = 0u64;
        for (i, raw) in index.chunks_exact(INDEX_ROW_LEN).enumerate() {
            prev_end = IndexRow::decode(raw).check(raw, path, i, prev_end, header.data_len)?;
        }
        if prev_end != header.data_len {
            return Err(LoaderError::CorruptHeader {
                path: path.to_path_buf(),
                reason: format!(
                    "data_len is {} but the last record ends at {prev_end}",
                    header.data_len
                ),
            });
        }
        Ok(ShardReader {
            path: path.to_path_buf(),
            _registration: crate::fault::register(map.as_ptr(), map.len(), path),
            map,
            header,
            stamp: FileStamp::of(&meta),
        })
    }

    /// Checks that the file at the shard's path is still the one mapped: same file, size and
    /// modification time. Shards must stay read-only while mapped (a truncated one kills the
    /// reader with SIGBUS); the error names the file and what changed.
    pub fn check_unchanged(&self) -> Result<()> {
        let changed = |reason: String| {
            Err(LoaderError::ShardChanged {
                path: self.path.clone(),
                reason,
            })
        };
        let now = match std::fs::metadata(&self.path) {
            Ok(m) => FileStamp::of(&m),
            Err(e) => return changed(format!("it can no longer be read ({e})")),
        };
        let was = self.stamp;
        if (now.dev, now.ino) != (was.dev, was.ino) {
            changed("it was replaced by another file".into())
        } else if now.len != was.len {
            changed(format!(
                "its size went from {} to {} bytes",
                was.len, now.len
            ))
        } else if now.modified != was.modified {
            changed("it was written to".into())
        } else {
            Ok(())
        }
    }

    /// The shard's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The validated file header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.header.record_count as usize
    }

    /// True when the shard holds no records.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Index row `i`. Panics if `i >= len()` (a caller bug); rows were validated at open.
    pub fn row(&self, i: usize) -> IndexRow {
        assert!(
            i < self.len(),
            "{}: record {i} out of range ({} records)",
            self.path.display(),
            self.len()
        );
        let at = INDEX_OFFSET as usize + i * INDEX_ROW_LEN;
        IndexRow::decode(&self.map[at..at + INDEX_ROW_LEN])
    }

    /// Checks that every record's label names one of `classes` classes: a manifest edited by
    /// hand (a class removed) would otherwise hand the model labels it has no output for.
    pub fn check_labels(&self, classes: usize) -> Result<()> {
        match (0..self.len()).find(|&i| self.row(i).label as usize >= classes) {
            None => Ok(()),
            Some(record) => Err(LoaderError::LabelOutOfRange {
                path: self.path.clone(),
                record,
                label: self.row(record).label,
                classes,
            }),
        }
    }

    /// Record `i`, after checking its bytes against the crc32c in its index row.
    /// Panics if `i >= len()`.
    pub fn record(&self, i: usize) -> Result<Record<'_>> {
        let row = self.row(i);
        let start = (self.header.data_offset + row.offset) as usize;
        let bytes = &self.map[start..start + row.length as usize];
        let actual = crc32c::crc32c(bytes);
        if actual != row.crc32c {
            return Err(LoaderError::RecordChecksum {
                path: self.path.clone(),
                record: i,
                expected: row.crc32c,
                actual,
            });
        }
        Ok(Record {
            bytes,
            label: row.label,
            height: row.height,
            width: row.width,
        })
    }

    /// Size of the shard file in bytes.
    pub fn file_bytes(&self) -> u64 {
        self.map.len() as u64
    }

    /// crc32c of the whole file (what the manifest records as the shard's checksum).
    pub fn file_crc32c(&self) -> u32 {
        crc32c::crc32c(&self.map)
    }

    /// Pre-faults every page of the mapping: `madvise(MADV_WILLNEED)` to start read-ahead,
    /// then touches one byte per page so later reads never wait on storage.
    pub fn populate(&self) -> Result<()> {
        self.map
            .advise(Advice::WillNeed)
            .map_err(|e| LoaderError::io("madvise(MADV_WILLNEED)", &self.path, e))?;
        let page = page_size();
        let mut sum = 0u8;
        for at in (0..self.map.len()).step_by(page) {
            // SAFETY: `at` is within the mapping; a volatile read keeps the touch from being
            // optimised away.
            sum = sum.wrapping_add(unsafe { std::ptr::read_volatile(self.map.as_ptr().add(at)) });
        }
        std::hint::black_box(sum);
        Ok(())
    }

    /// Locks the whole mapping in RAM (`mlock`). When the locked-memory limit is too low the
    /// error says so and shows the current `RLIMIT_MEMLOCK`.
    pub fn lock(&self) -> Result<()> {
        match self.map.lock() {
            Ok(()) => Ok(()),
            Err(e) => {
                let errno = e.raw_os_error();
                if errno == Some(libc::ENOMEM)
                    || errno == Some(libc::EPERM)
                    || errno == Some(libc::EAGAIN)
                {
                    let (soft, hard) = memlock_limits();
                    Err(LoaderError::MemLock {
                        path: self.path.clone(),
                        bytes: self.file_bytes(),
                        soft,
                        hard,
                        source: e,
                    })
                } else {
                    Err(LoaderError::io("mlock", &self.path, e))
                }
            }
        }
    }

    /// Bytes of the mapping currently resident in RAM (`mincore`).
    pub fn resident_bytes(&self) -> Result<u64> {
        resident_in(&self.map, &self.path)
    }

    /// Checks every record's checksum; returns one error per damaged record (empty = clean).
    pub fn verify(&self) -> Vec<LoaderError> {
        (0..self.len())
            .filter_map(|i| self.record(i).err())
            .collect()
    }
}

/// Bytes of the file at `path` in the page cache, measured without reading any of it: the
/// file is mapped and `mincore` asked, and no page is touched. (Opening a [`ShardReader`]
/// reads the header and index, and the kernel's read-around brings in more.)
pub fn cached_bytes(path: &Path) -> Result<u64> {
    let file = File::open(path).map_err(|e| LoaderError::io("open", path, e))?;
    let len = file
        .metadata()
        .map_err(|e| LoaderError::io("stat", path, e))?
        .len();
    if len == 0 {
        return Ok(0);
    }
    // SAFETY: read-only mapping that is never read from, only passed to mincore.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| LoaderError::io("mmap", path, e))?;
    resident_in(&map, path)
}

/// Bytes of `map` resident in RAM (`mincore`; the last page counts only up to the end of the
/// mapping); `path` names the file in errors.
fn resident_in(map: &Mmap, path: &Path) -> Result<u64> {
    let len = map.len();
    if len == 0 {
        return Ok(0);
    }
    let page = page_size();
    let pages = len.div_ceil(page);
    let mut vec = vec![0u8; pages];
    // SAFETY: the mapping starts page-aligned and spans `len` bytes; `vec` has one byte per
    // page as mincore requires.
    let rc = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, len, vec.as_mut_ptr()) };
    if rc != 0 {
        return Err(LoaderError::io(
            "mincore",
            path,
            std::io::Error::last_os_error(),
        ));
    }
    let resident = vec.iter().filter(|&&b| b & 1 == 1).count() as u64 * page as u64;
    // Only the last page can extend past the end of the file.
    let tail = (pages * page - len) as u64;
    Ok(if vec[pages - 1] & 1 == 1 {
        resident - tail
    } else {
        resident
    })
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

fn memlock_limits() -> (String, String) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit to fill in.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) };
    if rc != 0 {
        let unknown = "unknown".to_string();
        return (unknown.clone(), unknown);
    }
    let show = |v: libc::rlim_t| {
        if v == libc::RLIM_INFINITY {
            "unlimited".to_string()
        } else {
            format!("{v} bytes")
        }
    };
    (show(lim.rlim_cur), show(lim.rlim_max))
}

/// fsyncs directory `dir`, making renames and creations inside it durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| LoaderError::io("fsync directory", dir, e))
}

/// The temporary name a file is written under before being renamed into place: `NAME.tmp`.
pub fn tmp_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(".tmp");
    PathBuf::from(s)
}

/// What [`ShardWriter::finish`] wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardSummary {
    /// Number of records.
    pub records: u64,
    /// Size of the file in bytes.
    pub bytes: u64,
    /// crc32c of the whole file.
    pub crc32c: u32,
}

enum DataSink {
    /// Record count unknown: data is kept in memory until `finish` (small shards, tests).
    Memory(Vec<u8>),
    /// Record count bounded in advance: data streams to the file at `data_offset`.
    File {
        data_offset: u64,
        capacity: u64,
        out: BufWriter<File>,
    },
}

/// Writes one shard. Records are appended with [`ShardWriter::push`]; [`ShardWriter::finish`]
/// writes header and index, fsyncs, and renames `NAME.ddl.tmp` to `NAME.ddl`. Dropping an
/// unfinished writer removes the temporary file.
pub struct ShardWriter {
    path: PathBuf,
    tmp: PathBuf,
    file: Option<File>,
    sink: DataSink,
    rows: Vec<IndexRow>,
    data_len: u64,
    data_crc: u32,
}

impl ShardWriter {
    /// Starts a shard at `path` (written as `path.tmp` until finished) whose record count is
    /// not known in advance; record data is buffered in memory until [`ShardWriter::finish`].
    /// Use [`ShardWriter::with_capacity`] for large shards.
    pub fn create(path: &Path) -> Result<Self> {
        let tmp = tmp_path(path);
        let file = File::create(&tmp).map_err(|e| LoaderError::io("create", &tmp, e))?;
        Ok(ShardWriter {
            path: path.to_path_buf(),
            tmp,
            file: Some(file),
            sink: DataSink::Memory(Vec::new()),
            rows: Vec::new(),
            data_len: 0,
            data_crc: 0,
        })
    }

    /// Starts a shard at `path` that will hold at most `max_records` records. Record data is
    /// streamed straight to disk (bounded memory). If fewer records are pushed, the unused
    /// index space stays as zero padding before the data region.
    pub fn with_capacity(path: &Path, max_records: u64) -> Result<Self> {
        let tmp = tmp_path(path);
        let file = File::create(&tmp).map_err(|e| LoaderError::io("create", &tmp, e))?;
        let data_offset = min_data_offset(max_records);
        let handle = file
            .try_clone()
            .map_err(|e| LoaderError::io("dup", &tmp, e))?;
        let mut out = BufWriter::with_capacity(1 << 20, handle);
        std::io::Seek::seek(&mut out, std::io::SeekFrom::Start(data_offset))
            .map_err(|e| LoaderError::io("seek", &tmp, e))?;
        Ok(ShardWriter {
            path: path.to_path_buf(),
            tmp,
            file: Some(file),
            sink: DataSink::File {
                data_offset,
                capacity: max_records,
                out,
            },
            rows: Vec::with_capacity(max_records.min(1 << 20) as usize),
            data_len: 0,
            data_crc: 0,
        })
    }

    /// The final path the shard will have.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of records pushed so far.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// True when no record has been pushed yet.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Appends a JPEG record with its label and pixel dimensions.
    pub fn push(&mut self, bytes: &[u8], label: u32, height: u16, width: u16) -> Result<()> {
        let record = self.rows.len();
        let invalid = |reason: String| LoaderError::InvalidRecord {
            path: self.tmp.clone(),
            record,
            reason,
        };
        if bytes.is_empty() {
            return Err(invalid("empty record".into()));
        }
        let length = u32::try_from(bytes.len())
            .map_err(|_| invalid(format!("{} bytes exceeds the 4 GiB limit", bytes.len())))?;
        if let DataSink::File { capacity, .. } = &self.sink {
            if record as u64 >= *capacity {
                return Err(invalid(format!(
                    "more records than the {capacity} this writer was created for"
                )));
            }
        }
        let offset = align_up(self.data_len, RECORD_ALIGN);
        let pad = [0u8; RECORD_ALIGN as usize];
        let pad = &pad[..(offset - self.data_len) as usize];
        match &mut self.sink {
            DataSink::Memory(buf) => {
                buf.extend_from_slice(pad);
                buf.extend_from_slice(bytes);
            }
            DataSink::File { out, .. } => {
                out.write_all(pad)
                    .and_then(|()| out.write_all(bytes))
                    .map_err(|e| LoaderError::io("write", &self.tmp, e))?;
            }
        }
        self.data_crc = crc32c::crc32c_append(self.data_crc, pad);
        let crc = crc32c::crc32c(bytes);
        self.data_crc = crc32c::crc32c_combine(self.data_crc, crc, bytes.len());
        self.data_len = offset + u64::from(length);
        self.rows.push(IndexRow {
            offset,
            length,
            label,
            height,
            width,
            crc32c: crc,
            kind: KIND_JPEG,
        });
        Ok(())
    }

    /// Writes header and index, fsyncs the file, renames it into place and fsyncs the
    /// directory. Returns the record count, file size and whole-file crc32c.
    pub fn finish(mut self) -> Result<ShardSummary> {
        let file = self.file.take().expect("file present until finish");
        let data_offset = match std::mem::replace(&mut self.sink, DataSink::Memory(Vec::new())) {
            DataSink::Memory(buf) => {
                let data_offset = min_data_offset(self.rows.len() as u64);
                file.write_all_at(&buf, data_offset)
                    .map_err(|e| LoaderError::io("write", &self.tmp, e))?;
                data_offset
            }
            DataSink::File {
                data_offset, out, ..
            } => {
                out.into_inner()
                    .map_err(|e| LoaderError::io("write", &self.tmp, e.into_error()))?;
                data_offset
            }
        };
        let mut index = Vec::with_capacity(self.rows.len() * INDEX_ROW_LEN);
        for r in &self.rows {
            index.extend_from_slice(&r.encode());
        }
        let header = Header {
            record_count: self.rows.len() as u64,
            index_offset: INDEX_OFFSET,
            data_offset,
            data_len: self.data_len,
            index_crc32c: crc32c::crc32c(&index),
        };
        let mut prefix = vec![0u8; data_offset as usize];
        prefix[..HEADER_LEN].copy_from_slice(&header.encode());
        prefix[HEADER_LEN..HEADER_LEN + index.len()].copy_from_slice(&index);
        let bytes = data_offset + self.data_len;
        let io = |op| {
            let tmp = self.tmp.clone();
            move |e| LoaderError::io(op, tmp, e)
        };
        file.write_all_at(&prefix, 0).map_err(io("write"))?;
        // The file is exactly data_offset + data_len long (a zero-record file still has its
        // padded prefix).
        file.set_len(bytes).map_err(io("truncate"))?;
        file.sync_all().map_err(io("fsync"))?;
        drop(file);
        std::fs::rename(&self.tmp, &self.path).map_err(io("rename"))?;
        sync_dir(self.path.parent().unwrap_or(Path::new(".")))?;
        let crc = crc32c::crc32c_combine(
            crc32c::crc32c(&prefix),
            self.data_crc,
            self.data_len as usize,
        );
        Ok(ShardSummary {
            records: self.rows.len() as u64,
            bytes,
            crc32c: crc,
        })
    }
}

impl Drop for ShardWriter {
    fn drop(&mut self) {
        if self.file.is_some() {
            // Unfinished: remove the temporary file (best effort; a leftover .tmp is ignored by
            // readers and overwritten by the next writer).
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{DATA_ALIGN, INDEX_OFFSET};

    fn payloads() -> Vec<Vec<u8>> {
        (0..5u8)
            .map(|i| (0..(37 + i as usize * 50)).map(|j| (j as u8) ^ i).collect())
            .collect()
    }

    fn write(path: &Path, capacity: Option<u64>) -> ShardSummary {
        let mut w = match capacity {
            Some(c) => ShardWriter::with_capacity(path, c).unwrap(),
            None => ShardWriter::create(path).unwrap(),
        };
        for (i, p) in payloads().iter().enumerate() {
            w.push(p, i as u32 * 3, 10 + i as u16, 20 + i as u16)
                .unwrap();
        }
        assert!(tmp_path(path).exists());
        w.finish().unwrap()
    }

    #[test]
    fn roundtrip_both_writers() {
        let tmp = ddl_testkit::scratch("shard-roundtrip");
        let d = tmp.path();
        for cap in [None, Some(5), Some(200)] {
            let p = d.join("s.ddl");
            let sum = write(&p, cap);
            assert!(!tmp_path(&p).exists());
            let r = ShardReader::open(&p).unwrap();
            assert_eq!(r.len(), 5);
            assert_eq!(sum.records, 5);
            assert_eq!(sum.bytes, r.file_bytes());
            assert_eq!(sum.bytes, std::fs::metadata(&p).unwrap().len());
            assert_eq!(sum.crc32c, r.file_crc32c());
            assert_eq!(r.header().data_offset % DATA_ALIGN, 0);
            for (i, want) in payloads().iter().enumerate() {
                let rec = r.record(i).unwrap();
                assert_eq!(rec.bytes, &want[..]);
                assert_eq!(rec.label, i as u32 * 3);
                assert_eq!((rec.height, rec.width), (10 + i as u16, 20 + i as u16));
                assert_eq!(r.row(i).offset % RECORD_ALIGN, 0);
            }
            assert!(r.verify().is_empty());
        }
        // Same content, same bytes whichever writer was used for a tight capacity.
        let a = d.join("a.ddl");
        let b = d.join("b.ddl");
        write(&a, None);
        write(&b, Some(5));
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    }

    #[test]
    fn empty_shard() {
        let tmp = ddl_testkit::scratch("shard-empty");
        let d = tmp.path();
        let p = d.join("e.ddl");
        let s = ShardWriter::create(&p).unwrap().finish().unwrap();
        assert_eq!((s.records, s.bytes), (0, 4096));
        let r = ShardReader::open(&p).unwrap();
        assert!(r.is_empty());
        assert!(r.verify().is_empty());
        assert_eq!(r.file_crc32c(), s.crc32c);
    }

    #[test]
    fn capacity_is_enforced_and_drop_removes_tmp() {
        let tmp = ddl_testkit::scratch("shard-cap");
        let d = tmp.path();
        let p = d.join("c.ddl");
        let mut w = ShardWriter::with_capacity(&p, 1).unwrap();
        w.push(b"abc", 0, 1, 1).unwrap();
        let e = w.push(b"def", 0, 1, 1).unwrap_err().to_string();
        assert!(e.contains("record 1") && e.contains("c.ddl.tmp"), "{e}");
        assert!(w.push(b"", 0, 1, 1).is_err());
        drop(w);
        assert!(!tmp_path(&p).exists());
        assert!(!p.exists());
    }

    /// Rewrites the header of `bytes` with `f` applied and a correct header checksum.
    fn patch_header(bytes: &mut [u8], f: impl FnOnce(&mut Header)) {
        let mut h = Header::decode(&bytes[..64], Path::new("x"), bytes.len() as u64).unwrap();
        f(&mut h);
        bytes[..64].copy_from_slice(&h.encode());
    }

    /// Rewrites row `i` with `f` applied, fixing the index checksum (and header checksum) so
    /// that only the bounds checks can catch the damage.
    fn patch_row(bytes: &mut [u8], i: usize, f: impl FnOnce(&mut IndexRow)) {
        let at = INDEX_OFFSET as usize + i * INDEX_ROW_LEN;
        let mut row = IndexRow::decode(&bytes[at..at + 32]);
        f(&mut row);
        bytes[at..at + 32].copy_from_slice(&row.encode());
        let n = u64::from_le_bytes(bytes[16..24].try_into().unwrap()) as usize;
        let crc = crc32c::crc32c(&bytes[64..64 + n * 32]);
        patch_header(bytes, |h| h.index_crc32c = crc);
    }

    fn open_err(d: &Path, name: &str, bytes: &[u8]) -> String {
        let p = d.join(name);
        std::fs::write(&p, bytes).unwrap();
        let e = ShardReader::open(&p).unwrap_err().to_string();
        assert!(e.contains(name), "error does not name the file: {e}");
        e
    }

    #[test]
    fn corruption_is_detected_and_named() {
        let tmp = ddl_testkit::scratch("shard-corrupt");
        let d = tmp.path();
        let p = d.join("good.ddl");
        write(&p, None);
        let good = std::fs::read(&p).unwrap();
        let data_offset = ShardReader::open(&p).unwrap().header().data_offset as usize;

        let mut b = good.clone();
        b[0] = b'X';
        assert!(open_err(d, "magic.ddl", &b).contains("bad magic"));

        let mut b = good.clone();
        b[8..12].copy_from_slice(&2u32.to_le_bytes());
        let crc = crc32c::crc32c(&b[..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        assert!(open_err(d, "version.ddl", &b).contains("unsupported shard format version 2"));

        let mut b = good.clone();
        b[20] ^= 1; // record_count without fixing the checksum
        assert!(open_err(d, "hdrcrc.ddl", &b).contains("header crc32c mismatch"));

        let mut b = good.clone();
        b[64 + 32 + 12] ^= 1; // label of record 1
        let e = open_err(d, "indexcrc.ddl", &b);
        assert!(e.contains("corrupt shard index"), "{e}");

        let e = open_err(d, "trunc.ddl", &good[..good.len() - 1]);
        assert!(e.contains("truncated"), "{e}");
        let e = open_err(d, "trunc-header.ddl", &good[..40]);
        assert!(
            e.contains("truncated") && e.contains("64-byte header"),
            "{e}"
        );
        let e = open_err(d, "trunc-index.ddl", &good[..100]);
        assert!(e.contains("truncated"), "{e}");
        assert!(open_err(d, "zero.ddl", &[]).contains("truncated"));
        assert!(
            open_err(d, "text.ddl", b"hello, world, this is not a shard").contains("bad magic")
        );

        let mut b = good.clone();
        b.push(0);
        assert!(open_err(d, "trailing.ddl", &b).contains("trailing"));

        let mut b = good.clone();
        patch_row(&mut b, 4, |r| r.length += 1000);
        let e = open_err(d, "oob.ddl", &b);
        assert!(e.contains("record 4") && e.contains("outside"), "{e}");

        let mut b = good.clone();
        patch_row(&mut b, 2, |r| r.offset = u64::MAX - 63);
        let e = open_err(d, "huge.ddl", &b);
        assert!(e.contains("record 2"), "{e}");

        let mut b = good.clone();
        patch_row(&mut b, 3, |r| r.offset = 0);
        let e = open_err(d, "overlap.ddl", &b);
        assert!(e.contains("record 3") && e.contains("overlaps"), "{e}");

        let mut b = good.clone();
        patch_row(&mut b, 1, |r| r.offset += 1);
        let e = open_err(d, "align.ddl", &b);
        assert!(
            e.contains("record 1") && e.contains("multiple of 64"),
            "{e}"
        );

        let mut b = good.clone();
        patch_row(&mut b, 0, |r| r.kind = 9);
        assert!(open_err(d, "kind.ddl", &b).contains("unknown record kind 9"));

        let mut b = good.clone();
        patch_header(&mut b, |h| h.data_offset = 0);
        assert!(open_err(d, "dataoff.ddl", &b).contains("overlaps the index"));

        let mut b = good.clone();
        let n = b.len();
        patch_header(&mut b, |h| h.data_len -= 1);
        b.truncate(n - 1);
        let e = open_err(d, "datalen.ddl", &b);
        assert!(e.contains("record 4"), "{e}");

        // A flipped data byte: open succeeds, the record read and verify() name the record.
        let mut b = good.clone();
        let r2 = ShardReader::open(&p).unwrap().row(2);
        b[data_offset + r2.offset as usize + 5] ^= 0x40;
        let q = d.join("flip.ddl");
        std::fs::write(&q, &b).unwrap();
        let r = ShardReader::open(&q).unwrap();
        let e = r.record(2).unwrap_err().to_string();
        assert!(
            e.contains("flip.ddl") && e.contains("record 2") && e.contains("checksum"),
            "{e}"
        );
        assert!(r.record(1).is_ok());
        let errs = r.verify();
        assert_eq!(errs.len(), 1);
        assert!(matches!(
            errs[0],
            LoaderError::RecordChecksum { record: 2, .. }
        ));
    }

    #[test]
    fn memlock_error_shows_the_limit() {
        let (soft, hard) = memlock_limits();
        assert!(soft.ends_with("bytes") || soft == "unlimited", "{soft}");
        let e = LoaderError::MemLock {
            path: PathBuf::from("/dev/shm/train-00003.ddl"),
            bytes: 1 << 30,
            soft: soft.clone(),
            hard,
            source: std::io::Error::from_raw_os_error(libc::ENOMEM),
        }
        .to_string();
        assert!(
            e.contains("train-00003.ddl") && e.contains("RLIMIT_MEMLOCK is too low"),
            "{e}"
        );
        assert!(e.contains(&format!("current soft limit {soft}")), "{e}");
    }

    #[test]
    fn reader_is_send_sync() {
        fn check<T: Send + Sync>() {}
        check::<ShardReader>();
    }
}
