//! `.safetensors` files of a [`StateDict`], through the `safetensors` crate (the format's own
//! Rust implementation): `safetensors.torch.load_file(path)` gives back the state dict and
//! `safe_open(path, "pt").metadata()` the metadata.
//!
//! Files are written as `FILE.tmp` and renamed once complete, so a crash never leaves a
//! half-written model under the final name. When the crate refuses a file, the header is read
//! once more to say which tensor is cut off or inconsistent, so that every error about a tensor
//! names its key.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::{self, File};
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensors, View};

use super::{Entry, StateDict, WeightsError};

impl View for &Entry {
    fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }

    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// Metadata of a safetensors file: string keys and string values.
pub type Metadata = HashMap<String, String>;

/// Why `path` cannot take a weights file, if it cannot: its directory must exist, and ddl
/// writes safetensors only, so a torch pickle name (`.pt`, `.pth`, `.bin`) is refused rather
/// than given a file torch.load cannot read.
pub fn check_destination(path: &Path) -> Result<(), String> {
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    if matches!(ext.as_deref(), Some("pt" | "pth" | "bin")) {
        return Err(format!(
            "{}: ddl writes .safetensors files only; write FILE.safetensors and, if a pickle is \
             needed, convert it with torch.save(safetensors.torch.load_file(FILE), \"{}\")",
            path.display(),
            path.display()
        ));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(format!(
            "{}: the directory {} does not exist",
            path.display(),
            dir.display()
        ));
    }
    if path.is_dir() {
        return Err(format!("{} is a directory", path.display()));
    }
    Ok(())
}

/// Writes `dict` and `metadata` to `path` (through `path.tmp`, fsynced and renamed).
pub fn write(path: &Path, dict: &StateDict, metadata: &Metadata) -> Result<(), WeightsError> {
    let tmp = PathBuf::from(format!("{}.tmp", path.display()));
    let io = |p: &Path, source| WeightsError::Io {
        path: p.to_path_buf(),
        source,
    };
    let written = safetensors::serialize_to_file(
        dict.tensors.iter().map(|(k, e)| (k.as_str(), e)),
        &Some(metadata.clone()),
        &tmp,
    )
    .map_err(|e| match e {
        safetensors::SafeTensorError::IoError(source) => io(&tmp, source),
        other => WeightsError::Format {
            path: path.to_path_buf(),
            message: other.to_string(),
        },
    })
    .and_then(|()| {
        File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(|e| io(&tmp, e))
    });
    if let Err(e) = written {
        // Ours and useless half-written.
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    fs::rename(&tmp, path).map_err(|e| io(path, e))
}

/// Reads the state dict and metadata of the file at `path`.
pub fn read(path: &Path) -> Result<(StateDict, Metadata), WeightsError> {
    let bytes = fs::read(path).map_err(|source| WeightsError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&bytes, path)
}

/// Parses the bytes of a safetensors file; `path` only names it in errors.
pub fn parse(bytes: &[u8], path: &Path) -> Result<(StateDict, Metadata), WeightsError> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| diagnose(bytes, path, &e))?;
    let (_, header) = SafeTensors::read_metadata(bytes).map_err(|e| diagnose(bytes, path, &e))?;
    let tensors = st
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let entry = Entry {
                dtype: view.dtype(),
                shape: view.shape().to_vec(),
                data: view.data().to_vec(),
            };
            (name, entry)
        })
        .collect();
    Ok((
        StateDict { tensors },
        header.metadata().clone().unwrap_or_default(),
    ))
}

/// Why the crate refused `bytes`, naming the tensor when one is at fault: reads the header
/// again and looks for the first tensor (in data order) that runs past the end of the file or
/// whose byte range does not match its shape and dtype.
fn diagnose(bytes: &[u8], path: &Path, err: &safetensors::SafeTensorError) -> WeightsError {
    let format = |message: String| WeightsError::Format {
        path: path.to_path_buf(),
        message,
    };
    let Some(len_bytes) = bytes.get(..8) else {
        return format(format!(
            "{} bytes, shorter than the 8-byte header length (truncated?)",
            bytes.len()
        ));
    };
    let header_len = u64::from_le_bytes(len_bytes.try_into().unwrap_or_default());
    let data_start = usize::try_from(header_len)
        .ok()
        .and_then(|n| n.checked_add(8))
        .filter(|&end| end <= bytes.len());
    let Some(data_start) = data_start else {
        return format(format!(
            "truncated inside its header ({header_len} header bytes announced, the file has {} \
             after the length)",
            bytes.len() - 8
        ));
    };
    let header: serde_json::Map<String, serde_json::Value> =
        match serde_json::from_slice(&bytes[8..data_start]) {
            Ok(h) => h,
            Err(e) => return format(format!("header is not a JSON object: {e}")),
        };
    let have = bytes.len() - data_start;
    let entries = match header_entries(&header, path) {
        Ok(entries) => entries,
        Err(e) => return e,
    };
    let expected_start = match check_entries(&entries, have, path) {
        Ok(end) => end,
        Err(e) => return e,
    };
    if expected_start != have {
        return format(format!(
            "{} bytes after the last tensor's data",
            have - expected_start
        ));
    }
    format(err.to_string())
}

/// A tensor of a header: its key, its byte range and the bytes its shape and dtype need.
type HeaderEntry<'a> = (&'a String, usize, usize, Option<usize>);

/// The tensors of a safetensors header (its metadata left out), in data order.
fn header_entries<'a>(
    header: &'a serde_json::Map<String, serde_json::Value>,
    path: &Path,
) -> Result<Vec<HeaderEntry<'a>>, WeightsError> {
    let mut entries: Vec<HeaderEntry<'a>> = Vec::new();
    for (key, info) in header.iter().filter(|(k, _)| k.as_str() != "__metadata__") {
        let offsets = info["data_offsets"].as_array().and_then(|a| {
            let s = a.first()?.as_u64()? as usize;
            let e = a.get(1)?.as_u64()? as usize;
            Some((s, e))
        });
        let Some((start, end)) = offsets else {
            return Err(WeightsError::BadEntry {
                path: path.to_path_buf(),
                key: key.clone(),
                message: "no valid data_offsets in the header".into(),
            });
        };
        let dtype: Option<Dtype> = serde_json::from_value(info["dtype"].clone()).ok();
        let shape: Option<Vec<usize>> = serde_json::from_value(info["shape"].clone()).ok();
        let needed = dtype
            .zip(shape)
            .and_then(|(d, s)| s.iter().try_fold(d.size(), |acc, &x| acc.checked_mul(x)));
        entries.push((key, start, end, needed));
    }
    entries.sort_by_key(|&(k, s, e, _)| (s, e, k.clone()));
    Ok(entries)
}

/// The first tensor whose data runs past the `have` data bytes, does not fit its shape and
/// dtype or does not follow the previous one; else where the last one ends.
fn check_entries(entries: &[HeaderEntry], have: usize, path: &Path) -> Result<usize, WeightsError> {
    let mut expected_start = 0;
    for &(key, start, end, needed) in entries {
        if end > have {
            return Err(WeightsError::Truncated {
                path: path.to_path_buf(),
                key: key.clone(),
                start,
                end,
                have,
            });
        }
        let bad = |message: String| WeightsError::BadEntry {
            path: path.to_path_buf(),
            key: key.clone(),
            message,
        };
        match needed {
            None => return Err(bad("unknown dtype or bad shape in the header".into())),
            Some(n) if end < start || end - start != n => {
                return Err(bad(format!(
                    "its shape and dtype need {n} bytes, its data_offsets span {start}..{end}"
                )))
            }
            Some(_) => {}
        }
        if start != expected_start {
            return Err(bad(format!(
                "its data starts at byte {start}, the previous tensor ends at {expected_start}"
            )));
        }
        expected_start = end;
    }
    Ok(expected_start)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> StateDict {
        let mut d = StateDict::default();
        d.tensors.insert(
            "conv1.weight".into(),
            Entry::f32(
                vec![2, 1, 2, 2],
                &[1.0, -2.0, 3.5, 0.0, 1e-8, 7.0, -0.0, 2.0],
            ),
        );
        d.tensors
            .insert("bn1.running_var".into(), Entry::f32(vec![2], &[1.0, 2.0]));
        d.tensors
            .insert("bn1.num_batches_tracked".into(), Entry::i64_scalar(42));
        d
    }

    #[test]
    fn round_trip_keeps_bits_and_metadata() {
        let dir = ddl_testkit::scratch("weights-file");
        let path = dir.path().join("m.safetensors");
        let meta: Metadata = [("model".to_string(), "resnet18".to_string())].into();
        write(&path, &sample(), &meta).unwrap();
        assert!(!dir.path().join("m.safetensors.tmp").exists());
        let (d, m) = read(&path).unwrap();
        assert_eq!(d, sample());
        assert_eq!(m, meta);
        assert_eq!(d.tensors["bn1.num_batches_tracked"].to_i64(), Some(42));
    }

    #[test]
    fn damaged_files_name_the_tensor() {
        let dir = ddl_testkit::scratch("weights-bad");
        let path = dir.path().join("m.safetensors");
        write(&path, &sample(), &Metadata::new()).unwrap();
        let bytes = fs::read(&path).unwrap();
        // Data order: I64 first (the crate sorts by dtype, widest alignment first), then F32 by
        // name: bn1.num_batches_tracked [0, 8), bn1.running_var [8, 16), conv1.weight [16, 48).
        let cut = bytes.len() - 4;
        let e = parse(&bytes[..cut], &path).unwrap_err().to_string();
        assert!(e.contains("truncated: tensor conv1.weight"), "{e}");
        let cut = bytes.len() - 36;
        let e = parse(&bytes[..cut], &path).unwrap_err().to_string();
        assert!(e.contains("truncated: tensor bn1.running_var"), "{e}");
        let e = parse(&bytes[..20], &path).unwrap_err().to_string();
        assert!(e.contains("truncated inside its header"), "{e}");
        let e = parse(&bytes[..5], &path).unwrap_err().to_string();
        assert!(e.contains("shorter than the 8-byte header length"), "{e}");
        let e = parse(b"\x02\0\0\0\0\0\0\0[]", &path)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a readable safetensors file"), "{e}");
        // A header entry whose shape does not match its byte range.
        let at = bytes
            .windows(9)
            .position(|w| w == b"[2,1,2,2]")
            .expect("conv1.weight's shape in the header");
        let mut swapped = bytes.clone();
        swapped[at + 7] = b'3';
        let e = parse(&swapped, &path).unwrap_err().to_string();
        assert!(
            e.contains("tensor conv1.weight: its shape and dtype need 48 bytes"),
            "{e}"
        );
        assert!(matches!(
            read(&dir.path().join("absent.safetensors")),
            Err(WeightsError::Io { .. })
        ));
    }

    #[test]
    fn destinations() {
        let dir = ddl_testkit::scratch("weights-dest");
        check_destination(&dir.path().join("m.safetensors")).unwrap();
        check_destination(Path::new("m.safetensors")).unwrap();
        let e = check_destination(&dir.path().join("m.pt")).unwrap_err();
        assert!(e.contains("torch.save"), "{e}");
        let e = check_destination(&dir.path().join("no/such/m.safetensors")).unwrap_err();
        assert!(e.contains("does not exist"), "{e}");
        assert!(check_destination(dir.path()).is_err());
    }
}
