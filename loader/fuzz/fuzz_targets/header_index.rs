//! Fuzz target: `format::Header::decode` and `format::IndexRow::decode` / `check` on bytes in
//! memory (no file).
//!
//! Input: a mode byte (see `ddl_loader_fuzz`; checksum repairs), then 8 bytes giving the file
//! length to decode against when mode bit 2 is set (otherwise the payload's own length), then
//! the shard image. When the header decodes, its index rows are decoded and checked in order
//! exactly as `ShardReader::open` does, and every accepted row must lie inside the data region.
//! Independently, every 32-byte chunk of the payload is checked as a row against arbitrary
//! `prev_end` / `data_len` values taken from the input.

#![no_main]

use std::path::Path;

use ddl_loader::format::{Header, IndexRow, INDEX_OFFSET, INDEX_ROW_LEN, RECORD_ALIGN};
use ddl_loader_fuzz::{fix_checksums, split_mode};
use libfuzzer_sys::fuzz_target;

/// Mode bit: decode against the file length given in the input instead of the payload length.
const EXPLICIT_FILE_LEN: u8 = 4;

fuzz_target!(|data: &[u8]| {
    let (mode, rest) = split_mode(data);
    let Some((len_bytes, payload)) = rest.split_first_chunk::<8>() else {
        return;
    };
    let mut bytes = payload.to_vec();
    fix_checksums(&mut bytes, mode);
    let file_len = if mode & EXPLICIT_FILE_LEN != 0 {
        u64::from_le_bytes(*len_bytes)
    } else {
        bytes.len() as u64
    };
    let path = Path::new("fuzz.ddl");
    match Header::decode(&bytes, path, file_len) {
        Ok(h) => {
            assert_eq!(h.index_offset, INDEX_OFFSET);
            let index_end = INDEX_OFFSET + h.record_count * INDEX_ROW_LEN as u64;
            assert!(index_end <= h.data_offset);
            assert_eq!(h.data_offset + h.data_len, file_len);
            // The rows are only in `bytes` when the file length is the payload's.
            if file_len == bytes.len() as u64 {
                let index = &bytes[INDEX_OFFSET as usize..index_end as usize];
                let mut prev_end = 0u64;
                for (i, raw) in index.chunks_exact(INDEX_ROW_LEN).enumerate() {
                    let row = IndexRow::decode(raw);
                    match row.check(raw, path, i, prev_end, h.data_len) {
                        Ok(end) => {
                            assert!(row.offset >= prev_end && row.offset % RECORD_ALIGN == 0);
                            assert!(end <= h.data_len && end > row.offset);
                            prev_end = end;
                        }
                        Err(e) => {
                            assert!(e.to_string().contains("fuzz.ddl"), "{e}");
                            break;
                        }
                    }
                }
            }
        }
        Err(e) => assert!(e.to_string().contains("fuzz.ddl"), "{e}"),
    }
    let prev_end = u64::from_le_bytes(*len_bytes);
    let data_len = prev_end.rotate_left(32);
    for (i, raw) in bytes.chunks_exact(INDEX_ROW_LEN).enumerate() {
        let row = IndexRow::decode(raw);
        assert_eq!(IndexRow::decode(&row.encode()), row);
        if let Ok(end) = row.check(raw, path, i, prev_end, data_len) {
            assert!(end <= data_len && end - u64::from(row.length) == row.offset);
        }
    }
});
