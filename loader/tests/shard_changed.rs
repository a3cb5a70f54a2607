//! A shard changed under a reader that has it mapped: `check_unchanged` names the file and what
//! changed (truncation, rewrite, replacement), and a read that faults on a truncated mapping
//! (SIGBUS) is reported with the shard's name and offset before the process dies of it.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use ddl_loader::error::LoaderError;
use ddl_loader::shard::{ShardReader, ShardWriter};

/// Writes a shard of 4 records of 64 KiB each at `path`.
fn write_shard(path: &Path) {
    let mut w = ShardWriter::create(path).unwrap();
    for i in 0..4u8 {
        w.push(&vec![i; 64 << 10], u32::from(i), 8, 8).unwrap();
    }
    w.finish().unwrap();
}

fn changed(e: LoaderError, path: &Path, what: &str) {
    let msg = e.to_string();
    assert!(matches!(e, LoaderError::ShardChanged { .. }), "{msg}");
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(msg.contains(what), "{msg}");
    assert!(msg.contains("read-only"), "the rule is stated: {msg}");
}

#[test]
fn check_unchanged_names_the_shard_and_the_change() {
    let tmp = ddl_testkit::scratch("changed");
    let dir = tmp.path();
    let path = dir.join("train-00000.ddl");
    write_shard(&path);
    let r = ShardReader::open(&path).unwrap();
    r.check_unchanged().unwrap();

    // Rewritten in place with other bytes of the same size.
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    std::io::Write::write_all(&mut f, &bytes).unwrap();
    // A later modification time than the open's, whatever the file system's clock resolution.
    f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
        .unwrap();
    drop(f);
    changed(r.check_unchanged().unwrap_err(), &path, "written to");

    // Truncated.
    let r = ShardReader::open(&path).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(4096)
        .unwrap();
    changed(r.check_unchanged().unwrap_err(), &path, "size went from");

    // Replaced by another file (renamed into place).
    write_shard(&dir.join("new.ddl"));
    let r = ShardReader::open(&dir.join("new.ddl")).unwrap();
    let other = dir.join("other.ddl");
    write_shard(&other);
    std::fs::rename(&other, dir.join("new.ddl")).unwrap();
    changed(
        r.check_unchanged().unwrap_err(),
        &dir.join("new.ddl"),
        "replaced",
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// Set in the child process of [`sigbus_names_the_truncated_shard`]: the shard to truncate.
const CHILD_ENV: &str = "DDL_SIGBUS_CHILD_SHARD";

/// The child: maps the shard, truncates it, reads a record past the new end.
#[test]
fn sigbus_child() {
    let Some(path) = std::env::var_os(CHILD_ENV) else {
        return; // only meaningful when started by the test below
    };
    ddl_loader::fault::report_sigbus().unwrap();
    let path = PathBuf::from(path);
    let r = ShardReader::open(&path).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(4096)
        .unwrap();
    let _ = r.record(3);
    unreachable!("reading a record past the end of a truncated mapping must fault");
}

#[test]
fn sigbus_names_the_truncated_shard() {
    let tmp = ddl_testkit::scratch("sigbus");
    let dir = tmp.path();
    let path = dir.join("train-00007.ddl");
    write_shard(&path);
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["sigbus_child", "--nocapture", "--test-threads", "1"])
        .env(CHILD_ENV, &path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGBUS),
        "the child must still die of SIGBUS: {}\n{stderr}",
        out.status
    );
    let line = stderr
        .lines()
        .find(|l| l.contains("SIGBUS"))
        .unwrap_or_else(|| panic!("no SIGBUS report: {stderr}"));
    assert!(
        line.contains(&format!("SIGBUS reading shard {} at byte ", path.display())),
        "{line}"
    );
    assert!(line.contains("read-only"), "{line}");
    std::fs::remove_dir_all(dir).unwrap();
}
