//! Byte layout of shard format version 1 (specified in `loader/FORMAT.md`).
//!
//! A shard is one file: a 64-byte header, `record_count` index rows of 32 bytes each starting at
//! byte 64, zero padding up to `data_offset` (a multiple of 4096), then the data region of
//! `data_len` bytes in which every record starts at a multiple of 64 (relative to
//! `data_offset`). All integers are little-endian. This module only converts between bytes and
//! structs and checks the rules that concern a header or one row on its own; `shard` does the
//! I/O.

use std::path::Path;

use crate::error::{LoaderError, Result};

/// The eight magic bytes every shard starts with.
pub const MAGIC: [u8; 8] = *b"DDLSHARD";
/// The shard format version this build writes and reads.
pub const VERSION: u32 = 1;
/// Length of the file header in bytes.
pub const HEADER_LEN: usize = 64;
/// Length of one index row in bytes.
pub const INDEX_ROW_LEN: usize = 32;
/// Byte offset of the first index row.
pub const INDEX_OFFSET: u64 = HEADER_LEN as u64;
/// Alignment of the data region's start (`data_offset`), in bytes.
pub const DATA_ALIGN: u64 = 4096;
/// Alignment of every record's offset within the data region, in bytes.
pub const RECORD_ALIGN: u64 = 64;
/// Record kind: a baseline or progressive JPEG (the only kind in version 1).
pub const KIND_JPEG: u8 = 0;
/// Number of header bytes covered by the header checksum (everything before it).
pub const HEADER_CRC_SPAN: usize = 60;

/// Rounds `x` up to a multiple of `align` (a power of two).
pub fn align_up(x: u64, align: u64) -> u64 {
    debug_assert!(align.is_power_of_two());
    (x + align - 1) & !(align - 1)
}

/// The smallest valid `data_offset` for a shard with `records` index rows.
pub fn min_data_offset(records: u64) -> u64 {
    align_up(INDEX_OFFSET + records * INDEX_ROW_LEN as u64, DATA_ALIGN)
}

/// The decoded file header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Number of records (and index rows).
    pub record_count: u64,
    /// Byte offset of the first index row; always [`INDEX_OFFSET`] in version 1.
    pub index_offset: u64,
    /// Byte offset of the data region; a multiple of [`DATA_ALIGN`] at or after the index end.
    pub data_offset: u64,
    /// Length of the data region in bytes; the file is exactly `data_offset + data_len` long.
    pub data_len: u64,
    /// crc32c over all index rows (`record_count * 32` bytes at `index_offset`).
    pub index_crc32c: u32,
}

impl Header {
    /// Serialises the header, including the header checksum over bytes 0..60.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.record_count.to_le_bytes());
        b[24..32].copy_from_slice(&self.index_offset.to_le_bytes());
        b[32..40].copy_from_slice(&self.data_offset.to_le_bytes());
        b[40..48].copy_from_slice(&self.data_len.to_le_bytes());
        b[48..52].copy_from_slice(&self.index_crc32c.to_le_bytes());
        // 52..60: two reserved u32, zero.
        let crc = crc32c::crc32c(&b[..HEADER_CRC_SPAN]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Parses and checks a header read from `path` (used in error messages): magic, version,
    /// header length, header checksum, reserved fields, and that the offsets are consistent with
    /// each other and with a file of `file_len` bytes.
    pub fn decode(bytes: &[u8], path: &Path, file_len: u64) -> Result<Header> {
        if bytes.len() < HEADER_LEN {
            return Err(LoaderError::Truncated {
                path: path.to_path_buf(),
                len: file_len,
                needed: HEADER_LEN as u64,
                what: "the 64-byte header",
            });
        }
        let b = &bytes[..HEADER_LEN];
        if b[0..8] != MAGIC {
            return Err(LoaderError::BadMagic {
                path: path.to_path_buf(),
                found: String::from_utf8_lossy(&b[0..8]).into_owned(),
            });
        }
        let version = u32_at(b, 8);
        let corrupt = |reason: String| LoaderError::CorruptHeader {
            path: path.to_path_buf(),
            reason,
        };
        let stored_crc = u32_at(b, 60);
        let actual_crc = crc32c::crc32c(&b[..HEADER_CRC_SPAN]);
        if stored_crc != actual_crc {
            // A different version may lay out its header differently, so report the version
            // first only when the checksum holds; otherwise the header is simply damaged.
            return Err(corrupt(format!(
                "header crc32c mismatch: stored {stored_crc:#010x}, bytes 0..60 have {actual_crc:#010x}"
            )));
        }
        if version != VERSION {
            return Err(LoaderError::BadVersion {
                path: path.to_path_buf(),
                found: version,
                supported: VERSION,
            });
        }
        let header_len = u32_at(b, 12);
        if header_len as usize != HEADER_LEN {
            return Err(corrupt(format!(
                "header_len is {header_len}, version 1 requires {HEADER_LEN}"
            )));
        }
        if u32_at(b, 52) != 0 || u32_at(b, 56) != 0 {
            return Err(corrupt("reserved header fields are not zero".into()));
        }
        let h = Header {
            record_count: u64_at(b, 16),
            index_offset: u64_at(b, 24),
            data_offset: u64_at(b, 32),
            data_len: u64_at(b, 40),
            index_crc32c: u32_at(b, 48),
        };
        h.check_layout(path, file_len)?;
        Ok(h)
    }

    /// Checks that the offsets are consistent with each other and with a file of `file_len`
    /// bytes at `path`.
    fn check_layout(&self, path: &Path, file_len: u64) -> Result<()> {
        let h = self;
        let corrupt = |reason: String| LoaderError::CorruptHeader {
            path: path.to_path_buf(),
            reason,
        };
        if h.index_offset != INDEX_OFFSET {
            return Err(corrupt(format!(
                "index_offset is {}, version 1 requires {INDEX_OFFSET}",
                h.index_offset
            )));
        }
        let index_end = h
            .record_count
            .checked_mul(INDEX_ROW_LEN as u64)
            .and_then(|n| n.checked_add(INDEX_OFFSET))
            .ok_or_else(|| corrupt(format!("record_count {} overflows", h.record_count)))?;
        if h.data_offset % DATA_ALIGN != 0 {
            return Err(corrupt(format!(
                "data_offset {} is not a multiple of {DATA_ALIGN}",
                h.data_offset
            )));
        }
        if h.data_offset < index_end {
            return Err(corrupt(format!(
                "data_offset {} overlaps the index, which ends at byte {index_end} ({} records)",
                h.data_offset, h.record_count
            )));
        }
        let file_needed = h.data_offset.checked_add(h.data_len).ok_or_else(|| {
            corrupt(format!(
                "data_offset {} + data_len {} overflows",
                h.data_offset, h.data_len
            ))
        })?;
        if file_len < file_needed {
            return Err(LoaderError::Truncated {
                path: path.to_path_buf(),
                len: file_len,
                needed: file_needed,
                what: "header's data_offset + data_len",
            });
        }
        if file_len > file_needed {
            return Err(corrupt(format!(
                "file is {file_len} bytes but data_offset + data_len = {file_needed}: trailing bytes"
            )));
        }
        Ok(())
    }
}

/// One decoded index row: where a record lives in the data region and what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexRow {
    /// Offset of the record relative to `data_offset`; a multiple of [`RECORD_ALIGN`].
    pub offset: u64,
    /// Length of the record in bytes.
    pub length: u32,
    /// Class label (index into the manifest's class list).
    pub label: u32,
    /// Image height in pixels.
    pub height: u16,
    /// Image width in pixels.
    pub width: u16,
    /// crc32c of the record's bytes.
    pub crc32c: u32,
    /// Record kind; [`KIND_JPEG`] is the only kind in version 1.
    pub kind: u8,
}

impl IndexRow {
    /// Serialises the row into its 32-byte form (reserved bytes zero).
    pub fn encode(&self) -> [u8; INDEX_ROW_LEN] {
        let mut b = [0u8; INDEX_ROW_LEN];
        b[0..8].copy_from_slice(&self.offset.to_le_bytes());
        b[8..12].copy_from_slice(&self.length.to_le_bytes());
        b[12..16].copy_from_slice(&self.label.to_le_bytes());
        b[16..18].copy_from_slice(&self.height.to_le_bytes());
        b[18..20].copy_from_slice(&self.width.to_le_bytes());
        b[20..24].copy_from_slice(&self.crc32c.to_le_bytes());
        b[24] = self.kind;
        b
    }

    /// Parses a 32-byte row without any checks (the caller validates with [`IndexRow::check`]).
    pub fn decode(b: &[u8]) -> IndexRow {
        IndexRow {
            offset: u64_at(b, 0),
            length: u32_at(b, 8),
            label: u32_at(b, 12),
            height: u16_at(b, 16),
            width: u16_at(b, 18),
            crc32c: u32_at(b, 20),
            kind: b[24],
        }
    }

    /// Checks row `record` of `path` (raw bytes `raw`) against the shard's rules: known kind,
    /// zero reserved bytes, non-empty, aligned, starting at or after `prev_end` (records are
    /// stored in index order without overlap) and ending within a data region of `data_len`
    /// bytes. Returns the end offset of the record.
    pub fn check(
        &self,
        raw: &[u8],
        path: &Path,
        record: usize,
        prev_end: u64,
        data_len: u64,
    ) -> Result<u64> {
        let bad = |reason: String| LoaderError::CorruptIndex {
            path: path.to_path_buf(),
            record,
            reason,
        };
        if self.kind != KIND_JPEG {
            return Err(bad(format!("unknown record kind {}", self.kind)));
        }
        if raw[25..32].iter().any(|&x| x != 0) {
            return Err(bad("reserved bytes are not zero".into()));
        }
        if self.length == 0 {
            return Err(bad("zero-length record".into()));
        }
        if self.offset % RECORD_ALIGN != 0 {
            return Err(bad(format!(
                "offset {} is not a multiple of {RECORD_ALIGN}",
                self.offset
            )));
        }
        if self.offset < prev_end {
            return Err(bad(format!(
                "offset {} overlaps the previous record, which ends at {prev_end}",
                self.offset
            )));
        }
        let end = self
            .offset
            .checked_add(u64::from(self.length))
            .filter(|&e| e <= data_len)
            .ok_or_else(|| {
                bad(format!(
                    "offset {} + length {} is outside the {data_len}-byte data region",
                    self.offset, self.length
                ))
            })?;
        Ok(end)
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn header() -> Header {
        Header {
            record_count: 3,
            index_offset: INDEX_OFFSET,
            data_offset: 4096,
            data_len: 200,
            index_crc32c: 0xdead_beef,
        }
    }

    #[test]
    fn header_roundtrip() {
        let h = header();
        let b = h.encode();
        assert_eq!(&b[0..8], b"DDLSHARD");
        assert_eq!(Header::decode(&b, &PathBuf::from("x"), 4296).unwrap(), h);
    }

    #[test]
    fn layout_matches_format_md() {
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
        let b = header().encode();
        assert_eq!(&b[8..12], &1u32.to_le_bytes());
        assert_eq!(&b[12..16], &64u32.to_le_bytes());
        assert_eq!(&b[16..24], &3u64.to_le_bytes());
        assert_eq!(&b[24..32], &64u64.to_le_bytes());
        assert_eq!(&b[32..40], &4096u64.to_le_bytes());
        assert_eq!(&b[40..48], &200u64.to_le_bytes());
        assert_eq!(&b[48..52], &0xdead_beefu32.to_le_bytes());
        assert_eq!(&b[52..60], &[0; 8]);
        assert_eq!(&b[60..64], &crc32c::crc32c(&b[..60]).to_le_bytes());
        let row = IndexRow {
            offset: 0x0102_0304_0506_0708,
            length: 0x1112_1314,
            label: 0x2122_2324,
            height: 0x3132,
            width: 0x4142,
            crc32c: 0x5152_5354,
            kind: KIND_JPEG,
        }
        .encode();
        assert_eq!(&row[0..8], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(&row[8..12], &0x1112_1314u32.to_le_bytes());
        assert_eq!(&row[12..16], &0x2122_2324u32.to_le_bytes());
        assert_eq!(&row[16..18], &0x3132u16.to_le_bytes());
        assert_eq!(&row[18..20], &0x4142u16.to_le_bytes());
        assert_eq!(&row[20..24], &0x5152_5354u32.to_le_bytes());
        assert_eq!(&row[24..32], &[0; 8]);
        assert_eq!(min_data_offset(0), 4096);
        assert_eq!(min_data_offset(126), 4096);
        assert_eq!(min_data_offset(127), 8192);
    }

    #[test]
    fn header_rejects_every_single_bit_flip() {
        let b = header().encode();
        for byte in 0..HEADER_LEN {
            for bit in 0..8 {
                let mut c = b;
                c[byte] ^= 1 << bit;
                assert!(
                    Header::decode(&c, Path::new("x"), 4296).is_err(),
                    "flip of byte {byte} bit {bit} accepted"
                );
            }
        }
    }

    #[test]
    fn header_checks_offsets() {
        let p = Path::new("s.ddl");
        let mut h = header();
        h.data_offset = 4000;
        let e = Header::decode(&h.encode(), p, 4200)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("not a multiple of 4096") && e.contains("s.ddl"),
            "{e}"
        );
        let mut h = header();
        h.record_count = 200;
        let e = Header::decode(&h.encode(), p, 4296)
            .unwrap_err()
            .to_string();
        assert!(e.contains("overlaps the index"), "{e}");
        let e = Header::decode(&header().encode(), p, 4295)
            .unwrap_err()
            .to_string();
        assert!(e.contains("truncated"), "{e}");
        let e = Header::decode(&header().encode(), p, 4297)
            .unwrap_err()
            .to_string();
        assert!(e.contains("trailing bytes"), "{e}");
    }

    #[test]
    fn row_roundtrip_and_checks() {
        let r = IndexRow {
            offset: 128,
            length: 10,
            label: 7,
            height: 3,
            width: 4,
            crc32c: 5,
            kind: KIND_JPEG,
        };
        let raw = r.encode();
        assert_eq!(IndexRow::decode(&raw), r);
        assert_eq!(u16_at(&raw, 16), 3);
        let p = Path::new("s.ddl");
        assert_eq!(r.check(&raw, p, 0, 64, 138).unwrap(), 138);
        let e = r.check(&raw, p, 2, 64, 137).unwrap_err().to_string();
        assert!(e.contains("record 2") && e.contains("outside"), "{e}");
        let e = r.check(&raw, p, 2, 129, 1000).unwrap_err().to_string();
        assert!(e.contains("overlaps"), "{e}");
        let mut raw2 = raw;
        raw2[30] = 1;
        assert!(r.check(&raw2, p, 0, 0, 1000).is_err());
        let mut r2 = r;
        r2.offset = 100;
        assert!(r2.check(&r2.encode(), p, 0, 0, 1000).is_err());
        r2.offset = u64::MAX - 63;
        r2.length = 100;
        assert!(r2.check(&r2.encode(), p, 0, 0, u64::MAX).is_err());
    }
}
