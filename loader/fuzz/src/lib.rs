//! Helpers shared by the ddl-loader fuzz targets.
//!
//! Every target's input starts with one *mode* byte followed by the payload. The mode lets the
//! fuzzer get past the checksums, which random mutation almost never satisfies, so the offset,
//! bounds and row checks behind them are exercised too:
//!
//! - bit 0 ([`FIX_HEADER_CRC`]): recompute `header_crc32c` (bytes 60..64) over bytes 0..60;
//! - bit 1 ([`FIX_INDEX_CRC`]): recompute `index_crc32c` (bytes 48..52) over the
//!   `record_count` index rows, when they lie within the payload (applied before the header
//!   checksum, which covers it).
//!
//! The other mode bits are free for each target to use.

use std::path::{Path, PathBuf};

use ddl_loader::format::{HEADER_CRC_SPAN, HEADER_LEN, INDEX_OFFSET, INDEX_ROW_LEN};

/// Mode bit: recompute the header checksum of the payload.
pub const FIX_HEADER_CRC: u8 = 1;
/// Mode bit: recompute the index checksum of the payload.
pub const FIX_INDEX_CRC: u8 = 2;

/// Splits a fuzz input into its mode byte and payload (mode 0 for an empty input).
pub fn split_mode(data: &[u8]) -> (u8, &[u8]) {
    match data.split_first() {
        Some((&mode, rest)) => (mode, rest),
        None => (0, data),
    }
}

/// Applies the checksum repairs `mode` asks for to a shard image `bytes` (see the crate docs).
/// Never panics, whatever the bytes.
pub fn fix_checksums(bytes: &mut [u8], mode: u8) {
    if bytes.len() < HEADER_LEN {
        return;
    }
    if mode & FIX_INDEX_CRC != 0 {
        let n = u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes"));
        let end = n
            .checked_mul(INDEX_ROW_LEN as u64)
            .and_then(|x| x.checked_add(INDEX_OFFSET));
        if let Some(end) = end.filter(|&e| e <= bytes.len() as u64) {
            let crc = crc32c(&bytes[INDEX_OFFSET as usize..end as usize]);
            bytes[48..52].copy_from_slice(&crc.to_le_bytes());
        }
    }
    if mode & FIX_HEADER_CRC != 0 {
        let crc = crc32c(&bytes[..HEADER_CRC_SPAN]);
        bytes[HEADER_CRC_SPAN..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
    }
}

/// CRC-32C (Castagnoli), bitwise; the fuzz crate does not depend on the `crc32c` crate so that
/// it agrees with ddl-loader's checksums independently of it (`FORMAT.md` gives the parameters).
pub fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A per-process scratch directory under the system temp directory (created on first use).
pub fn scratch_dir() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("ddl-loader-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("create fuzz scratch directory");
        d
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }
}
