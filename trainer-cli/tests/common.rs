//! What the binaries' tests share: the path of `ddl-train` and a tiny dataset to run it on.

use std::path::{Path, PathBuf};

use ddl_testkit::{write_manifest, write_shards, Record};

/// The `ddl-train` binary of this build.
pub const TRAIN: &str = env!("CARGO_BIN_EXE_ddl-train");

/// A scratch directory holding in `data/` three classes of four 24-pixel JPEGs each, in one
/// train shard.
pub fn scratch_with_data(name: &str) -> (ddl_testkit::TempDir, PathBuf) {
    let tmp = ddl_testkit::scratch(name);
    let data = tmp.path().join("data");
    write_dataset(&data, 3, 4);
    (tmp, data)
}

/// Writes `dir` with `per_class` train records of each of `classes` classes in one shard.
fn write_dataset(dir: &Path, classes: usize, per_class: usize) {
    std::fs::create_dir_all(dir).unwrap();
    let records: Vec<Record> = (0..per_class * classes)
        .map(|i| Record::jpeg(ddl_testkit::jpeg(24, 24, i), (i % classes) as u32))
        .collect();
    let train = write_shards(dir, "train", &[records], 1);
    write_manifest(dir, classes, vec![("train", train)], 1);
}
