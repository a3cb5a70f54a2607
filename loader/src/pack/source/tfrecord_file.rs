//! The TFRecord file format as ddl-pack reads it: records of a length, its masked CRC-32C, the
//! data and its masked CRC-32C (TensorFlow's `record_writer.cc`), each a `tf.train.Example`
//! (`feature.proto`) decoded by prost. A file is listed in one read ([`records`]); a record is
//! read again on its own at its offset ([`read_image`]), its data's CRC checked again.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::Path;

use prost::Message;

use crate::error::{LoaderError, Result};

/// The features that hold the image, its class number, its wnid and its file name, in the
/// order they are looked for (the TPU reference's names, then TensorFlow Datasets').
const IMAGE: [&str; 2] = ["image/encoded", "image"];
const NUMBER: [&str; 2] = ["image/class/label", "label"];
const SYNSET: &str = "image/class/synset";
const NAME: [&str; 2] = ["image/filename", "file_name"];

/// `tf.train.Example`: a map of named features.
#[derive(Clone, PartialEq, Message)]
struct Example {
    #[prost(message, optional, tag = "1")]
    features: Option<Features>,
}

#[derive(Clone, PartialEq, Message)]
struct Features {
    #[prost(map = "string, message", tag = "1")]
    feature: HashMap<String, Feature>,
}

/// One feature: a list of byte strings or of integers (float lists are not read).
#[derive(Clone, PartialEq, Message)]
struct Feature {
    #[prost(oneof = "Values", tags = "1, 3")]
    values: Option<Values>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum Values {
    #[prost(message, tag = "1")]
    Bytes(BytesList),
    #[prost(message, tag = "3")]
    Int64(Int64List),
}

#[derive(Clone, PartialEq, Message)]
struct BytesList {
    #[prost(bytes = "vec", repeated, tag = "1")]
    value: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, Message)]
struct Int64List {
    #[prost(int64, repeated, tag = "1")]
    value: Vec<i64>,
}

impl Example {
    /// The single byte string of the first of `keys` present.
    fn bytes(&mut self, keys: &[&str]) -> Option<Vec<u8>> {
        let map = &mut self.features.as_mut()?.feature;
        keys.iter().find_map(|k| match map.remove(*k)?.values? {
            Values::Bytes(mut b) if b.value.len() == 1 => b.value.pop(),
            _ => None,
        })
    }

    /// The single integer of the first of `keys` present.
    fn int(&self, keys: &[&str]) -> Option<i64> {
        let map = &self.features.as_ref()?.feature;
        keys.iter().find_map(|k| match &map.get(*k)?.values {
            Some(Values::Int64(i)) if i.value.len() == 1 => Some(i.value[0]),
            _ => None,
        })
    }

    /// The text of the first of `keys` present.
    fn text(&mut self, keys: &[&str]) -> Option<String> {
        self.bytes(keys).and_then(|b| String::from_utf8(b).ok())
    }
}

/// The masked CRC-32C a TFRecord stores for `bytes`.
fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// What one record states, as listed.
pub(super) struct Record {
    /// Byte offset of the record (its length field) in the file.
    pub(super) offset: u64,
    /// Length of its data.
    pub(super) len: u64,
    /// Its features, or why it cannot be packed ("damaged", "no image").
    pub(super) fields: std::result::Result<Fields, &'static str>,
}

impl Record {
    /// Its features, when it can be packed.
    pub(super) fn ok(&self) -> Option<&Fields> {
        self.fields.as_ref().ok()
    }
}

/// The features of a record that ddl-pack reads, the image's bytes aside.
pub(super) struct Fields {
    /// Its class number (`image/class/label`, `label`).
    pub(super) number: Option<i64>,
    /// Its wnid (`image/class/synset`).
    pub(super) synset: Option<String>,
    /// Its file name (`image/filename`, `file_name`).
    pub(super) name: Option<String>,
    /// The image's size in bytes.
    pub(super) size: u64,
}

/// The fields of record data `data`, or why it cannot be packed.
fn fields(data: &[u8]) -> std::result::Result<Fields, &'static str> {
    let mut ex = Example::decode(data).map_err(|_| "not a tf.train.Example")?;
    let number = ex.int(&NUMBER);
    let synset = ex.text(&[SYNSET]);
    let name = ex.text(&NAME);
    let image = ex.bytes(&IMAGE).ok_or("no image")?;
    Ok(Fields {
        number,
        synset,
        name,
        size: image.len() as u64,
    })
}

/// The error of a TFRecord file that cannot be listed past byte `at`.
fn cut(path: &Path, at: u64, why: &str) -> LoaderError {
    LoaderError::Input {
        path: path.to_path_buf(),
        reason: format!(
            "{why} at byte {at}: the records after it cannot be found (a TFRecord file cut \
             short or damaged; download it again)"
        ),
    }
}

/// The records of the TFRecord file `path`, in their order.
pub(super) fn records(path: &Path) -> Result<Vec<Record>> {
    let io = |e| LoaderError::io("read", path, e);
    let file = File::open(path).map_err(io)?;
    let size = file.metadata().map_err(io)?.len();
    let mut r = BufReader::with_capacity(1 << 20, file);
    let (mut out, mut data, mut offset) = (Vec::new(), Vec::new(), 0u64);
    while offset < size {
        let mut header = [0u8; 12];
        if size - offset < 12 {
            return Err(cut(path, offset, "a record's length is cut short"));
        }
        r.read_exact(&mut header).map_err(io)?;
        let len = u64::from_le_bytes(header[..8].try_into().expect("8 bytes"));
        let crc = u32::from_le_bytes(header[8..].try_into().expect("4 bytes"));
        if masked_crc(&header[..8]) != crc {
            let why = match (offset, header[..2] == [0x1f, 0x8b]) {
                (0, true) => "is gzip-compressed: ddl-pack reads uncompressed TFRecord files \
                              (TensorFlow's default); decompress it first"
                    .to_string(),
                (0, false) => "is not a TFRecord file: its first record's length fails its \
                               CRC (a ZLIB- or GZIP-compressed one must be decompressed first)"
                    .to_string(),
                _ => return Err(cut(path, offset, "a record's length fails its CRC")),
            };
            return Err(LoaderError::Input {
                path: path.to_path_buf(),
                reason: why,
            });
        }
        if size - offset - 12 < len + 4 {
            return Err(cut(path, offset, &format!("a record of {len} bytes")));
        }
        data.resize(len as usize + 4, 0);
        r.read_exact(&mut data).map_err(io)?;
        let (body, crc) = data.split_at(len as usize);
        let fields = match masked_crc(body) == u32::from_le_bytes(crc.try_into().expect("4")) {
            true => fields(body),
            false => Err("damaged: its data fails its CRC"),
        };
        out.push(Record {
            offset,
            len,
            fields,
        });
        offset += 12 + len + 4;
    }
    Ok(out)
}

/// The image of the record of `len` data bytes at `offset` of the TFRecord file `path`, its
/// data checked against its CRC.
pub(super) fn read_image(path: &Path, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
    let invalid = |why: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, why);
    let mut data = vec![0u8; len as usize + 4];
    File::open(path)?.read_exact_at(&mut data, offset + 12)?;
    let (body, crc) = data.split_at(len as usize);
    if masked_crc(body) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
        return Err(invalid(
            "the TFRecord's data fails its CRC: a damaged record",
        ));
    }
    let mut ex = Example::decode(body).map_err(|_| invalid("not a tf.train.Example"))?;
    ex.bytes(&IMAGE)
        .ok_or_else(|| invalid("the record holds no image"))
}
