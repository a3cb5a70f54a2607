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
//! unless `--force`. With `--force` the files of another ddl pack whose names this pack writes
//! are taken over (and then listed in the new state); unrelated files are never touched, and
//! nothing this pack does not write over is removed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{parse_shard_name, Fnv, PackOptions, ShardCount, REPORT_FILE, SPLITS, STATE_FILE};
use crate::error::{LoaderError, Result};
use crate::manifest::{write_atomic, Manifest, MANIFEST_FILE};
use crate::shard::ShardReader;

/// Version of the state file layout ([`PackState::version`]); version-1 states (no owner, no
/// file list) are treated as another pack's.
const STATE_VERSION: u32 = 2;

/// How many names an error or a report line shows before "and N more".
const SHOWN_NAMES: usize = 5;

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
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PackState {
    pub version: u32,
    /// [`Identity::fingerprint`] of the pack that owns the directory.
    #[serde(default)]
    pub pack: String,
    /// [`Identity::describe`] of that pack, for messages.
    #[serde(default)]
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

/// What makes two runs the same pack: the input directory and every parameter that changes the
/// shards (not threads or the skip limit).
pub(crate) struct Identity {
    /// Stable fingerprint of all of it.
    pub fingerprint: String,
    /// The same in words.
    pub describe: String,
}

impl Identity {
    /// The identity of a pack with `opts` (the input must exist: [`super::source::discover`]
    /// has checked it).
    pub fn of(opts: &PackOptions) -> Identity {
        let input = opts
            .input
            .canonicalize()
            .unwrap_or_else(|_| opts.input.clone());
        let mut h = Fnv::new();
        h.bytes(b"ddl-pack identity v1");
        h.bytes(input.as_os_str().as_encoded_bytes());
        let shards = match opts.shards {
            ShardCount::Count(n) => format!("--shards {n}"),
            ShardCount::Size(b) => format!("--shard-size {b}B"),
        };
        h.bytes(shards.as_bytes());
        h.bytes(&opts.convert.max_short_side.to_le_bytes());
        h.bytes(&[opts.convert.quality, u8::from(opts.convert.reencode)]);
        h.bytes(&(opts.nodes as u64).to_le_bytes());
        for list in [&opts.classes, &opts.synsets] {
            // The lists' content shapes the labels; a file that cannot be read was refused by
            // discovery already.
            let text = list.as_ref().and_then(|p| std::fs::read(p).ok());
            h.bytes(text.as_deref().unwrap_or(b"-"));
        }
        // Hashed only when given, so that packs without them keep their earlier identity.
        let mut selection = String::new();
        if opts.min_per_class > 0 {
            selection.push_str(&format!(" --min-per-class {}", opts.min_per_class));
        }
        if opts.keep_empty_classes {
            selection.push_str(" --keep-empty-classes");
        }
        if let Some(vs) = &opts.val_split {
            selection.push_str(&format!(" {}", vs.describe()));
        }
        if !selection.is_empty() {
            h.bytes(selection.as_bytes());
        }
        let mut describe = format!(
            "{} with {shards} --max-short-side {} --quality {}{} --nodes {}",
            input.display(),
            opts.convert.max_short_side,
            opts.convert.quality,
            if opts.convert.reencode {
                " --reencode"
            } else {
                ""
            },
            opts.nodes
        );
        if let Some(c) = &opts.classes {
            describe.push_str(&format!(" --classes {}", c.display()));
        }
        describe.push_str(&selection);
        Identity {
            fingerprint: format!("{:016x}", h.0),
            describe,
        }
    }
}

/// What [`claim`] decided.
pub(crate) struct Claim {
    /// The state to continue: this pack's own (finished shards can be kept) or a fresh one.
    /// Already saved, listing every planned file.
    pub state: PackState,
    /// Entries of the directory this pack did not write and leaves untouched.
    pub left: Vec<String>,
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

/// `a, b, c and 4 more`.
fn show(names: &[String]) -> String {
    let mut s = names
        .iter()
        .take(SHOWN_NAMES)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN_NAMES {
        s.push_str(&format!(" and {} more", names.len() - SHOWN_NAMES));
    }
    s
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

/// What is in `out` besides this pack's files, in words (for the refusal).
fn describe_foreign(out: &Path, found: Option<&PackState>, foreign: &[(String, Owner)]) -> String {
    let ddl: Vec<String> = foreign
        .iter()
        .filter(|(_, o)| *o == Owner::OtherPack)
        .map(|(n, _)| n.clone())
        .collect();
    let other: Vec<String> = foreign
        .iter()
        .filter(|(_, o)| *o == Owner::Unrelated)
        .map(|(n, _)| n.clone())
        .collect();
    let mut parts = Vec::new();
    if !ddl.is_empty() {
        let mut s = String::from("another ddl dataset");
        if let Ok(m) = Manifest::load(out) {
            let shards: usize = m.splits.values().map(|s| s.shards.len()).sum();
            s.push_str(&format!(
                " (manifest.json: {} classes, {shards} shards)",
                m.classes.len()
            ));
        }
        match found {
            Some(st) if !st.describe.is_empty() => {
                s.push_str(&format!(", packed from {}", st.describe))
            }
            Some(_) => s.push_str(", packed by an older ddl-pack"),
            None => {}
        }
        s.push_str(&format!(": {} file(s): {}", ddl.len(), show(&ddl)));
        parts.push(s);
    }
    if !other.is_empty() {
        parts.push(format!(
            "{} file(s) ddl-pack did not write: {}",
            other.len(),
            show(&other)
        ));
    }
    parts.join("; and ")
}

/// Decides what this pack may do in `out` before anything is written there (see the module
/// documentation), saves the state that lists the planned `shards` (and the manifest and
/// report), and removes what that state allows: temporary files of listed names, listed shards
/// the plan no longer has, and the manifest (which must not describe shards about to change).
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
    let found = load_state(out);
    let ours = found
        .as_ref()
        .is_some_and(|s| s.version == STATE_VERSION && s.pack == id.fingerprint);
    let owners = survey(out, found.as_ref(), ours)?;
    let foreign: Vec<(String, Owner)> = owners
        .iter()
        .filter(|(_, o)| *o != Owner::ThisPack)
        .cloned()
        .collect();
    let collides = |name: &str| planned.contains(name.strip_suffix(".tmp").unwrap_or(name));
    if let Some((name, _)) = foreign
        .iter()
        .find(|(n, o)| *o == Owner::Unrelated && (collides(n) || n == STATE_FILE))
    {
        return Err(LoaderError::OutputInUse {
            path: out.to_path_buf(),
            what: format!(
                "{name} is in the way: this pack writes that name, and ddl-pack cannot tell \
                 it is a file of its own"
            ),
            hint: "move it away or choose another output directory (ddl-pack never \
                   replaces a file it did not write, even with --force)"
                .into(),
        });
    }
    // A directory of this pack may hold other files (left alone) unless this pack would write
    // over one of another ddl pack; any other directory must be empty.
    let refuse = if ours {
        foreign
            .iter()
            .any(|(n, o)| *o == Owner::OtherPack && collides(n))
    } else {
        !foreign.is_empty()
    };
    if refuse && !force {
        return Err(LoaderError::OutputInUse {
            path: out.to_path_buf(),
            what: format!(
                "holds {}",
                describe_foreign(out, found.as_ref().filter(|_| !ours), &foreign)
            ),
            hint: format!(
                "choose an empty or new output directory, or pass --force to replace the \
                 files of the other ddl pack that this pack writes ({}); files ddl-pack did \
                 not write are never touched",
                id.describe
            ),
        });
    }
    let mut state = match found {
        Some(s) if ours => s,
        _ => PackState {
            version: STATE_VERSION,
            pack: id.fingerprint.clone(),
            describe: id.describe.clone(),
            written: BTreeSet::new(),
            shards: BTreeMap::new(),
        },
    };
    // Taken over (with --force): the other pack's files that this pack writes over.
    state.written.extend(planned.iter().cloned());
    save_state(out, &state)?;

    let manifest = out.join(MANIFEST_FILE);
    if manifest.exists() {
        remove(&manifest)?;
    }
    let mut left = Vec::new();
    let mut gone = Vec::new();
    for (name, owner) in &owners {
        if name == STATE_FILE {
            continue;
        }
        let listed = state.owns(name);
        if !listed {
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
        save_state(out, &state)?;
    }
    Ok(Claim { state, left })
}

fn remove(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(LoaderError::io("remove", path, e)),
    }
}
