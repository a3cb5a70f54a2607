//! The error type of ddl-loader. Every variant names the file it concerns and, where a single
//! record is at fault, the record's index within that file.

use std::path::PathBuf;

/// Everything that can go wrong while writing, opening, checking or reading shards and manifests,
/// and while packing an input tree.
#[derive(Debug, thiserror::Error)]
pub enum LoaderError {
    /// An operating-system call on a file failed.
    #[error("{op} {path}: {source}", path = .path.display())]
    Io {
        /// What was being done ("open", "read", "mmap", "rename", ...).
        op: &'static str,
        /// The file or directory concerned.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// Classes of an input without a single usable training input (an empty class folder or
    /// tar, or a class with images only in val): packing without them would give every later
    /// class another label.
    #[error(
        "{input}: {} class(es) without a usable training image: {}; leaving a class out would \
         give every class after it another label (and drop its val images)",
        .classes.len(),
        .classes.join(", "),
        input = .input.display()
    )]
    EmptyClasses {
        /// The input directory or tar.
        input: PathBuf,
        /// The wnids of those classes.
        classes: Vec<String>,
    },

    /// The file is shorter than its header says it must be.
    #[error("{path}: truncated shard: file is {len} bytes but {needed} bytes are required ({what})", path = .path.display())]
    Truncated {
        /// The shard file.
        path: PathBuf,
        /// Actual file length in bytes.
        len: u64,
        /// The number of bytes the header requires.
        needed: u64,
        /// Which part of the file is missing.
        what: &'static str,
    },

    /// The first eight bytes are not `DDLSHARD`.
    #[error("{path}: not a ddl shard: bad magic {found:?} (expected \"DDLSHARD\")", path = .path.display())]
    BadMagic {
        /// The file.
        path: PathBuf,
        /// The eight bytes found, lossily decoded.
        found: String,
    },

    /// The shard was written in a format version this build cannot read.
    #[error("{path}: unsupported shard format version {found} (this build reads version {supported})", path = .path.display())]
    BadVersion {
        /// The shard file.
        path: PathBuf,
        /// Version stored in the header.
        found: u32,
        /// Version this build reads.
        supported: u32,
    },

    /// A header field is inconsistent, or the header checksum does not match.
    #[error("{path}: corrupt shard header: {reason}", path = .path.display())]
    CorruptHeader {
        /// The shard file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },

    /// The checksum over all index rows does not match the header.
    #[error("{path}: corrupt shard index: crc32c {actual:#010x} over {records} rows, header says {expected:#010x}", path = .path.display())]
    IndexChecksum {
        /// The shard file.
        path: PathBuf,
        /// Number of index rows.
        records: u64,
        /// Checksum stored in the header.
        expected: u32,
        /// Checksum computed over the rows.
        actual: u32,
    },

    /// One index row is invalid (out-of-bounds offset, misalignment, unknown kind, ...).
    #[error("{path}: record {record}: corrupt index row: {reason}", path = .path.display())]
    CorruptIndex {
        /// The shard file.
        path: PathBuf,
        /// Index of the record within the shard.
        record: usize,
        /// What is wrong.
        reason: String,
    },

    /// A record's bytes do not match the checksum in its index row.
    #[error("{path}: record {record}: checksum mismatch: stored crc32c {expected:#010x}, data has {actual:#010x}", path = .path.display())]
    RecordChecksum {
        /// The shard file.
        path: PathBuf,
        /// Index of the record within the shard.
        record: usize,
        /// Checksum stored in the index row.
        expected: u32,
        /// Checksum computed over the record bytes.
        actual: u32,
    },

    /// A record cannot be stored in the format (too large, zero-sized, bad dimensions).
    #[error("{path}: record {record}: cannot be written: {reason}", path = .path.display())]
    InvalidRecord {
        /// The shard file being written.
        path: PathBuf,
        /// Index the record would have had.
        record: usize,
        /// What is wrong.
        reason: String,
    },

    /// `mlock` failed because the locked-memory limit is too low.
    #[error(
        "{path}: mlock of {bytes} bytes failed ({source}): RLIMIT_MEMLOCK is too low \
         (current soft limit {soft}, hard limit {hard}); raise it with `ulimit -l unlimited`, \
         a memlock entry in /etc/security/limits.conf, LimitMEMLOCK= for systemd services, or \
         run without locking",
        path = .path.display()
    )]
    MemLock {
        /// The shard file being locked.
        path: PathBuf,
        /// Bytes that were to be locked.
        bytes: u64,
        /// Current soft limit, human readable ("65536 bytes" or "unlimited").
        soft: String,
        /// Current hard limit, human readable.
        hard: String,
        /// The error `mlock` returned.
        #[source]
        source: std::io::Error,
    },

    /// `manifest.json` could not be parsed or serialised.
    #[error("{path}: {source}", path = .path.display())]
    Json {
        /// The manifest (or other JSON) file.
        path: PathBuf,
        /// The parser's error, with line and column.
        #[source]
        source: serde_json::Error,
    },

    /// A record trace file is held by another writer: a run or loader given the same path.
    #[error(
        "record trace {path}: another run or loader is writing this file (it holds the \
         file's lock); give each its own trace path",
        path = .path.display()
    )]
    TraceBusy {
        /// The trace file.
        path: PathBuf,
    },

    /// A stage directory holds the staged shards of another job that is running, of other
    /// data: staging here would replace the shards that job has mapped.
    #[error(
        "stage directory {dir} is in use by another job ({holder}) staging other data \
         ({theirs}); staging {ours} there would replace the shards that job is reading: give \
         this job another stage directory, or wait for that job to end",
        dir = .dir.display(),
        ours = .ours.display()
    )]
    StageInUse {
        /// The stage directory.
        dir: PathBuf,
        /// Who holds it, as it wrote itself down ("pid P on host H").
        holder: String,
        /// The data directory of the running job, as it wrote it down.
        theirs: String,
        /// The data directory of this job.
        ours: PathBuf,
    },

    /// `manifest.json` parsed but its content is inconsistent.
    #[error("{path}: invalid manifest: {reason}", path = .path.display())]
    Manifest {
        /// The manifest file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },

    /// A whole shard file does not match what the manifest records for it.
    #[error("{path}: shard does not match manifest: {reason}", path = .path.display())]
    ShardMismatch {
        /// The shard file.
        path: PathBuf,
        /// What differs (record count, size or whole-file checksum).
        reason: String,
    },

    /// A record's label is not one of the manifest's classes.
    #[error(
        "{path}: record {record} has label {label}, but manifest.json lists {classes} classes \
         (labels 0..{classes}): the manifest does not belong to these shards (was a class \
         removed by hand?); restore the manifest ddl-pack wrote, or pack again",
        path = .path.display()
    )]
    LabelOutOfRange {
        /// The shard file.
        path: PathBuf,
        /// The record's index in the shard.
        record: usize,
        /// Its label.
        label: u32,
        /// The manifest's class count.
        classes: usize,
    },

    /// Every input of a training class was skipped, so the class has no record.
    #[error(
        "{path}: {} training class(es) lost every input to decoding or reading errors and \
         would have no record: {}; the report lists every skipped file. Fix or remove those \
         files and rerun the same command (only their shards are redone), or rerun with \
         --keep-empty-classes to keep the classes without records",
        classes.len(),
        list_counts(classes),
        path = .path.display()
    )]
    ClassesWithoutRecords {
        /// The pack report.
        path: PathBuf,
        /// The classes by wnid, with their input counts.
        classes: std::collections::BTreeMap<String, u64>,
    },

    /// Too many inputs were skipped; the report lists them.
    #[error(
        "{path}: skipped {skipped} of {inputs} inputs, more than the limit of {max} \
         (max_skip_fraction) allows; the report lists every skipped file. The shards are kept: \
         rerun with a higher limit to accept them and write manifest.json without redoing any \
         work",
        path = .path.display()
    )]
    SkipFraction {
        /// The pack report.
        path: PathBuf,
        /// Inputs skipped.
        skipped: u64,
        /// Inputs found.
        inputs: u64,
        /// The limit.
        max: f64,
    },

    /// The packer's output directory holds files this pack did not write (another dataset,
    /// unrelated files); nothing was written or removed.
    #[error(
        "{path}: {}",
        .conflict.describe(&crate::pack::spec::PackSpec::in_words, "the force option"),
        path = .path.display()
    )]
    OutputInUse {
        /// The output directory.
        path: PathBuf,
        /// What is there and what to do.
        conflict: Box<crate::pack::conflict::OutputConflict>,
    },

    /// Another ddl-pack is writing into the output directory (it holds the directory's lock);
    /// nothing was written.
    #[error(
        "{path}: another ddl-pack is writing into this directory (it holds the directory's \
         lock): wait for it to finish, or give this pack another output directory",
        path = .path.display()
    )]
    OutputBusy {
        /// The output directory.
        path: PathBuf,
    },

    /// A packer option's value is unusable, or the input needs an option that was not given.
    #[error("{path}: {source}", path = .path.display())]
    Option {
        /// The file or directory the option concerns.
        path: PathBuf,
        /// Which option and why.
        #[source]
        source: crate::pack::option_error::OptionError,
    },

    /// The packer's input is unusable (unknown layout, missing labels, bad class list, ...).
    #[error("{path}: {reason}", path = .path.display())]
    Input {
        /// The input file or directory at fault.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },

    /// A record's bytes passed their checksum but cannot be decoded as an image.
    #[error("{path}: record {record}: cannot decode: {reason}", path = .path.display())]
    Decode {
        /// The shard file.
        path: PathBuf,
        /// Index of the record within the shard.
        record: usize,
        /// The decoder's message.
        reason: String,
    },

    /// A sampler, dataset or pipeline was configured with impossible values.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),

    /// A batch could not be produced because every substitute for a bad record was bad too,
    /// or the pipeline was configured to fail on bad records.
    #[error("epoch {epoch} step {step} replica {replica}: {reason}")]
    Batch {
        /// Epoch of the batch.
        epoch: u64,
        /// Step of the batch.
        step: usize,
        /// Replica the batch was for.
        replica: usize,
        /// What went wrong, naming the shard file and record.
        reason: String,
    },

    /// The pipeline's workers stopped before the epoch's last batch (pipeline dropped).
    #[error("replica {replica}: pipeline stopped after {delivered} of {expected} batches")]
    PipelineStopped {
        /// Replica whose iterator was cut short.
        replica: usize,
        /// Batches delivered to this replica.
        delivered: usize,
        /// Batches the epoch should have had from the start step.
        expected: usize,
    },

    /// A mapped shard changed on disk while this process used it.
    #[error(
        "{path}: shard changed while this job had it mapped: {reason}. Shards must stay \
         read-only while a job uses them: restore the file (ddl-pack's verification checks \
         it) and resume from the last checkpoint",
        path = .path.display()
    )]
    ShardChanged {
        /// The shard file.
        path: PathBuf,
        /// What changed.
        reason: String,
    },
}

impl LoaderError {
    /// Wraps an I/O error with the operation and the path it concerned.
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        LoaderError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

/// Result type of ddl-loader.
pub type Result<T> = std::result::Result<T, LoaderError>;

/// The first classes of `classes` as `wnid (N inputs)`, control characters escaped.
fn list_counts(classes: &std::collections::BTreeMap<String, u64>) -> String {
    const SHOWN: usize = 5;
    let mut out: Vec<String> = classes
        .iter()
        .take(SHOWN)
        .map(|(w, n)| format!("{} ({n} inputs)", w.escape_debug()))
        .collect();
    if classes.len() > SHOWN {
        out.push(format!("and {} more", classes.len() - SHOWN));
    }
    out.join(", ")
}
