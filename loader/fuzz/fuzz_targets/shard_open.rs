//! Fuzz target: arbitrary bytes as a shard file.
//!
//! Input: a mode byte (see `ddl_loader_fuzz`; checksum repairs) and the file's bytes. The bytes
//! are written to a scratch file and opened with `ShardReader::open`; when it opens, every
//! row and record is read and `verify` runs. Nothing may panic or read out of bounds, and
//! every error must name the file.

#![no_main]

use ddl_loader::shard::ShardReader;
use ddl_loader_fuzz::{fix_checksums, scratch_dir, split_mode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (mode, payload) = split_mode(data);
    let mut bytes = payload.to_vec();
    fix_checksums(&mut bytes, mode);
    let path = scratch_dir().join("shard_open.ddl");
    std::fs::write(&path, &bytes).expect("write scratch shard");
    let name = "shard_open.ddl";
    match ShardReader::open(&path) {
        Ok(reader) => {
            assert_eq!(reader.file_bytes(), bytes.len() as u64);
            for i in 0..reader.len() {
                let row = reader.row(i);
                match reader.record(i) {
                    Ok(rec) => {
                        assert_eq!(rec.bytes.len(), row.length as usize);
                        assert_eq!(rec.label, row.label);
                    }
                    Err(e) => assert!(e.to_string().contains(name), "{e}"),
                }
            }
            for e in reader.verify() {
                assert!(e.to_string().contains(name), "{e}");
            }
        }
        Err(e) => assert!(e.to_string().contains(name), "{e}"),
    }
});
