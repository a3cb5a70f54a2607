//! Turning one input file into one stored JPEG: validate, decode (libjpeg-turbo, or the image
//! crate for CMYK/YCCK JPEGs, PNG and other formats), convert to RGB, resize so the shorter
//! side fits, re-encode at the requested quality with 4:2:0 subsampling. A baseline YCbCr JPEG
//! that already fits is copied byte for byte (after a validating decode) unless re-encoding is
//! forced.

use std::cell::RefCell;

use super::source::{Inputs, Item};
use crate::decode::{dct_denominator, scaled_dim};
use crate::limits::MAX_PIXELS;

use fast_image_resize as fr;
use fr::pixels::U8x3;
use turbojpeg::{Colorspace, Decompressor, Image, PixelFormat, ScalingFactor, Subsamp};

/// Smallest `max_short_side` other than 0 (keep the size): the pipeline's smallest output side.
/// Shorter images would only be blown up again by every crop, with nothing gained on disk.
pub const MIN_SHORT_SIDE: u32 = crate::limits::MIN_IMAGE_SIZE;

/// How the output should look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvertOptions {
    /// Shorter side limit in pixels, at least [`MIN_SHORT_SIDE`]; 0 keeps the original size.
    pub max_short_side: u32,
    /// JPEG quality 1..=100 for re-encoded images.
    pub quality: u8,
    /// Re-encode even JPEGs that could be copied.
    pub reencode: bool,
}

/// What was done to an input that was kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum How {
    /// Stored byte for byte.
    Copied,
    /// Decoded and re-encoded at the original size.
    Reencoded,
    /// Decoded, resized and re-encoded.
    Resized,
}

/// A converted image ready to store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Converted {
    /// The JPEG bytes.
    pub bytes: Vec<u8>,
    /// Height in pixels.
    pub height: u16,
    /// Width in pixels.
    pub width: u16,
    /// What was done.
    pub how: How,
}

/// Why an input was skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SkipReason {
    /// The file could not be read.
    Unreadable,
    /// The file is empty.
    ZeroByte,
    /// The image data ends early.
    Truncated,
    /// The bytes are not an image format the packer knows.
    NotAnImage,
    /// The image is damaged in a way no decoder accepts.
    Corrupt,
    /// The image is too large to store (dimensions over 65535 or over [`MAX_PIXELS`](crate::limits::MAX_PIXELS)).
    TooLarge,
}

impl SkipReason {
    /// Stable name used in `pack-report.json`.
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::Unreadable => "unreadable",
            SkipReason::ZeroByte => "zero-byte",
            SkipReason::Truncated => "truncated",
            SkipReason::NotAnImage => "not an image",
            SkipReason::Corrupt => "corrupt",
            SkipReason::TooLarge => "too large",
        }
    }
}

/// A skipped input: reason and detail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skip {
    /// The reason category.
    pub reason: SkipReason,
    /// Details (decoder message, ...).
    pub detail: String,
}

fn skip(reason: SkipReason, detail: impl Into<String>) -> Skip {
    Skip {
        reason,
        detail: detail.into(),
    }
}

/// What the marker walk learned about a JPEG.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JpegInfo {
    /// The SOF marker (0xC0 = baseline, 0xC1 extended, 0xC2 progressive, ...).
    pub sof: u8,
    /// Sample precision in bits.
    pub precision: u8,
    /// Number of colour components.
    pub components: u8,
    /// Width from the frame header.
    pub width: u16,
    /// Height from the frame header.
    pub height: u16,
}

/// Walks the JPEG marker segments up to the first scan, then checks that an EOI marker follows
/// the scan data. Fails with `Truncated` when a segment or the entropy-coded data ends early.
pub fn jpeg_info(b: &[u8]) -> Result<JpegInfo, Skip> {
    if b.len() < 4 || b[0] != 0xFF || b[1] != 0xD8 {
        return Err(skip(SkipReason::NotAnImage, "no JPEG SOI marker"));
    }
    let mut i = 2;
    let mut info = None;
    loop {
        // Find the next marker (skip fill bytes).
        while i < b.len() && b[i] != 0xFF {
            i += 1;
        }
        while i < b.len() && b[i] == 0xFF {
            i += 1;
        }
        if i >= b.len() {
            return Err(skip(
                SkipReason::Truncated,
                "file ends before the first scan",
            ));
        }
        let marker = b[i];
        i += 1;
        if marker == 0x01 || (0xD0..=0xD7).contains(&marker) {
            continue;
        }
        if marker == 0xD9 {
            return Err(skip(SkipReason::Corrupt, "EOI marker before any scan"));
        }
        if i + 2 > b.len() {
            return Err(skip(
                SkipReason::Truncated,
                "file ends inside a marker segment",
            ));
        }
        let len = u16::from_be_bytes([b[i], b[i + 1]]) as usize;
        if len < 2 {
            return Err(skip(
                SkipReason::Corrupt,
                format!("marker 0xFF{marker:02X} has length {len}"),
            ));
        }
        if i + len > b.len() {
            return Err(skip(
                SkipReason::Truncated,
                format!("file ends inside marker 0xFF{marker:02X}"),
            ));
        }
        let seg = &b[i + 2..i + len];
        let is_sof = matches!(marker, 0xC0..=0xCF) && !matches!(marker, 0xC4 | 0xC8 | 0xCC);
        if is_sof && info.is_none() {
            if seg.len() < 6 {
                return Err(skip(SkipReason::Corrupt, "short frame header"));
            }
            info = Some(JpegInfo {
                sof: marker,
                precision: seg[0],
                height: u16::from_be_bytes([seg[1], seg[2]]),
                width: u16::from_be_bytes([seg[3], seg[4]]),
                components: seg[5],
            });
        }
        i += len;
        if marker == 0xDA {
            break;
        }
    }
    let Some(info) = info else {
        return Err(skip(SkipReason::Corrupt, "scan before any frame header"));
    };
    // Inside entropy-coded data 0xFF is always followed by 0x00 or a restart marker, so an
    // 0xFF 0xD9 after the first scan can only be the end-of-image marker.
    let has_eoi = b[i..].windows(2).any(|w| w == [0xFF, 0xD9]);
    if !has_eoi {
        return Err(skip(
            SkipReason::Truncated,
            "no end-of-image marker after the scan data",
        ));
    }
    Ok(info)
}

struct Codecs {
    full: Decompressor,
    eighth: Decompressor,
    compressor: turbojpeg::Compressor,
    resizer: fr::Resizer,
    quality: u8,
}

impl Codecs {
    fn new() -> Self {
        let full = Decompressor::new().expect("TurboJPEG decompressor");
        let mut eighth = Decompressor::new().expect("TurboJPEG decompressor");
        eighth
            .set_scaling_factor(ScalingFactor::new(1, 8))
            .expect("1/8 is a supported scaling factor");
        let mut compressor = turbojpeg::Compressor::new().expect("TurboJPEG compressor");
        compressor
            .set_subsamp(Subsamp::Sub2x2)
            .expect("4:2:0 subsampling");
        Codecs {
            full,
            eighth,
            compressor,
            resizer: fr::Resizer::new(),
            quality: 0,
        }
    }
}

thread_local! {
    static CODECS: RefCell<Codecs> = RefCell::new(Codecs::new());
}

/// An RGB image in memory.
struct Rgb {
    pixels: Vec<u8>,
    width: u32,
    height: u32,
    /// Size of the stored image before any DCT-domain reduction; the output size is computed
    /// from it, so it does not depend on how the decoder got there.
    full: (u32, u32),
}

/// The DCT-domain reduction ([`dct_denominator`]) that keeps the decoded shorter side at or
/// above `max_short` (0 = no limit), with the same Catmull-Rom filter after it.
fn dct_scale(width: usize, height: usize, max_short: u32) -> ScalingFactor {
    let short = width.min(height);
    if max_short == 0 || short <= max_short as usize {
        return ScalingFactor::ONE;
    }
    let d = dct_denominator(|d| scaled_dim(short as u32, d) >= max_short);
    ScalingFactor::new(8 / d as usize, 8)
}

/// Decodes a 1- or 3-component JPEG to RGB with libjpeg-turbo, reduced by `scale` in the DCT
/// domain.
fn turbo_decode(
    c: &mut Codecs,
    bytes: &[u8],
    width: usize,
    height: usize,
    scale: ScalingFactor,
) -> Result<Rgb, String> {
    let full = (width as u32, height as u32);
    let (width, height) = (scale.scale(width), scale.scale(height));
    let mut pixels = vec![0u8; width * height * 3];
    c.full
        .set_scaling_factor(scale)
        .map_err(|e| e.to_string())?;
    c.full
        .decompress(
            bytes,
            Image {
                pixels: pixels.as_mut_slice(),
                width,
                pitch: width * 3,
                height,
                format: PixelFormat::RGB,
            },
        )
        .map_err(|e| e.to_string())?;
    Ok(Rgb {
        pixels,
        width: width as u32,
        height: height as u32,
        full,
    })
}

/// Decodes anything the image crate reads (CMYK/YCCK JPEG, PNG, ...) to RGB; alpha is composited
/// over white. The size is checked from the header first, so that a small file claiming a huge
/// image (a 31 KB PNG of 16000 x 16000) is refused before any pixel is allocated.
fn image_decode(bytes: &[u8]) -> Result<Rgb, Skip> {
    let reader = || {
        image::ImageReader::new(std::io::Cursor::new(bytes))
            .with_guessed_format()
            .expect("reading from memory cannot fail")
    };
    let (width, height) = reader().into_dimensions().map_err(image_skip)?;
    check_size(width, height)?;
    let img = reader().decode().map_err(image_skip)?;
    let (width, height) = (img.width(), img.height());
    let pixels = if img.color().has_alpha() {
        let rgba = img.to_rgba8();
        let mut out = Vec::with_capacity(width as usize * height as usize * 3);
        for p in rgba.pixels() {
            let a = u32::from(p[3]);
            for c in 0..3 {
                // Round(c * a / 255 + 255 * (255 - a) / 255).
                out.push(((u32::from(p[c]) * a + 255 * (255 - a) + 127) / 255) as u8);
            }
        }
        out
    } else {
        img.to_rgb8().into_raw()
    };
    Ok(Rgb {
        pixels,
        width,
        height,
        full: (width, height),
    })
}

/// The skip an image crate error makes, by what it says.
fn image_skip(e: image::ImageError) -> Skip {
    let msg = e.to_string();
    let lower = msg.to_ascii_lowercase();
    let reason = if lower.contains("eof") || lower.contains("end of") || lower.contains("truncat") {
        SkipReason::Truncated
    } else if matches!(e, image::ImageError::Unsupported(_)) {
        SkipReason::NotAnImage
    } else {
        SkipReason::Corrupt
    };
    skip(reason, msg)
}

fn check_size(width: u32, height: u32) -> Result<(), Skip> {
    if width == 0 || height == 0 {
        return Err(skip(SkipReason::Corrupt, format!("{width}x{height} image")));
    }
    if u64::from(width) * u64::from(height) > MAX_PIXELS {
        return Err(skip(
            SkipReason::TooLarge,
            format!("{width}x{height} exceeds {MAX_PIXELS} pixels"),
        ));
    }
    Ok(())
}

/// Output size for a `width` x `height` image whose shorter side must not exceed `max_short`
/// (0 = no limit): the shorter side becomes `max_short`, the longer one keeps the aspect ratio
/// (rounded, at least 1).
pub fn target_size(width: u32, height: u32, max_short: u32) -> (u32, u32) {
    let short = width.min(height);
    if max_short == 0 || short <= max_short {
        return (width, height);
    }
    let scale = |long: u32| -> u32 {
        ((u64::from(long) * u64::from(max_short) + u64::from(short) / 2) / u64::from(short)).max(1)
            as u32
    };
    if width <= height {
        (max_short, scale(height))
    } else {
        (scale(width), max_short)
    }
}

fn resize(c: &mut Codecs, img: Rgb, w: u32, h: u32) -> Result<Rgb, Skip> {
    // Typed (U8x3) views: the untyped `resize` would instantiate every pixel type's resampler.
    let src = fr::images::TypedImageRef::<U8x3>::from_buffer(img.width, img.height, &img.pixels)
        .map_err(|e| skip(SkipReason::Corrupt, format!("resize source: {e}")))?;
    let mut pixels = vec![0u8; w as usize * h as usize * 3];
    let mut dst = fr::images::TypedImage::<U8x3>::from_buffer(w, h, &mut pixels)
        .map_err(|e| skip(SkipReason::Corrupt, format!("resize target: {e}")))?;
    let opts =
        fr::ResizeOptions::new().resize_alg(fr::ResizeAlg::Convolution(fr::FilterType::CatmullRom));
    c.resizer
        .resize_typed(&src, &mut dst, &opts)
        .map_err(|e| skip(SkipReason::Corrupt, format!("resize: {e}")))?;
    Ok(Rgb {
        pixels,
        width: w,
        height: h,
        full: (w, h),
    })
}

fn encode(c: &mut Codecs, img: &Rgb, quality: u8) -> Result<Vec<u8>, Skip> {
    if c.quality != quality {
        c.compressor
            .set_quality(i32::from(quality))
            .map_err(|e| skip(SkipReason::Corrupt, format!("JPEG quality {quality}: {e}")))?;
        c.quality = quality;
    }
    c.compressor
        .compress_to_vec(Image {
            pixels: img.pixels.as_slice(),
            width: img.width as usize,
            pitch: img.width as usize * 3,
            height: img.height as usize,
            format: PixelFormat::RGB,
        })
        .map_err(|e| skip(SkipReason::Corrupt, format!("JPEG encode: {e}")))
}

fn dims16(width: u32, height: u32) -> Result<(u16, u16), Skip> {
    match (u16::try_from(width), u16::try_from(height)) {
        (Ok(w), Ok(h)) => Ok((w, h)),
        _ => Err(skip(
            SkipReason::TooLarge,
            format!("{width}x{height}: shards store dimensions up to 65535"),
        )),
    }
}

/// Converts one input file's bytes into the JPEG to store, or says why it is skipped.
pub fn convert(bytes: &[u8], opts: &ConvertOptions) -> Result<Converted, Skip> {
    if bytes.is_empty() {
        return Err(skip(SkipReason::ZeroByte, "empty file"));
    }
    CODECS.with(|c| convert_with(&mut c.borrow_mut(), bytes, opts))
}

/// A JPEG either kept as is or decoded to RGB.
enum JpegOutcome {
    Copy(Converted),
    Pixels(Rgb),
}

fn decode_jpeg(c: &mut Codecs, bytes: &[u8], opts: &ConvertOptions) -> Result<JpegOutcome, Skip> {
    let info = jpeg_info(bytes)?;
    check_size(u32::from(info.width), u32::from(info.height))?;
    let header = match c.full.read_header(bytes) {
        Ok(h) => h,
        // Something libjpeg-turbo does not read (e.g. an unusual marker layout): let the image
        // crate try before giving up.
        Err(e) => {
            return image_decode(bytes)
                .map(JpegOutcome::Pixels)
                .map_err(|f| skip(f.reason, format!("{e}; image crate: {}", f.detail)))
        }
    };
    let (w, h) = (header.width, header.height);
    let fits = target_size(w as u32, h as u32, opts.max_short_side) == (w as u32, h as u32);
    let copyable = !opts.reencode
        && fits
        && info.sof == 0xC0
        && info.precision == 8
        && info.components == 3
        && header.colorspace == Colorspace::YCbCr;
    if copyable {
        // Validate the entropy-coded data with a cheap 1/8-scale decode; any libjpeg-turbo
        // warning makes it fall through to a full decode and re-encode.
        let scaled = header.scaled(ScalingFactor::new(1, 8));
        let mut px = vec![0u8; scaled.width * scaled.height * 3];
        let ok = c
            .eighth
            .decompress(
                bytes,
                Image {
                    pixels: px.as_mut_slice(),
                    width: scaled.width,
                    pitch: scaled.width * 3,
                    height: scaled.height,
                    format: PixelFormat::RGB,
                },
            )
            .is_ok();
        if ok {
            let (width, height) = dims16(w as u32, h as u32)?;
            return Ok(JpegOutcome::Copy(Converted {
                bytes: bytes.to_vec(),
                height,
                width,
                how: How::Copied,
            }));
        }
    }
    let turbo = matches!(
        header.colorspace,
        Colorspace::YCbCr | Colorspace::Gray | Colorspace::RGB
    );
    let first = if turbo {
        turbo_decode(c, bytes, w, h, dct_scale(w, h, opts.max_short_side))
    } else {
        Err("CMYK/YCCK".to_string())
    };
    match first {
        Ok(img) => Ok(JpegOutcome::Pixels(img)),
        // libjpeg-turbo refuses CMYK -> RGB and treats warnings (extraneous bytes, ...) as
        // errors; the image crate's decoder is more lenient.
        Err(turbo_msg) => image_decode(bytes).map(JpegOutcome::Pixels).map_err(|e| {
            if turbo {
                skip(e.reason, format!("{turbo_msg}; image crate: {}", e.detail))
            } else {
                e
            }
        }),
    }
}

fn convert_with(c: &mut Codecs, bytes: &[u8], opts: &ConvertOptions) -> Result<Converted, Skip> {
    let is_jpeg = bytes.len() >= 3 && bytes[..3] == [0xFF, 0xD8, 0xFF];
    let decoded = if is_jpeg {
        match decode_jpeg(c, bytes, opts)? {
            JpegOutcome::Copy(kept) => return Ok(kept),
            JpegOutcome::Pixels(img) => img,
        }
    } else {
        if image::guess_format(bytes).is_err() {
            return Err(skip(SkipReason::NotAnImage, "unknown file signature"));
        }
        image_decode(bytes)?
    };
    let (tw, th) = target_size(decoded.full.0, decoded.full.1, opts.max_short_side);
    let how = if (tw, th) == decoded.full {
        How::Reencoded
    } else {
        How::Resized
    };
    let img = if (tw, th) == (decoded.width, decoded.height) {
        decoded
    } else {
        resize(c, decoded, tw, th)?
    };
    let (width, height) = dims16(img.width, img.height)?;
    let bytes = encode(c, &img, opts.quality)?;
    Ok(Converted {
        bytes,
        height,
        width,
        how,
    })
}

/// Converts one input.
pub(crate) fn process(
    inputs: &Inputs,
    item: &Item,
    copts: &ConvertOptions,
) -> std::result::Result<Converted, Skip> {
    convert_read(inputs.read(item), copts)
}

/// Converts an input's bytes as read (a read error: the input is skipped).
pub(crate) fn convert_read(
    bytes: std::io::Result<Vec<u8>>,
    copts: &ConvertOptions,
) -> std::result::Result<Converted, Skip> {
    let bytes = bytes.map_err(|e| Skip {
        reason: if e.kind() == std::io::ErrorKind::UnexpectedEof {
            SkipReason::Truncated
        } else {
            SkipReason::Unreadable
        },
        detail: e.to_string(),
    })?;
    convert(&bytes, copts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dct_scale_is_the_strongest_that_keeps_the_short_side() {
        assert_eq!(dct_scale(1000, 800, 256), ScalingFactor::new(4, 8));
        assert_eq!(dct_scale(4000, 2100, 256), ScalingFactor::new(1, 8));
        assert_eq!(dct_scale(2400, 1200, 256), ScalingFactor::new(2, 8));
        assert_eq!(dct_scale(300, 200, 256), ScalingFactor::ONE);
        assert_eq!(dct_scale(1000, 800, 0), ScalingFactor::ONE);
    }

    #[test]
    fn target_sizes() {
        assert_eq!(target_size(500, 375, 256), (341, 256));
        assert_eq!(target_size(375, 500, 256), (256, 341));
        assert_eq!(target_size(200, 100, 256), (200, 100));
        assert_eq!(target_size(5000, 300, 0), (5000, 300));
        assert_eq!(target_size(10000, 257, 256), (9961, 256));
        assert_eq!(target_size(1000, 1000, 1), (1, 1));
    }

    /// A PNG whose header claims `w` x `h` 8-bit grey pixels, followed by a few bytes of
    /// image data: a small file that would cost `w * h` bytes (and three times that as RGB)
    /// if it were decoded.
    fn png_claiming(w: u32, h: u32) -> Vec<u8> {
        fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
            out.extend((data.len() as u32).to_be_bytes());
            let start = out.len();
            out.extend(kind);
            out.extend(data);
            let crc = crc32fast::hash(&out[start..]);
            out.extend(crc.to_be_bytes());
        }
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        let mut ihdr = Vec::new();
        ihdr.extend(w.to_be_bytes());
        ihdr.extend(h.to_be_bytes());
        ihdr.extend([8, 0, 0, 0, 0]); // 8 bits, grey, deflate, no filter, no interlace
        chunk(&mut png, b"IHDR", &ihdr);
        chunk(&mut png, b"IDAT", &[0x78, 0x9c, 0x63, 0x00, 0x00]);
        chunk(&mut png, b"IEND", &[]);
        png
    }

    #[test]
    fn a_small_file_claiming_a_huge_image_is_refused_from_its_header() {
        let opts = ConvertOptions {
            max_short_side: 0,
            quality: 90,
            reencode: true,
        };
        let e = convert(&png_claiming(16000, 16000), &opts).unwrap_err();
        assert_eq!(e.reason, SkipReason::TooLarge, "{}", e.detail);
        assert!(e.detail.contains("16000x16000"), "{}", e.detail);
        // Just under the limit, the same file is read and found truncated.
        let e = convert(&png_claiming(11000, 11000), &opts).unwrap_err();
        assert_ne!(e.reason, SkipReason::TooLarge, "{}", e.detail);
    }

    fn test_jpeg(w: usize, h: usize) -> Vec<u8> {
        let px: Vec<u8> = (0..w * h * 3).map(|i| (i * 7 % 251) as u8).collect();
        turbojpeg::compress(
            Image {
                pixels: px.as_slice(),
                width: w,
                pitch: w * 3,
                height: h,
                format: PixelFormat::RGB,
            },
            90,
            Subsamp::Sub2x2,
        )
        .unwrap()
        .to_vec()
    }

    #[test]
    fn copies_clean_jpegs_and_reencodes_ones_libjpeg_warns_about() {
        let opts = ConvertOptions {
            max_short_side: 64,
            quality: 90,
            reencode: false,
        };
        let clean = test_jpeg(48, 40);
        let c = convert(&clean, &opts).unwrap();
        assert_eq!((c.how, c.width, c.height), (How::Copied, 48, 40));
        assert_eq!(c.bytes, clean);
        // Junk between the scan data and EOI: libjpeg-turbo warns ("extraneous bytes before
        // marker"), so the file is decoded leniently and re-encoded rather than copied.
        let mut warned = clean.clone();
        let n = warned.len();
        warned.splice(n - 2..n - 2, [0x12, 0x34, 0x56]);
        let c = convert(&warned, &opts).unwrap();
        assert_eq!((c.how, c.width, c.height), (How::Reencoded, 48, 40));
        assert_ne!(c.bytes, warned);
        let big = convert(&test_jpeg(200, 100), &opts).unwrap();
        assert_eq!((big.how, big.width, big.height), (How::Resized, 128, 64));
        assert_eq!(
            convert(b"", &opts).unwrap_err().reason,
            SkipReason::ZeroByte
        );
    }

    #[test]
    fn marker_walk_detects_truncation() {
        let px = vec![128u8; 32 * 24 * 3];
        let jpeg = turbojpeg::compress(
            Image {
                pixels: px.as_slice(),
                width: 32,
                pitch: 96,
                height: 24,
                format: PixelFormat::RGB,
            },
            90,
            Subsamp::Sub2x2,
        )
        .unwrap()
        .to_vec();
        let info = jpeg_info(&jpeg).unwrap();
        assert_eq!(
            (info.sof, info.components, info.width, info.height),
            (0xC0, 3, 32, 24)
        );
        let cut = &jpeg[..jpeg.len() - 2];
        assert_eq!(jpeg_info(cut).unwrap_err().reason, SkipReason::Truncated);
        assert_eq!(
            jpeg_info(&jpeg[..100]).unwrap_err().reason,
            SkipReason::Truncated
        );
        assert_eq!(
            jpeg_info(b"hello").unwrap_err().reason,
            SkipReason::NotAnImage
        );
    }
}
