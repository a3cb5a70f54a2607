//! The bad records a profile meets, from every thread, and `--on-bad-record fail`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{bail, Result};
use ddl_loader::pipeline::OnBadRecord;
use ddl_loader::LoaderError;

use super::config::ProfConfig;
use super::report::{BadRecordSeen, BadRecords, BAD_RECORDS_SHOWN};

/// The distinct bad records met so far: (shard file, record) keys, and each record in the
/// order first met.
type SeenBadRecords = (BTreeSet<(PathBuf, usize)>, Vec<BadRecordSeen>);

/// Collects the bad records met from every thread and applies `--on-bad-record fail`.
pub(crate) struct BadLog {
    policy: OnBadRecord,
    dir: PathBuf,
    seen: Mutex<SeenBadRecords>,
}

impl BadLog {
    pub(crate) fn new(cfg: &ProfConfig) -> BadLog {
        BadLog {
            policy: cfg.on_bad_record,
            dir: cfg.dir.clone(),
            seen: Mutex::new((BTreeSet::new(), Vec::new())),
        }
    }

    /// Notes that record `record` of `file` is bad; under `Fail` returns the error that stops
    /// the profile.
    pub(crate) fn met(&self, file: &Path, record: usize, reason: &str) -> Result<()> {
        if self.policy == OnBadRecord::Fail {
            bail!(
                "{}: record {record}: {reason} (--on-bad-record fail); `ddl-pack --verify {}` \
                 lists every damaged record, --on-bad-record replace profiles around them",
                file.display(),
                self.dir.display()
            );
        }
        let mut g = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if g.0.insert((file.to_path_buf(), record)) && g.1.len() < BAD_RECORDS_SHOWN {
            g.1.push(BadRecordSeen {
                file: file.to_path_buf(),
                record,
                reason: reason.to_string(),
            });
        }
        Ok(())
    }

    /// Notes `e` if it is a bad record (checksum or decode error); any other error is
    /// returned as it is.
    pub(crate) fn met_error(&self, e: LoaderError) -> Result<()> {
        match e {
            LoaderError::RecordChecksum {
                path,
                record,
                expected,
                actual,
            } => self.met(
                &path,
                record,
                &format!(
                    "checksum mismatch: stored crc32c {expected:#010x}, data has {actual:#010x}"
                ),
            ),
            LoaderError::Decode {
                path,
                record,
                reason,
            } => self.met(&path, record, &format!("cannot decode: {reason}")),
            other => Err(other.into()),
        }
    }

    pub(crate) fn report(&self) -> BadRecords {
        let g = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        BadRecords {
            count: g.0.len() as u64,
            first: g.1.clone(),
        }
    }
}
