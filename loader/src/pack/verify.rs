//! Checking a packed directory against its manifest (`ddl-pack`'s verification): every shard's
//! header, index and record checksums, record count, size, whole-file checksum and labels.

use std::path::Path;

use rayon::prelude::*;

use crate::error::{LoaderError, Result};
use crate::manifest::{Manifest, ShardInfo};
use crate::shard::ShardReader;

/// What [`verify`] found.
#[derive(Debug)]
pub struct VerifyReport {
    /// Shards checked.
    pub shards: usize,
    /// Records checked.
    pub records: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Every problem, naming the shard and, for damaged records, the record.
    pub problems: Vec<LoaderError>,
}

/// Re-reads the manifest in `dir` and every shard it lists: header, index, every record's
/// checksum, record count, size and whole-file checksum against the manifest, and every
/// label against its class count.
pub fn verify(dir: &Path) -> Result<VerifyReport> {
    let manifest = Manifest::load(dir)?;
    let shards: Vec<&ShardInfo> = manifest
        .splits
        .values()
        .flat_map(|s| s.shards.iter())
        .collect();
    let classes = manifest.num_classes();
    let results: Vec<(u64, u64, Vec<LoaderError>)> = shards
        .par_iter()
        .map(|info| verify_shard(dir, info, classes))
        .collect();
    let mut report = VerifyReport {
        shards: shards.len(),
        records: 0,
        bytes: 0,
        problems: Vec::new(),
    };
    for (records, bytes, problems) in results {
        report.records += records;
        report.bytes += bytes;
        report.problems.extend(problems);
    }
    Ok(report)
}

fn verify_shard(dir: &Path, info: &ShardInfo, classes: usize) -> (u64, u64, Vec<LoaderError>) {
    let path = dir.join(&info.file);
    let reader = match ShardReader::open(&path) {
        Ok(r) => r,
        Err(e) => return (0, 0, vec![e]),
    };
    let mut problems = Vec::new();
    let mismatch = |reason: String| LoaderError::ShardMismatch {
        path: path.clone(),
        reason,
    };
    if reader.len() as u64 != info.records {
        problems.push(mismatch(format!(
            "{} records, manifest says {}",
            reader.len(),
            info.records
        )));
    }
    if reader.file_bytes() != info.bytes {
        problems.push(mismatch(format!(
            "{} bytes, manifest says {}",
            reader.file_bytes(),
            info.bytes
        )));
    }
    let crc = reader.file_crc32c();
    if crc != info.crc32c {
        problems.push(mismatch(format!(
            "whole-file crc32c {crc:#010x}, manifest says {:#010x}",
            info.crc32c
        )));
    }
    problems.extend(reader.check_labels(classes).err());
    problems.extend(reader.verify());
    (reader.len() as u64, reader.file_bytes(), problems)
}
