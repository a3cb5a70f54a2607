//! Who owns the files of the output directory.
//!
//! The resume state (`.pack-state.json`) names the pack it belongs to (a fingerprint of the
//! input directory and every parameter that shapes the shards) and lists every file name that
//! pack writes or may have partially written (`manifest.json`, `pack-report.json`, each shard;
//! a `NAME.tmp` belongs to whoever owns `NAME`). The list is saved before the first byte is
//! written, so a crash at any point leaves only files the state covers.
//!
//! Rule: the packer removes or replaces a file only when its state lists it. Before it writes
//! anything, [`claim`] sorts the directory's entries into this pack's files, files of another
//! ddl pack (named in that pack's state or manifest, a valid shard, a ddl temporary file) and
//! unrelated files, and refuses a directory that holds another dataset or unrelated files
//! unless forced ([`super::PackOptions::force`]). Forced, the files of another ddl pack whose
//! names this pack writes are taken over (and then listed in the new state); unrelated files
//! are never touched, and nothing this pack does not write over is removed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::conflict::{Occupant, OutputConflict, PackedBy};
use super::identity::Identity;
use super::names::{REPORT_FILE, SPLITS, STATE_FILE};
use super::shard_plan::parse_shard_name;
use super::spec::PackSpec;
use crate::error::{LoaderError, Result};
use crate::manifest::{write_atomic, Manifest, MANIFEST_FILE};
use crate::shard::ShardReader;

/// Version of the state file layout ([`PackState::version`]); version-1 states (no owner, no
/// file list) are treated as another pack's.
const STATE_VERSION: u32 = 2;

/// A shard finished by a previous run, as recorded in the state file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DoneShard {
    pub plan: String,
    pub records: u64,
    pub bytes: u64,
    pub crc32c: u32,
    pub copied: u64,
    pub reencoded: u64,
    pub resized: u64,
    /// (input index in the split's sorted order, reason, detail).
    pub skipped: Vec<(u64, String, String)>,
}

/// `.pack-state.json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct PackState {
    pub version: u32,
    /// [`Identity::fingerprint`] of the pack that owns the directory (v1 in a state written
    /// before identity v2).
    #[serde(default)]
    pub pack: String,
    /// The option values of that pack, for messages (identity v2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<PackSpec>,
    /// That pack in the words of its flags (identity v1 only).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub describe: String,
    /// Every file name the pack writes or may have partially written.
    #[serde(default)]
    pub written: BTreeSet<String>,
    /// Shards finished, by file name.
    pub shards: BTreeMap<String, DoneShard>,
}

impl PackState {
    /// Whether the state lists `name` (or, for `X.tmp`, `X`) as written by its pack.
    fn owns(&self, name: &str) -> bool {
        self.written
            .contains(name.strip_suffix(".tmp").unwrap_or(name))
    }
}

/// What [`claim`] decided.
pub(crate) struct Claim {
    /// The state to continue: this pack's own (finished shards can be kept) or a fresh one.
    /// Already saved, listing every planned file.
    pub state: PackState,
    /// Entries of the directory this pack did not write and leaves untouched.
    pub left: Vec<String>,
    /// The directory's lock ([`lock`]), held until the pack ends.
    pub lock: std::fs::File,
}

/// Takes the lock of the output directory `out` (flock on the directory itself, released by
/// the kernel when the process ends), so that two packs never write into one directory at
/// once: the second is refused, naming the directory, instead of failing on the first's
/// renames.
fn lock(out: &Path) -> Result<std::fs::File> {
    use fs4::fs_std::FileExt;
    let dir = std::fs::File::open(out).map_err(|e| LoaderError::io("open directory", out, e))?;
    match dir.try_lock_exclusive() {
        Ok(true) => Ok(dir),
        Ok(false) => Err(LoaderError::OutputBusy {
            path: out.to_path_buf(),
        }),
        Err(e) => Err(LoaderError::io("lock directory", out, e)),
    }
}

/// Who an entry of the output directory belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Owner {
    /// Listed in this pack's state.
    ThisPack,
    /// Written by another ddl pack (the reason says how that is known).
    OtherPack,
    /// Anything else.
    Unrelated,
}

/// Whether `name` is a shard name ddl-pack writes (`train-00042.ddl`).
fn is_shard_name(name: &str) -> bool {
    parse_shard_name(name).is_some_and(|(split, _)| SPLITS.contains(&split))
}

/// The names ddl-pack gives its files, whichever pack wrote them.
fn is_ddl_name(name: &str) -> bool {
    [MANIFEST_FILE, REPORT_FILE, STATE_FILE].contains(&name) || is_shard_name(name)
}

/// Reads the state file of `out`, if there is one that parses.
fn load_state(out: &Path) -> Option<PackState> {
    let bytes = std::fs::read(out.join(STATE_FILE)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Writes the state file of `out` atomically.
pub(crate) fn save_state(out: &Path, state: &PackState) -> Result<()> {
    let path = out.join(STATE_FILE);
    let text = serde_json::to_vec(state).map_err(|source| LoaderError::Json {
        path: path.clone(),
        source,
    })?;
    write_atomic(&path, &text)
}

/// Entries of `out` (names, lossily decoded where not UTF-8, which makes them unrelated).
fn entries(out: &Path) -> Result<Vec<(String, bool)>> {
    let rd = std::fs::read_dir(out).map_err(|e| LoaderError::io("read directory", out, e))?;
    let mut v = Vec::new();
    for e in rd {
        let e = e.map_err(|e| LoaderError::io("read directory", out, e))?;
        let utf8 = e.file_name().to_str().is_some();
        v.push((e.file_name().to_string_lossy().into_owned(), utf8));
    }
    v.sort();
    Ok(v)
}

/// Sorts the entries of `out` by owner, given the state found there (if any) and whether it is
/// this pack's.
fn survey(out: &Path, found: Option<&PackState>, ours: bool) -> Result<Vec<(String, Owner)>> {
    let manifest = Manifest::load(out).ok();
    // Names another ddl pack's state or manifest lists as its own.
    let mut listed: BTreeSet<String> = BTreeSet::new();
    if let Some(s) = found.filter(|_| !ours) {
        listed.extend(s.written.iter().cloned());
        listed.extend(s.shards.keys().cloned());
        listed.insert(MANIFEST_FILE.into());
        listed.insert(REPORT_FILE.into());
    }
    if let Some(m) = &manifest {
        listed.extend(
            m.splits
                .values()
                .flat_map(|s| s.shards.iter().map(|i| i.file.clone())),
        );
        listed.insert(MANIFEST_FILE.into());
        listed.insert(REPORT_FILE.into());
    }
    let mut out_entries = Vec::new();
    for (name, utf8) in entries(out)? {
        let path = out.join(&name);
        let is_file = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file());
        let base = name.strip_suffix(".tmp").unwrap_or(&name);
        let owner = if !utf8 || !is_file {
            Owner::Unrelated
        } else if ours && (name == STATE_FILE || found.is_some_and(|s| s.owns(&name))) {
            Owner::ThisPack
        } else if name == STATE_FILE
            || listed.contains(base)
            || (name.ends_with(".tmp") && is_ddl_name(base))
            || (is_shard_name(&name) && ShardReader::open(&path).is_ok())
        {
            Owner::OtherPack
        } else {
            Owner::Unrelated
        };
        out_entries.push((name, owner));
    }
    Ok(out_entries)
}

/// What is in `out` besides this pack's files (for the refusal).
fn occupant(out: &Path, found: Option<&PackState>, foreign: &[(String, Owner)]) -> Occupant {
    let named = |owner: Owner| -> Vec<String> {
        foreign
            .iter()
            .filter(|(_, o)| *o == owner)
            .map(|(n, _)| n.clone())
            .collect()
    };
    let manifest = Manifest::load(out).ok().map(|m| {
        let shards: usize = m.splits.values().map(|s| s.shards.len()).sum();
        (m.classes.len(), shards)
    });
    let packed_by = found.map(|st| match (&st.options, st.describe.is_empty()) {
        (Some(o), _) => PackedBy::Options(o.clone()),
        (None, false) => PackedBy::Words(st.describe.clone()),
        (None, true) => PackedBy::OlderPacker,
    });
    Occupant {
        other_pack: named(Owner::OtherPack),
        manifest,
        packed_by,
        unrelated: named(Owner::Unrelated),
    }
}

/// The refusal of `out`, if this pack may not write there: a file in the way of a name it
/// writes (even when forced), or unforced, another pack's files it would write over (its own
/// directory) or anything at all (any other directory).
fn refusal(
    out: &Path,
    id: &Identity,
    found: Option<&PackState>,
    ours: bool,
    owners: &[(String, Owner)],
    planned: &BTreeSet<String>,
    force: bool,
) -> Option<LoaderError> {
    let foreign: Vec<(String, Owner)> = owners
        .iter()
        .filter(|(_, o)| *o != Owner::ThisPack)
        .cloned()
        .collect();
    let collides = |name: &str| planned.contains(name.strip_suffix(".tmp").unwrap_or(name));
    let conflict = if let Some((name, _)) = foreign
        .iter()
        .find(|(n, o)| *o == Owner::Unrelated && (collides(n) || n == STATE_FILE))
    {
        OutputConflict::InTheWay { name: name.clone() }
    } else {
        // A directory of this pack may hold other files (left alone) unless this pack would
        // write over one of another ddl pack; any other directory must be empty.
        let refuse = if ours {
            foreign
                .iter()
                .any(|(n, o)| *o == Owner::OtherPack && collides(n))
        } else {
            !foreign.is_empty()
        };
        if !refuse || force {
            return None;
        }
        OutputConflict::Occupied {
            occupant: Box::new(occupant(out, found.filter(|_| !ours), &foreign)),
            this_pack: Box::new(id.spec.clone()),
        }
    };
    Some(LoaderError::OutputInUse {
        path: out.to_path_buf(),
        conflict: Box::new(conflict),
    })
}

/// Removes what `state` allows of `owners` (temporary files of listed names, listed shards the
/// plan no longer has) and returns the entries this pack did not write, which stay.
fn clean(
    out: &Path,
    state: &mut PackState,
    owners: &[(String, Owner)],
    planned: &BTreeSet<String>,
) -> Result<Vec<String>> {
    let mut left = Vec::new();
    let mut gone = Vec::new();
    for (name, owner) in owners {
        if name == STATE_FILE {
            continue;
        }
        if !state.owns(name) {
            if *owner != Owner::ThisPack {
                left.push(name.clone());
            }
            continue;
        }
        let stale_shard = is_shard_name(name) && !planned.contains(name.as_str());
        if name.ends_with(".tmp") || stale_shard {
            remove(&out.join(name))?;
            if stale_shard {
                gone.push(name.clone());
            }
        }
    }
    if !gone.is_empty() {
        for g in &gone {
            state.written.remove(g);
            state.shards.remove(g);
        }
        save_state(out, state)?;
    }
    Ok(left)
}

/// Decides what this pack may do in `out` before anything is written there (see the module
/// documentation), saves the state that lists the planned `shards` (and the manifest and
/// report), and removes what that state allows: temporary files of listed names, listed shards
/// the plan no longer has, and the manifest (which must not describe shards about to change).
/// A state of this pack under its v1 fingerprint is continued and rewritten as v2.
pub(crate) fn claim(out: &Path, id: &Identity, shards: &[String], force: bool) -> Result<Claim> {
    let planned: BTreeSet<String> = shards
        .iter()
        .cloned()
        .chain([MANIFEST_FILE.to_string(), REPORT_FILE.to_string()])
        .collect();
    if out.exists() && !out.is_dir() {
        return Err(LoaderError::Input {
            path: out.to_path_buf(),
            reason: "the output exists and is not a directory; choose a directory".into(),
        });
    }
    std::fs::create_dir_all(out).map_err(|e| LoaderError::io("create directory", out, e))?;
    let lock = lock(out)?;
    let found = load_state(out);
    let ours = found
        .as_ref()
        .is_some_and(|s| s.version == STATE_VERSION && id.recognises(&s.pack));
    let owners = survey(out, found.as_ref(), ours)?;
    if let Some(e) = refusal(out, id, found.as_ref(), ours, &owners, &planned, force) {
        return Err(e);
    }
    let mut state = match found {
        Some(s) if ours => s,
        _ => PackState {
            version: STATE_VERSION,
            ..PackState::default()
        },
    };
    state.pack = id.fingerprint.clone();
    state.options = Some(id.spec.clone());
    state.describe.clear();
    // Taken over (when forced): the other pack's files that this pack writes over.
    state.written.extend(planned.iter().cloned());
    save_state(out, &state)?;

    let manifest = out.join(MANIFEST_FILE);
    if manifest.exists() {
        remove(&manifest)?;
    }
    let left = clean(out, &mut state, &owners, &planned)?;
    Ok(Claim { state, left, lock })
}

fn remove(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(LoaderError::io("remove", path, e)),
    }
}
