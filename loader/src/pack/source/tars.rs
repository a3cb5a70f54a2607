//! Tars, indexed and never extracted: per-synset tars (`<wnid>.tar`, images inside), outer
//! tars of them (`ILSVRC2012_img_train.tar`, `fall11_whole.tar`), flat image tars (ImageNet's
//! `ILSVRC2012_img_val.tar` and test tar) and WebDataset shards, told apart by their members.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use super::inputs::Loc;
use super::listing::{input_err, is_image_name};
use super::scan::{Found, Scan};
use crate::error::{LoaderError, Result};

/// A window `[base, base + len)` of a file, readable and seekable (for the tar crate).
struct Region<'a> {
    file: &'a File,
    base: u64,
    len: u64,
    pos: u64,
}

impl Read for Region<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.len.saturating_sub(self.pos);
        let n = (buf.len() as u64).min(left) as usize;
        if n == 0 {
            return Ok(0);
        }
        let got = self.file.read_at(&mut buf[..n], self.base + self.pos)?;
        self.pos += got as u64;
        Ok(got)
    }
}

impl Seek for Region<'_> {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        let new = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
            SeekFrom::End(d) => self.len.checked_add_signed(d),
        };
        self.pos = new.ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "seek before start")
        })?;
        Ok(self.pos)
    }
}

/// One regular-file member of a tar.
#[derive(Clone, Debug)]
pub(super) struct Member {
    /// Its path inside the tar.
    pub name: String,
    /// Absolute offset of its data in the tar file.
    pub offset: u64,
    /// Its size in bytes.
    pub size: u64,
}

impl Member {
    /// The last `/`-separated part of its path.
    pub fn file_name(&self) -> &str {
        self.name.rsplit('/').next().unwrap_or(&self.name)
    }
}

/// Lists the regular-file members of the tar stored at `[base, base + len)` of `file`.
fn tar_members(file: &File, base: u64, len: u64, what: &Path) -> Result<Vec<Member>> {
    let mut magic = [0u8; 2];
    if len >= 2 && file.read_exact_at(&mut magic, base).is_ok() && magic == [0x1f, 0x8b] {
        return Err(input_err(
            what,
            "is gzip-compressed; ddl-pack reads uncompressed tars (gunzip it first)",
        ));
    }
    let region = Region {
        file,
        base,
        len,
        pos: 0,
    };
    let bad = |e: std::io::Error| input_err(what, format!("unreadable tar: {e}"));
    let mut archive = tar::Archive::new(region);
    let mut out = Vec::new();
    for entry in archive.entries_with_seek().map_err(bad)? {
        let entry = entry.map_err(bad)?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        out.push(Member {
            name: String::from_utf8_lossy(&entry.path_bytes()).into_owned(),
            offset: base + entry.raw_file_position(),
            size: entry.size(),
        });
    }
    Ok(out)
}

/// Whether `s` is a WordNet id as ImageNet names its synsets: `n` and eight digits.
pub(super) fn is_wnid(s: &str) -> bool {
    s.len() == 9 && s.starts_with('n') && s[1..].bytes().all(|b| b.is_ascii_digit())
}

/// The wnid a per-synset tar's file name states (`dir/n01440764.tar` -> `n01440764`).
pub(super) fn wnid_of_tar(name: &str) -> Option<&str> {
    let file = name.rsplit('/').next()?;
    file.strip_suffix(".tar").filter(|w| is_wnid(w))
}

/// What a tar holds, told by its members.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum TarKind {
    /// Per-synset tars (an outer tar).
    Outer,
    /// WebDataset samples: a `KEY.cls` beside `KEY.jpg`.
    WebDataset,
    /// ImageNet's validation images, flat (`ILSVRC2012_val_00000001.JPEG`, ...).
    Val,
    /// Test images (ImageNet's flat test tar, a test shard): no labels exist for them.
    Test,
    /// Images whose tar name is a wnid: one synset.
    Synset,
    /// Images with no label source (neither named as a synset nor as ImageNet's val or test).
    Unlabelled,
    /// No image and no tar inside.
    Empty,
}

/// An indexed tar file.
pub(super) struct Tar {
    /// The tar file.
    pub path: PathBuf,
    /// Its regular-file members, in tar order.
    pub members: Vec<Member>,
}

impl Tar {
    /// Indexes the tar at `path` (headers only).
    pub fn open(path: &Path) -> Result<Tar> {
        let file = File::open(path).map_err(|e| LoaderError::io("open", path, e))?;
        let len = file
            .metadata()
            .map_err(|e| LoaderError::io("stat", path, e))?
            .len();
        let members = tar_members(&file, 0, len, path)?;
        Ok(Tar {
            path: path.to_path_buf(),
            members,
        })
    }

    /// Indexes every tar of `paths` in parallel (their headers are small reads spread over
    /// large files), in the order given.
    pub fn open_all(paths: &[PathBuf]) -> Result<Vec<Tar>> {
        paths.par_iter().map(|p| Tar::open(p)).collect()
    }

    /// The tar's file name.
    pub fn file_name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// What it holds.
    pub fn kind(&self) -> TarKind {
        let images: Vec<&str> = self
            .members
            .iter()
            .map(Member::file_name)
            .filter(|n| is_image_name(n))
            .collect();
        if self.members.iter().any(|m| m.name.ends_with(".tar")) {
            TarKind::Outer
        } else if self.members.iter().any(|m| m.name.ends_with(".cls")) {
            TarKind::WebDataset
        } else if wnid_of_tar(&self.file_name()).is_some() {
            // An empty one too: a class without images, which the class check reports.
            TarKind::Synset
        } else if images.is_empty() {
            TarKind::Empty
        } else if images.iter().any(|n| flat_number(n, "_val_").is_some()) {
            TarKind::Val
        } else if images.iter().any(|n| flat_number(n, "_test_").is_some())
            || self.file_name().split(['-', '_', '.']).any(|w| w == "test")
        {
            TarKind::Test
        } else {
            TarKind::Unlabelled
        }
    }
}

/// The image number of ImageNet's flat val or test file names (`ILSVRC2012_val_00000042.JPEG`
/// -> 42, with `infix` `"_val_"`).
pub(super) fn flat_number(file_name: &str, infix: &str) -> Option<u64> {
    let stem = file_name.rsplit_once('.').map_or(file_name, |(s, _)| s);
    let (_, digits) = stem.rsplit_once(infix)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Adds the image members of one synset (`archive` already registered in `scan`), listing
/// the others as ignored.
fn add_synset_members(
    found: &mut Vec<Found>,
    scan: &mut Scan,
    class: u32,
    archive: u32,
    prefix: &str,
    members: Vec<Member>,
) {
    for m in members {
        let full = format!("{prefix}{}", m.name);
        if !is_image_name(&m.name) {
            let at = format!("{}:{full}", scan.archives[archive as usize].display());
            scan.ignore(at, "not an image file name");
            continue;
        }
        found.push(Found {
            label: class,
            name: full,
            size: m.size,
            loc: Loc::Archive {
                archive,
                offset: m.offset,
            },
        });
    }
}

/// Which training source claimed each class, so that no class is read from two (the same
/// images twice, as an outer tar beside its extracted per-synset tars would give).
#[derive(Default)]
pub(super) struct Claims(HashMap<String, String>);

impl Claims {
    /// Claims `wnid` for `source`; fails naming both sources when another has it.
    pub fn claim(&mut self, wnid: &str, source: &str) -> Result<()> {
        if let Some(first) = self.0.get(wnid) {
            return Err(input_err(
                Path::new(source),
                format!(
                    "holds class {wnid}, which {first} holds too: the same images would be \
                     packed twice; keep one of them"
                ),
            ));
        }
        self.0.insert(wnid.to_string(), source.to_string());
        Ok(())
    }

    /// The source that holds `wnid`, if one does.
    pub fn holder(&self, wnid: &str) -> Option<&str> {
        self.0.get(wnid).map(String::as_str)
    }
}

/// The training inputs of a per-synset tar.
pub(super) fn scan_synset(tar: Tar, scan: &mut Scan, claims: &mut Claims) -> Result<Vec<Found>> {
    let name = tar.file_name();
    let wnid = wnid_of_tar(&name).expect("a synset tar is named by its wnid");
    claims.claim(wnid, &tar.path.display().to_string())?;
    let class = scan.wnid_id(wnid);
    let archive = scan.archive(&tar.path);
    let mut found = Vec::new();
    add_synset_members(&mut found, scan, class, archive, "", tar.members);
    Ok(found)
}

/// The training inputs of an outer tar of per-synset tars; its inner tars are indexed in
/// parallel. A member that is not a tar is listed as ignored; an inner tar whose name is not
/// a wnid is refused (its images' class would be a guess).
pub(super) fn scan_outer(tar: Tar, scan: &mut Scan, claims: &mut Claims) -> Result<Vec<Found>> {
    let file = File::open(&tar.path).map_err(|e| LoaderError::io("open", &tar.path, e))?;
    let archive = scan.archive(&tar.path);
    let mut inner = Vec::new();
    for m in tar.members {
        if !m.name.ends_with(".tar") {
            scan.ignore(
                format!("{}:{}", tar.path.display(), m.name),
                "not a per-synset tar inside an outer tar",
            );
            continue;
        }
        let at = format!("{}:{}", tar.path.display(), m.name);
        let Some(wnid) = wnid_of_tar(&m.name).map(str::to_string) else {
            return Err(input_err(
                Path::new(&at),
                "is a tar inside an outer tar whose name is not a WordNet id (like \
                 n01440764.tar): ddl-pack cannot tell its images' class",
            ));
        };
        claims.claim(&wnid, &at)?;
        inner.push((m, wnid, at));
    }
    let listed: Vec<Result<Vec<Member>>> = inner
        .par_iter()
        .map(|(m, _, at)| tar_members(&file, m.offset, m.size, Path::new(at)))
        .collect();
    let mut found = Vec::new();
    for ((m, wnid, _), members) in inner.into_iter().zip(listed) {
        let class = scan.wnid_id(&wnid);
        let prefix = format!("{}/", m.name);
        add_synset_members(&mut found, scan, class, archive, &prefix, members?);
    }
    Ok(found)
}
