//! The names of the files and splits a pack writes, which the packer's files and its
//! readers share.

/// File name of the pack report inside the output directory.
pub const REPORT_FILE: &str = "pack-report.json";
/// File name of the resume state inside the output directory.
pub const STATE_FILE: &str = ".pack-state.json";

/// The split names the packer writes.
pub const SPLITS: [&str; 2] = ["train", "val"];
