//! JPEG decoding with libjpeg-turbo 3 (the `turbojpeg` crate's bundled library), using DCT
//! scaling and partial (cropped) decoding so that only the pixels a crop keeps are produced.
//!
//! The crate's safe `Decompressor` cannot set a cropping region, so [`JpegDecoder`] wraps the
//! TurboJPEG 3 handle directly (`tj3Init`, `tj3DecompressHeader`, `tj3SetScalingFactor`,
//! `tj3SetCroppingRegion`, `tj3Decompress8`). One decoder lives in each pipeline worker and is
//! reused for every image; its output buffer only ever grows.
//!
//! Partial decoding: libjpeg-turbo must still entropy-decode every MCU row above the bottom of
//! the region (Huffman decoding is sequential), but it skips the IDCT, upsampling and colour
//! conversion of rows above the region and of columns outside it, and stops reading at the
//! region's bottom edge. The left edge must be a multiple of the *scaled* iMCU width, so
//! [`plan`] widens the region leftwards to the next boundary and the remaining offset is
//! cropped in memory by the resizer.

use std::ffi::CStr;

use turbojpeg::raw;

use crate::limits::MAX_PIXELS;

/// An error from libjpeg-turbo (or an impossible request), without file context; the caller
/// wraps it into [`crate::LoaderError::Decode`] with the shard file and record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DecodeError {}

/// How much of the JPEG to decode; one mode is used for all images of a pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DecodeMode {
    /// Decode every pixel at full resolution, then crop and resize (the baseline).
    Full,
    /// Decode the whole image with DCT scaling (1/2, 1/4, 1/8) where the crop allows.
    Scaled,
    /// DCT scaling plus decoding only the crop's region (the default: fastest by measurement).
    #[default]
    Region,
}

/// The parts of a JPEG header the planner needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JpegHeader {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Width of an iMCU in pixels (8, 16 or 32), or 0 when the subsampling is unknown (then
    /// no cropping region can be used).
    pub mcu_width: u32,
}

/// A rectangle of pixels, in scaled image coordinates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// Left edge.
    pub x: u32,
    /// Top edge.
    pub y: u32,
    /// Width.
    pub w: u32,
    /// Height.
    pub h: u32,
}

/// What to decode for one image and where the wanted crop lies in the decoded pixels.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecodePlan {
    /// DCT scaling denominator: 1, 2, 4 or 8.
    pub denom: u32,
    /// Size of the whole image after scaling.
    pub scaled: (u32, u32),
    /// The region to decode, in scaled coordinates (the whole scaled image when not cropping).
    pub region: Region,
    /// The crop relative to the decoded region, in decoded pixels: left, top, width, height.
    pub crop: [f64; 4],
}

/// Scaled size of `dim` under 1/`denom` (TurboJPEG's `TJSCALED`: rounds up).
pub fn scaled_dim(dim: u32, denom: u32) -> u32 {
    dim.div_ceil(denom)
}

/// The strongest DCT-domain reduction, as the denominator of 1/8, 1/4 or 1/2 (1: none), for
/// which `fits(denominator)` holds: libjpeg-turbo then skips most of the IDCT work and the
/// resampler has less to do. Only these three factors have SIMD IDCTs in libjpeg-turbo; the
/// other n/8 factors run plain-C IDCTs that are slower than a full SIMD decode (measured with
/// perf on ddl-pack). The one choice for the packer and the loader.
pub fn dct_denominator(fits: impl Fn(u32) -> bool) -> u32 {
    [8u32, 4, 2].into_iter().find(|&d| fits(d)).unwrap_or(1)
}

/// Plans the decode of the source-pixel crop `[left, top, width, height]` of an image with
/// header `h`, to be resized to `out` (width, height) pixels.
///
/// The scaling denominator is the largest of 8, 4, 2, 1 for which the scaled crop is still at
/// least `out` in both directions (so the resizer only ever shrinks by DCT-then-filter as it
/// would have from the full image). With [`DecodeMode::Region`] the region is the crop plus
/// a margin for the resize filter's support, widened left to the scaled iMCU boundary.
pub fn plan(h: &JpegHeader, crop: [f64; 4], out: (u32, u32), mode: DecodeMode) -> DecodePlan {
    let [left, top, width, height] = crop;
    let denom = match mode {
        DecodeMode::Full => 1,
        DecodeMode::Scaled | DecodeMode::Region => dct_denominator(|d| {
            width / d as f64 >= out.0 as f64
                && height / d as f64 >= out.1 as f64
                && h.width >= d
                && h.height >= d
        }),
    };
    let sw = scaled_dim(h.width, denom);
    let sh = scaled_dim(h.height, denom);
    let d = denom as f64;
    let (cl, ct, cw, ch) = (left / d, top / d, width / d, height / d);
    let whole = Region {
        x: 0,
        y: 0,
        w: sw,
        h: sh,
    };
    let region = if mode == DecodeMode::Region && h.mcu_width > 0 {
        // The resize filter reads about (crop / out) source pixels beyond each crop edge.
        let margin_x = (cw / out.0.max(1) as f64).ceil() + 1.0;
        let margin_y = (ch / out.1.max(1) as f64).ceil() + 1.0;
        let mcu = scaled_dim(h.mcu_width, denom).max(1);
        let x0 = ((cl - margin_x).floor().max(0.0) as u32).min(sw.saturating_sub(1));
        let x0 = x0 - x0 % mcu;
        let y0 = ((ct - margin_y).floor().max(0.0) as u32).min(sh.saturating_sub(1));
        let x1 = ((cl + cw + margin_x).ceil().max(0.0) as u32).clamp(x0 + 1, sw);
        let y1 = ((ct + ch + margin_y).ceil().max(0.0) as u32).clamp(y0 + 1, sh);
        Region {
            x: x0,
            y: y0,
            w: x1 - x0,
            h: y1 - y0,
        }
    } else {
        whole
    };
    // Crop relative to the region, clamped inside it against rounding.
    let rl = (cl - region.x as f64).clamp(0.0, region.w as f64 - 1.0);
    let rt = (ct - region.y as f64).clamp(0.0, region.h as f64 - 1.0);
    let rw = cw.min(region.w as f64 - rl).max(f64::MIN_POSITIVE);
    let rh = ch.min(region.h as f64 - rt).max(f64::MIN_POSITIVE);
    DecodePlan {
        denom,
        scaled: (sw, sh),
        region,
        crop: [rl, rt, rw, rh],
    }
}

/// iMCU width in pixels for TurboJPEG's subsampling codes (TJSAMP_444 ... TJSAMP_441).
fn mcu_width(subsamp: i32) -> u32 {
    match subsamp {
        0 => 8,  // 4:4:4
        1 => 16, // 4:2:2
        2 => 16, // 4:2:0
        3 => 8,  // grey
        4 => 8,  // 4:4:0
        5 => 32, // 4:1:1
        6 => 8,  // 4:4:1
        _ => 0,  // unknown
    }
}

/// A new TurboJPEG 3 decompression handle with `TJPARAM_STOPONWARNING` set: TurboJPEG 3
/// reports a warning and a fatal error the same way (-1, with the warning flag still set after
/// a fatal error that followed a warning), so the only safe reading of -1 is "failed".
fn fresh_handle() -> Result<raw::tjhandle, DecodeError> {
    // SAFETY: plain constructor; a null return is handled.
    let handle = unsafe { raw::tj3Init(raw::TJINIT_TJINIT_DECOMPRESS as libc::c_int) };
    if handle.is_null() {
        return Err(DecodeError("tj3Init failed".to_string()));
    }
    // SAFETY: valid handle.
    let rc = unsafe { raw::tj3Set(handle, raw::TJPARAM_TJPARAM_STOPONWARNING as libc::c_int, 1) };
    if rc != 0 {
        // SAFETY: destroyed once, not used after.
        unsafe { raw::tj3Destroy(handle) };
        return Err(DecodeError("cannot set TJPARAM_STOPONWARNING".to_string()));
    }
    Ok(handle)
}

/// One TurboJPEG 3 decompression handle plus its output buffer, reused for every image.
pub struct JpegDecoder {
    handle: raw::tjhandle,
    pixels: Vec<u8>,
}

// SAFETY: a TurboJPEG handle may be used from any thread, just not from two at once; `&mut self`
// on every method guarantees that.
unsafe impl Send for JpegDecoder {}

impl std::fmt::Debug for JpegDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JpegDecoder")
            .field("buffer_bytes", &self.pixels.len())
            .finish()
    }
}

impl Drop for JpegDecoder {
    fn drop(&mut self) {
        // SAFETY: the handle came from tj3Init and is destroyed exactly once.
        unsafe { raw::tj3Destroy(self.handle) }
    }
}

impl JpegDecoder {
    /// Creates a decompression handle that treats libjpeg warnings as errors.
    pub fn new() -> Result<JpegDecoder, DecodeError> {
        Ok(JpegDecoder {
            handle: fresh_handle()?,
            pixels: Vec::new(),
        })
    }

    /// The handle's error message. The handle is then replaced by a fresh one: after a
    /// failure part-way through a header or a decode, libjpeg's state is not reliably reusable.
    fn fail(&mut self) -> DecodeError {
        // SAFETY: tj3GetErrorStr returns a NUL-terminated string owned by the handle.
        let msg = unsafe { CStr::from_ptr(raw::tj3GetErrorStr(self.handle)) };
        let err = DecodeError(msg.to_string_lossy().trim().replace('\n', " "));
        if let Ok(h) = fresh_handle() {
            // SAFETY: the old handle came from tj3Init and is destroyed exactly once.
            unsafe { raw::tj3Destroy(self.handle) };
            self.handle = h;
        }
        err
    }

    /// Reads the header of `jpeg`. Must precede [`JpegDecoder::decode`] for the same bytes.
    pub fn header(&mut self, jpeg: &[u8]) -> Result<JpegHeader, DecodeError> {
        if jpeg.is_empty() {
            return Err(DecodeError("empty record".to_string()));
        }
        // SAFETY: pointer and length describe `jpeg`, which outlives the call.
        let rc = unsafe {
            raw::tj3DecompressHeader(self.handle, jpeg.as_ptr(), jpeg.len() as raw::size_t)
        };
        if rc != 0 {
            return Err(self.fail());
        }
        // SAFETY: valid handle.
        let get = |p: raw::TJPARAM| unsafe { raw::tj3Get(self.handle, p as libc::c_int) };
        let width = get(raw::TJPARAM_TJPARAM_JPEGWIDTH);
        let height = get(raw::TJPARAM_TJPARAM_JPEGHEIGHT);
        let subsamp = get(raw::TJPARAM_TJPARAM_SUBSAMP);
        if width <= 0 || height <= 0 {
            return Err(DecodeError(format!("invalid size {width}x{height}")));
        }
        if width as u64 * height as u64 > MAX_PIXELS {
            return Err(DecodeError(format!(
                "image of {width}x{height} exceeds the {MAX_PIXELS}-pixel limit"
            )));
        }
        if get(raw::TJPARAM_TJPARAM_LOSSLESS) != 0 {
            return Err(DecodeError("lossless JPEG is not supported".to_string()));
        }
        Ok(JpegHeader {
            width: width as u32,
            height: height as u32,
            mcu_width: mcu_width(subsamp),
        })
    }

    /// Decodes `plan.region` of `jpeg` at scale 1/`plan.denom` to packed RGB and returns the
    /// pixels (`region.w * region.h * 3` bytes, rows unpadded). [`JpegDecoder::header`] must
    /// have been called for the same bytes just before. Any libjpeg warning (truncated data,
    /// extraneous bytes, a stream without an image) is an error: the record counts as bad.
    pub fn decode(&mut self, jpeg: &[u8], plan: &DecodePlan) -> Result<&[u8], DecodeError> {
        let r = plan.region;
        let sf = raw::tjscalingfactor {
            num: 1,
            denom: plan.denom as libc::c_int,
        };
        // SAFETY: valid handle; the scaling factor is one TurboJPEG supports.
        if unsafe { raw::tj3SetScalingFactor(self.handle, sf) } != 0 {
            return Err(self.fail());
        }
        let whole = r.x == 0 && r.y == 0 && (r.w, r.h) == plan.scaled;
        let region = if whole {
            raw::tjregion {
                x: 0,
                y: 0,
                w: 0,
                h: 0,
            }
        } else {
            raw::tjregion {
                x: r.x as libc::c_int,
                y: r.y as libc::c_int,
                w: r.w as libc::c_int,
                h: r.h as libc::c_int,
            }
        };
        // SAFETY: valid handle; the header was read, TurboJPEG validates the region.
        if unsafe { raw::tj3SetCroppingRegion(self.handle, region) } != 0 {
            return Err(self.fail());
        }
        let pitch = r.w as usize * 3;
        let need = pitch * r.h as usize;
        if self.pixels.len() < need {
            self.pixels.resize(need, 0);
        }
        // SAFETY: `pixels` holds at least pitch * region height bytes, which is exactly what
        // tj3Decompress8 writes for the region set above at this scaling factor.
        let rc = unsafe {
            raw::tj3Decompress8(
                self.handle,
                jpeg.as_ptr(),
                jpeg.len() as raw::size_t,
                self.pixels.as_mut_ptr(),
                pitch as libc::c_int,
                raw::TJPF_TJPF_RGB as libc::c_int,
            )
        };
        if rc != 0 {
            return Err(self.fail());
        }
        Ok(&self.pixels[..need])
    }

    /// Reads the header and decodes the whole image at full resolution (tests and tools).
    pub fn decode_full(&mut self, jpeg: &[u8]) -> Result<(JpegHeader, Vec<u8>), DecodeError> {
        let h = self.header(jpeg)?;
        let p = plan(
            &h,
            [0.0, 0.0, h.width as f64, h.height as f64],
            (h.width, h.height),
            DecodeMode::Full,
        );
        let px = self.decode(jpeg, &p)?.to_vec();
        Ok((h, px))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(w: u32, h: u32) -> JpegHeader {
        JpegHeader {
            width: w,
            height: h,
            mcu_width: 16,
        }
    }

    #[test]
    fn scale_is_largest_keeping_output_size() {
        let h = header(1000, 800);
        let out = (224, 224);
        assert_eq!(
            plan(&h, [0.0, 0.0, 1000.0, 800.0], out, DecodeMode::Scaled).denom,
            2
        );
        assert_eq!(
            plan(&h, [0.0, 0.0, 1000.0, 900.0], out, DecodeMode::Full).denom,
            1
        );
        assert_eq!(
            plan(&h, [0.0, 0.0, 300.0, 300.0], out, DecodeMode::Region).denom,
            1
        );
        let big = header(4000, 3000);
        assert_eq!(
            plan(&big, [0.0, 0.0, 2000.0, 1800.0], out, DecodeMode::Region).denom,
            8
        );
        assert_eq!(
            plan(&big, [0.0, 0.0, 1000.0, 900.0], out, DecodeMode::Region).denom,
            4
        );
    }

    #[test]
    fn region_is_aligned_and_contains_crop() {
        let h = header(500, 375);
        for &(l, t, w, hh) in &[
            (37.0, 11.0, 120.0, 90.0),
            (0.0, 0.0, 500.0, 375.0),
            (499.0, 374.0, 1.0, 1.0),
            (250.5, 100.25, 249.5, 274.75),
        ] {
            let p = plan(&h, [l, t, w, hh], (64, 64), DecodeMode::Region);
            let mcu = scaled_dim(16, p.denom);
            assert_eq!(p.region.x % mcu, 0, "{p:?}");
            assert!(p.region.x + p.region.w <= p.scaled.0);
            assert!(p.region.y + p.region.h <= p.scaled.1);
            let d = p.denom as f64;
            // The crop, mapped back to source pixels, is where it was asked to be.
            let src_l = (p.crop[0] + p.region.x as f64) * d;
            let src_t = (p.crop[1] + p.region.y as f64) * d;
            assert!(
                (src_l - l).abs() < 1e-6 && (src_t - t).abs() < 1e-6,
                "{p:?}"
            );
            assert!(p.crop[0] + p.crop[2] <= p.region.w as f64 + 1e-9);
            assert!(p.crop[1] + p.crop[3] <= p.region.h as f64 + 1e-9);
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let mut d = JpegDecoder::new().unwrap();
        assert!(d.header(b"").is_err());
        assert!(d.header(b"not a jpeg at all").is_err());
        assert!(d.header(&[0xFF, 0xD8, 0xFF, 0xE0, 0, 16, 1, 2]).is_err());
        // A truncated JPEG fails (warnings are errors), and the decoder still works after.
        let rgb = vec![77u8; 48 * 32 * 3];
        let img = turbojpeg::Image {
            pixels: rgb.as_slice(),
            width: 48,
            pitch: 48 * 3,
            height: 32,
            format: turbojpeg::PixelFormat::RGB,
        };
        let jpeg = turbojpeg::compress(img, 90, turbojpeg::Subsamp::Sub2x2).unwrap();
        assert!(d.decode_full(&jpeg[..jpeg.len() / 2]).is_err());
        assert!(d.decode_full(b"\xFF\xD8\xFF\xE0 not a JPEG body").is_err());
        let (h, px) = d.decode_full(&jpeg).unwrap();
        assert_eq!((h.width, h.height, px.len()), (48, 32, 48 * 32 * 3));
        assert!(px.iter().all(|&v| (v as i32 - 77).abs() <= 2));
    }

    #[test]
    fn region_decode_matches_full_decode() {
        let (w, h) = (333usize, 250usize);
        let mut rgb = vec![0u8; w * h * 3];
        for y in 0..h {
            for x in 0..w {
                let i = (y * w + x) * 3;
                rgb[i] = (x * 255 / w) as u8;
                rgb[i + 1] = (y * 255 / h) as u8;
                rgb[i + 2] = ((x + y) * 255 / (w + h)) as u8;
            }
        }
        let img = turbojpeg::Image {
            pixels: rgb.as_slice(),
            width: w,
            pitch: w * 3,
            height: h,
            format: turbojpeg::PixelFormat::RGB,
        };
        let jpeg = turbojpeg::compress(img, 95, turbojpeg::Subsamp::Sub2x2).unwrap();
        let mut d = JpegDecoder::new().unwrap();
        let (hd, full) = d.decode_full(&jpeg).unwrap();
        assert_eq!((hd.width, hd.height, hd.mcu_width), (333, 250, 16));
        let hdr = d.header(&jpeg).unwrap();
        let p = plan(
            &hdr,
            [100.0, 60.0, 150.0, 120.0],
            (150, 120),
            DecodeMode::Region,
        );
        assert_eq!(p.denom, 1);
        let part = d.decode(&jpeg, &p).unwrap().to_vec();
        let r = p.region;
        // Chroma upsampling at the region's own edges lacks the neighbours outside it, so the
        // first and last two columns and rows may differ; plan() keeps the crop at least two
        // pixels inside the region. Everywhere else partial decoding is exact.
        let mut max_diff = 0i32;
        for y in 2..r.h as usize - 2 {
            for x in 2..r.w as usize - 2 {
                for c in 0..3 {
                    let a = part[(y * r.w as usize + x) * 3 + c] as i32;
                    let b = full[((y + r.y as usize) * w + x + r.x as usize) * 3 + c] as i32;
                    max_diff = max_diff.max((a - b).abs());
                }
            }
        }
        assert_eq!(max_diff, 0, "region decode differs from full decode");
        assert!(p.region.x + 2 <= 100 && p.region.y + 2 <= 60);
        assert!(p.region.x + p.region.w >= 252 && p.region.y + p.region.h >= 182);
    }
}
