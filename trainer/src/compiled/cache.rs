//! The compile cache: a folder of entries ([`super::entry`]), one per key. An entry is
//! compiled into a temporary folder beside it and renamed into place once sealed, under a
//! lock per key, so that the ranks of a node (or two jobs) compile a key once and never see
//! half an entry. An entry is sealed, and a cached one used, only once libtorch's loader in
//! this process has loaded its package (and the compile's check against eager passed); a
//! cached entry that does not load is compiled again. The compile runs in a process that dies
//! with this one ([`compile`]); the temporary folders of compiles whose process died are
//! removed by the next compile in the cache. A cache this process cannot write is used for
//! the entries it holds.

use std::fs;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use fs4::fs_std::FileExt;
use tch::Device;

use super::entry::{self, Entry, Unusable};
use super::package::StepPackage;
use super::python::Python;
use super::step::{StepKey, StepSpec, GRAPH_SOURCES, SCRIPT};
use crate::config::Setting;
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
    let name = key.dir_name();
    let dir = cache.join(&name);
    let lock_path = cache.join(format!("{name}.lock"));
    let _lock = match lock(cache, &lock_path, &dir, progress) {
        Ok(lock) => lock,
        Err(e) if unwritable(&e) => return read_only(cache, &dir, key, spec, &e, progress),
        Err(e) => return Err(TrainError::io(&lock_path, e)),
    };
    remove_leftovers(cache, &name);
    match usable(&dir, key, spec.device) {
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
    build(cache, &name, key, python, spec, progress)
}

/// Compiles the entry `name` of `key` into a temporary folder of `cache`, checks that it
/// loads, seals it and moves it into place; a failed compile's folder is kept beside it.
fn build(
    cache: &Path,
    name: &str,
    key: &StepKey,
    python: &Python,
    spec: &StepSpec,
    progress: &mut dyn FnMut(&str),
) -> Result<Entry> {
    let dir = cache.join(name);
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
    let sealed = compile(tmp.path(), python, &spec.script_spec(key))
        .and_then(|()| entry::seal(tmp.path(), key))
        .and_then(|built| {
            loads(&built, spec.device).map_err(|why| {
                TrainError::Compile(format!("the compiled package {why}; nothing was cached"))
            })
        });
    if let Err(e) = sealed {
        return Err(keep_failed(tmp, &cache.join(format!("{name}.failed")), e));
    }
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

/// Creates `cache` and takes the lock of one of its keys (`lock_path`, of the entry `dir`),
/// waiting for a process that holds it (saying so).
fn lock(
    cache: &Path,
    lock_path: &Path,
    dir: &Path,
    progress: &mut dyn FnMut(&str),
) -> std::io::Result<fs::File> {
    fs::create_dir_all(cache)?;
    let lock = fs::File::create(lock_path)?;
    if !lock.try_lock_exclusive()? {
        progress(&format!(
            "compile: waiting for another process compiling {}",
            dir.display()
        ));
        lock.lock_exclusive()?;
    }
    Ok(lock)
}

/// Whether `e` says that this process may not write there (permissions, a read-only file
/// system).
fn unwritable(e: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        e.kind(),
        ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem
    )
}

/// The entry `dir` of a cache this process cannot write (`why`), if it is whole and loads; else
/// an error naming the cache and `compile_cache`.
fn read_only(
    cache: &Path,
    dir: &Path,
    key: &StepKey,
    spec: &StepSpec,
    why: &std::io::Error,
    progress: &mut dyn FnMut(&str),
) -> Result<Entry> {
    let unusable = match usable(dir, key, spec.device) {
        Ok(entry) => {
            progress(&format!(
                "compile: {} from the cache ({}, which this process cannot write: {why})",
                spec.describe(key),
                dir.display()
            ));
            return Ok(entry);
        }
        Err(Unusable::Missing) => "it holds no entry for this step".to_string(),
        Err(Unusable::Bad(e)) => format!("its entry for this step cannot be used: {e}"),
    };
    Err(TrainError::config(
        Setting::CompileCache,
        format!(
            "the compile cache {} cannot be written ({why}) and {unusable}: give a compile \
             cache this process can write (the step is compiled there once)",
            cache.display()
        ),
    ))
}

/// The entry in `dir` if it is a finished one for `key`, whole, and its package loads for
/// `device`.
fn usable(dir: &Path, key: &StepKey, device: Device) -> std::result::Result<Entry, Unusable> {
    let entry = entry::open(dir, key)?;
    loads(&entry, device).map_err(Unusable::Bad)?;
    Ok(entry)
}

/// Whether libtorch's loader in this process loads `entry`'s package for `device`: why not.
fn loads(entry: &Entry, device: Device) -> std::result::Result<(), String> {
    StepPackage::load(&entry.package(), entry.described.clone(), device)
        .map(drop)
        .map_err(|e| format!("does not load ({e})"))
}

/// Removes the temporary folders (`.NAME.XXXXXX`) of compiles whose process died: of the key
/// `name`, whose lock this process holds, and of every other key whose lock it can take.
fn remove_leftovers(cache: &Path, ours: &str) {
    let Ok(listing) = fs::read_dir(cache) else {
        return;
    };
    for item in listing.flatten() {
        let file = item.file_name().to_string_lossy().into_owned();
        let Some((name, _)) = file.strip_prefix('.').and_then(|f| f.rsplit_once('.')) else {
            continue;
        };
        let is_dir = item.file_type().is_ok_and(|t| t.is_dir());
        let lock = cache.join(format!("{name}.lock"));
        if !is_dir || !lock.is_file() {
            continue;
        }
        let dead = name == ours
            || fs::File::open(&lock)
                .and_then(|f| f.try_lock_exclusive())
                .unwrap_or(false);
        if dead {
            let _ = fs::remove_dir_all(item.path());
        }
    }
}

/// Runs the compile script in `dir` (spec.json, step.py, the graph library's sources and
/// compile.log go there too), in a process the kernel kills when this one ends however it
/// ends (`kill -9` included), as the script's own helpers are.
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
    let parent = std::process::id();
    let mut command = Command::new(&python.exe);
    command
        .arg(dir.join("step.py"))
        .arg(dir.join("spec.json"))
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err);
    // SAFETY: between fork and exec the child makes two system calls (async-signal-safe).
    unsafe {
        command.pre_exec(move || die_with(parent));
    }
    let status = command.status().map_err(|e| {
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

/// In a child just forked from `parent`: asks the kernel to kill it when the thread that
/// forked it ends, or fails if `parent` has already gone.
fn die_with(parent: u32) -> std::io::Result<()> {
    // SAFETY: prctl with an integer argument and getppid touch no memory.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if unsafe { libc::getppid() } as u32 != parent {
        return Err(std::io::Error::other(
            "ddl-train ended before its compile started",
        ));
    }
    Ok(())
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
