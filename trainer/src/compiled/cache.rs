//! The compile cache: a folder of entries ([`super::entry`]), one per key. An entry is
//! compiled into a temporary folder beside it and renamed into place once sealed, under a
//! lock per key, so that the ranks of a node (or two jobs) compile a key once and never see
//! half an entry.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use fs4::fs_std::FileExt;

use super::entry::{self, Entry, Unusable};
use super::python::Python;
use super::{StepKey, StepSpec, GRAPH_SOURCES, SCRIPT};
use crate::error::{Result, TrainError};

/// The entry of `key` in `cache`, compiled by `python` from `spec` if it is missing or
/// cannot be used.
pub fn get_or_build(
    cache: &Path,
    key: &StepKey,
    python: &Python,
    spec: &StepSpec,
    progress: &mut dyn FnMut(&str),
) -> Result<Entry> {
    fs::create_dir_all(cache).map_err(|e| TrainError::io(cache, e))?;
    let name = key.dir_name();
    let dir = cache.join(&name);
    let lock_path = cache.join(format!("{name}.lock"));
    let lock = fs::File::create(&lock_path).map_err(|e| TrainError::io(&lock_path, e))?;
    if !lock
        .try_lock_exclusive()
        .map_err(|e| TrainError::io(&lock_path, e))?
    {
        progress(&format!(
            "compile: waiting for another process compiling {}",
            dir.display()
        ));
        lock.lock_exclusive()
            .map_err(|e| TrainError::io(&lock_path, e))?;
    }
    match entry::open(&dir, key) {
        Ok(entry) => {
            progress(&format!(
                "compile: {} from the cache ({})",
                spec.describe(key),
                dir.display()
            ));
            return Ok(entry);
        }
        Err(Unusable::Missing) => {}
        Err(Unusable::Bad(why)) => {
            progress(&format!(
                "compile: the cache entry {} cannot be used: {why}; compiling it again",
                dir.display()
            ));
            remove_entry(&dir)?;
        }
    }
    progress(&format!(
        "compile: {} with Inductor into {} (once per key; minutes)",
        spec.describe(key),
        dir.display()
    ));
    let start = Instant::now();
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .tempdir_in(cache)
        .map_err(|e| TrainError::io(cache, e))?;
    if let Err(e) = compile(tmp.path(), python, &spec.script_spec(key)) {
        return Err(keep_failed(tmp, &cache.join(format!("{name}.failed")), e));
    }
    entry::seal(tmp.path(), key)?;
    let built = tmp.keep();
    fs::rename(&built, &dir).map_err(|e| TrainError::io(&dir, e))?;
    let entry = entry::open(&dir, key).map_err(|u| match u {
        Unusable::Missing => TrainError::Compile(format!("{} vanished", dir.display())),
        Unusable::Bad(why) => TrainError::Compile(why),
    })?;
    for why in &entry.described.refused {
        progress(&format!(
            "compile: the package {why}; compiled again (options in {})",
            dir.join(entry::DESCRIBED).display()
        ));
    }
    progress(&format!(
        "compile: {} compiled in {:.1} s",
        key.model,
        start.elapsed().as_secs_f64()
    ));
    Ok(entry)
}

/// Runs the compile script in `dir` (spec.json, step.py, the graph library's sources and
/// compile.log go there too).
fn compile(dir: &Path, python: &Python, spec: &serde_json::Value) -> Result<()> {
    let write = |name: &str, bytes: &[u8]| {
        let path = dir.join(name);
        fs::File::create(&path)
            .and_then(|mut f| f.write_all(bytes))
            .map_err(|e| TrainError::io(&path, e))
    };
    write("spec.json", spec.to_string().as_bytes())?;
    write("step.py", SCRIPT.as_bytes())?;
    for (name, text) in GRAPH_SOURCES {
        write(name, text.as_bytes())?;
    }
    let log_path = dir.join("compile.log");
    let log = fs::File::create(&log_path).map_err(|e| TrainError::io(&log_path, e))?;
    let log_err = log.try_clone().map_err(|e| TrainError::io(&log_path, e))?;
    let status = Command::new(&python.exe)
        .arg(dir.join("step.py"))
        .arg(dir.join("spec.json"))
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .status()
        .map_err(|e| {
            TrainError::Compile(format!(
                "cannot run {} ({e}): the compile needs Python with torch {}; set DDL_PYTHON \
                 to such a python",
                python.exe.display(),
                python.torch_version
            ))
        })?;
    if status.success() {
        return Ok(());
    }
    let text = fs::read_to_string(&log_path).unwrap_or_default();
    let ours: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("ddl compile: "))
        .collect();
    let tail: Vec<&str> = if ours.is_empty() {
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].to_vec()
    } else {
        ours
    };
    Err(TrainError::Compile(format!(
        "{} {} failed ({status}):\n{}",
        python.exe.display(),
        "step.py",
        tail.join("\n")
    )))
}

/// `error`, with the failed compile's folder (its spec, script and log) kept as `failed`
/// (replacing an older failure of the same key) and named in the message.
fn keep_failed(tmp: tempfile::TempDir, failed: &Path, error: TrainError) -> TrainError {
    if failed.exists() && remove_entry(failed).is_err() {
        return error;
    }
    let kept = tmp.keep();
    if fs::rename(&kept, failed).is_err() {
        let _ = fs::remove_dir_all(&kept);
        return error;
    }
    let message = match error {
        TrainError::Compile(m) => m,
        other => other.to_string(),
    };
    TrainError::Compile(format!(
        "{message}\n(the compile's spec, script and whole log: {})",
        failed.display()
    ))
}

/// Removes the entry in `dir`, which ddl wrote: refused if it holds any file ddl does not
/// write there.
fn remove_entry(dir: &Path) -> Result<()> {
    let listing = fs::read_dir(dir).map_err(|e| TrainError::io(dir, e))?;
    let mut files = Vec::new();
    for item in listing {
        let item = item.map_err(|e| TrainError::io(dir, e))?;
        let name = item.file_name().to_string_lossy().into_owned();
        let is_file = item.file_type().is_ok_and(|t| t.is_file());
        if !is_file || !entry::FILES.contains(&name.as_str()) {
            return Err(TrainError::Compile(format!(
                "{} holds {name}, which ddl-train does not write there: move the folder away \
                 (it is the compile cache's entry for this step)",
                dir.display()
            )));
        }
        files.push(item.path());
    }
    for f in files {
        fs::remove_file(&f).map_err(|e| TrainError::io(&f, e))?;
    }
    fs::remove_dir(dir).map_err(|e| TrainError::io(dir, e))
}
