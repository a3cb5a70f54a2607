//! Tars, indexed and never extracted: per-synset tars (`<wnid>.tar`, images inside), outer
//! tars of them (`ILSVRC2012_img_train.tar`, `winter21_whole.tar.gz`), flat image tars
//! (ImageNet's `ILSVRC2012_img_val.tar` and test tar, Hugging Face's tars of images named by
//! their wnid) and WebDataset shards, told apart by their members. An uncompressed tar is
//! indexed by its headers alone; a gzip-compressed one in one pass over its stream, its inner
//! tars with it (read later through `gzip.rs`).

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use super::gzip;
use super::inputs::Loc;
use super::listing::{input_err, is_image_name, is_wnid, name_wnid};
use super::scan::{Found, Scan};
use crate::error::{LoaderError, Result};
use crate::pack::progress::PackProgress;

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
    /// A tar member's own members, listed with it when the tar is gzip-compressed (read once);
    /// empty otherwise.
    pub inner: Vec<Member>,
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
    if len >= 2 && file.read_exact_at(&mut magic, base).is_ok() && gzip::is_gzip(&magic) {
        return Err(input_err(
            what,
            "is a gzip-compressed tar inside a tar; ddl-pack reads those only as files of \
             their own (gunzip it first)",
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
    listed(archive.entries_with_seek().map_err(bad)?, base, len).map_err(bad)
}

/// The regular-file members `entries` lists, their data offsets plus `base`. A tar of `len`
/// bytes must hold its end-of-archive block after its last entry: without it, a tar cut at an
/// entry's end (an interrupted copy) would list as whole, its later members left out.
fn listed<R: Read>(
    entries: tar::Entries<'_, R>,
    base: u64,
    len: u64,
) -> std::io::Result<Vec<Member>> {
    let (mut out, mut end) = (Vec::new(), 0);
    for entry in entries {
        let entry = entry?;
        end = entry.raw_file_position() + entry.size().div_ceil(512) * 512;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        out.push(Member {
            name: String::from_utf8_lossy(&entry.path_bytes()).into_owned(),
            offset: base + entry.raw_file_position(),
            size: entry.size(),
            inner: Vec::new(),
        });
    }
    if len < end + 512 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!(
                "it ends at byte {len}, without the end-of-archive block after its last \
                 member: a tar cut short (an interrupted download or copy)"
            ),
        ));
    }
    Ok(out)
}

/// Lists the regular-file members of the gzip-compressed tar at `path`; a member that is itself
/// a tar (a per-synset tar of an outer tar) has its own members listed in [`Member::inner`],
/// since the stream is read only once. Offsets are in the decompressed stream.
fn gzip_members(path: &Path) -> Result<Vec<Member>> {
    let bad = |e: std::io::Error| {
        input_err(
            path,
            format!("unreadable gzip-compressed tar: {e} (a download cut short or damaged?)"),
        )
    };
    let stream = gzip::open(path).map_err(|e| LoaderError::io("open", path, e))?;
    let mut archive = tar::Archive::new(stream);
    let mut out = Vec::new();
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let offset = entry.raw_file_position();
        let size = entry.size();
        let inner = match name.ends_with(".tar") {
            true => {
                let mut tar = tar::Archive::new(&mut entry);
                tar.entries()
                    .and_then(|entries| listed(entries, offset, size))
                    .map_err(|e| {
                        input_err(
                            Path::new(&format!("{}:{name}", path.display())),
                            format!("unreadable tar: {e} (a gzip download cut short or damaged?)"),
                        )
                    })?
            }
            false => Vec::new(),
        };
        out.push(Member {
            name,
            offset,
            size,
            inner,
        });
    }
    Ok(out)
}

/// Whether a file's name is that of a tar: `.tar`, or gzip-compressed `.tar.gz` / `.tgz`.
pub(super) fn is_tar_name(name: &str) -> bool {
    [".tar", ".tar.gz", ".tgz"]
        .iter()
        .any(|ext| name.ends_with(ext))
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
    /// Training images whose names end in their wnid (`named.rs`).
    NamedTrain,
    /// Validation images whose names end in their wnid (`named.rs`).
    NamedVal,
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
    /// Whether it is gzip-compressed: its members' offsets are in the decompressed stream.
    pub gzip: bool,
}

impl Tar {
    /// Indexes the tar at `path`: headers only, or, when it is gzip-compressed, all of it
    /// (told to `progress` first).
    pub fn open(path: &Path, progress: Option<&dyn PackProgress>) -> Result<Tar> {
        let file = File::open(path).map_err(|e| LoaderError::io("open", path, e))?;
        let len = file
            .metadata()
            .map_err(|e| LoaderError::io("stat", path, e))?
            .len();
        let mut magic = [0u8; 2];
        let gzip = len >= 2 && file.read_exact_at(&mut magic, 0).is_ok() && gzip::is_gzip(&magic);
        if let Some(p) = progress.filter(|_| gzip) {
            p.listing(path, len, "a gzip-compressed tar");
        }
        let members = match gzip {
            true => gzip_members(path)?,
            false => tar_members(&file, 0, len, path)?,
        };
        Ok(Tar {
            path: path.to_path_buf(),
            members,
            gzip,
        })
    }

    /// Where member data at `offset` is, in `archive` (this tar's index in the scan).
    pub fn loc(&self, archive: u32, offset: u64) -> Loc {
        match self.gzip {
            true => Loc::Gzip { archive, offset },
            false => Loc::Archive { archive, offset },
        }
    }

    /// Indexes every tar of `paths` in parallel (their headers are small reads spread over
    /// large files), in the order given.
    pub fn open_all(paths: &[PathBuf], progress: Option<&dyn PackProgress>) -> Result<Vec<Tar>> {
        paths.par_iter().map(|p| Tar::open(p, progress)).collect()
    }

    /// The tar's file name.
    pub fn file_name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// Whether every image of it is named by its wnid, and there is one.
    fn all_named(&self) -> bool {
        let mut images = self
            .members
            .iter()
            .map(Member::file_name)
            .filter(|n| is_image_name(n))
            .peekable();
        images.peek().is_some() && images.all(|n| name_wnid(n).is_some())
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
        } else if self.all_named() {
            match images.iter().any(|n| n.contains("_val_")) {
                true => TarKind::NamedVal,
                false => TarKind::NamedTrain,
            }
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

/// Adds the image members of one synset (in `tar`, registered in `scan` as `archive`), listing
/// the others as ignored.
fn add_synset_members(
    found: &mut Vec<Found>,
    scan: &mut Scan,
    class: u32,
    (tar, archive): (&Tar, u32),
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
            loc: tar.loc(archive, m.offset),
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
pub(super) fn scan_synset(
    mut tar: Tar,
    scan: &mut Scan,
    claims: &mut Claims,
) -> Result<Vec<Found>> {
    let name = tar.file_name();
    let wnid = wnid_of_tar(&name).expect("a synset tar is named by its wnid");
    claims.claim(wnid, &tar.path.display().to_string())?;
    let class = scan.wnid_id(wnid);
    let archive = scan.archive(&tar.path);
    let mut found = Vec::new();
    let members = std::mem::take(&mut tar.members);
    add_synset_members(&mut found, scan, class, (&tar, archive), "", members);
    Ok(found)
}

/// The training inputs of an outer tar of per-synset tars; its inner tars are indexed in
/// parallel. A member that is not a tar is listed as ignored; an inner tar whose name is not
/// a wnid is refused (its images' class would be a guess).
pub(super) fn scan_outer(mut tar: Tar, scan: &mut Scan, claims: &mut Claims) -> Result<Vec<Found>> {
    let file = File::open(&tar.path).map_err(|e| LoaderError::io("open", &tar.path, e))?;
    let archive = scan.archive(&tar.path);
    let mut inner = Vec::new();
    for m in std::mem::take(&mut tar.members) {
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
    // A gzip-compressed outer tar's inner tars were listed with it.
    let listed: Vec<Result<Vec<Member>>> = inner
        .par_iter_mut()
        .map(|(m, _, at)| match tar.gzip {
            true => Ok(std::mem::take(&mut m.inner)),
            false => tar_members(&file, m.offset, m.size, Path::new(at)),
        })
        .collect();
    let mut found = Vec::new();
    for ((m, wnid, _), members) in inner.into_iter().zip(listed) {
        let class = scan.wnid_id(&wnid);
        let prefix = format!("{}/", m.name);
        add_synset_members(&mut found, scan, class, (&tar, archive), &prefix, members?);
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::path::PathBuf;

    use super::gzip::Readers;
    use super::*;

    /// `bytes` gzip-compressed in two gzip members, as pigz and bgzip write.
    fn gz_in_two(bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for half in [&bytes[..bytes.len() / 2], &bytes[bytes.len() / 2..]] {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(half).unwrap();
            out.extend(gz.finish().unwrap());
        }
        out
    }

    /// The members, in their order: a file, a per-synset tar of two images, another file.
    fn written(dir: &Path) -> (PathBuf, Vec<Vec<u8>>) {
        let data: Vec<Vec<u8>> = (0..4u8).map(|i| vec![i; 700 + 300 * i as usize]).collect();
        let inner = ddl_testkit::tar_of(&[
            ("n1_a.JPEG".into(), data[1].clone()),
            ("n1_b.JPEG".into(), data[2].clone()),
        ]);
        let outer = ddl_testkit::tar_of(&[
            ("notes.txt".into(), data[0].clone()),
            ("w/n01440764.tar".into(), inner),
            ("last.JPEG".into(), data[3].clone()),
        ]);
        let path = dir.join("whole.tar.gz");
        std::fs::write(&path, gz_in_two(&outer)).unwrap();
        (path, data)
    }

    /// Where each member's data is, in the order of `written`'s data.
    fn places(members: &[Member]) -> Vec<(u64, u64)> {
        let inner = &members[1].inner;
        [&members[0], &inner[0], &inner[1], &members[2]]
            .iter()
            .map(|m| (m.offset, m.size))
            .collect()
    }

    #[test]
    fn members_are_listed_with_their_tars_members_and_read_in_any_order() {
        let dir = ddl_testkit::scratch("gzip-list");
        let (path, data) = written(dir.path());
        let members = gzip_members(&path).unwrap();
        let names: Vec<&str> = members.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["notes.txt", "w/n01440764.tar", "last.JPEG"]);
        let inner: Vec<&str> = members[1].inner.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(inner, ["n1_a.JPEG", "n1_b.JPEG"]);
        let at = places(&members);
        let readers = Readers::default();
        // In order, in one pass; then backwards and one twice, each a new pass.
        let read: Vec<Vec<u8>> = readers
            .read(0, &path, &at)
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(read, data);
        for i in [3, 1, 1, 0, 2] {
            let got = readers.read(0, &path, &at[i..=i]).pop().unwrap().unwrap();
            assert_eq!(got, data[i], "member {i}");
        }
    }

    #[test]
    fn a_stream_that_fails_fails_every_later_read_at_once() {
        let dir = ddl_testkit::scratch("gzip-fails");
        let (path, data) = written(dir.path());
        let at = places(&gzip_members(&path).unwrap());
        // The file is cut short after it was listed: the first member still reads.
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 200]).unwrap();
        let readers = Readers::default();
        assert_eq!(
            readers.read(0, &path, &at[..1]).pop().unwrap().unwrap(),
            data[0]
        );
        let e = readers.read(0, &path, &at[3..]).pop().unwrap().unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}");
        let e = readers.read(0, &path, &at[3..]).pop().unwrap().unwrap_err();
        assert!(e.to_string().contains("failed at the member"), "{e}");
        assert_eq!(
            readers.read(0, &path, &at[..1]).pop().unwrap().unwrap(),
            data[0]
        );
        assert!(gzip_members(&path)
            .unwrap_err()
            .to_string()
            .contains("cut short"));
    }
}
