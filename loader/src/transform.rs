//! Crop, flip, resize and normalize: the per-image work of the pipeline.
//!
//! Train images get torchvision's `RandomResizedCrop(size, scale, ratio)` (same algorithm,
//! including the ten attempts, Python's round-half-to-even and the centre-crop fallback with
//! ratio clamping) and `RandomHorizontalFlip(p)`, by default with torchvision's
//! `scale=(0.08, 1)`, `ratio=(3/4, 4/3)` and `p=0.5` (see [`TrainAugment`]); eval images get
//! `Resize(resize)` of the shorter side then `CenterCrop(size)`, `resize` by default
//! `size x 8/7` ([`eval_resize`]). Both reduce to one crop
//! rectangle in source pixels, which [`crate::decode::plan`] turns into a scaled, partial
//! JPEG decode; the crop is then resized with an antialiased bilinear filter
//! (`fast_image_resize`, like Pillow's), flipped while being written out, and normalized with a
//! per-channel multiply and add (AVX2, eight pixels at a time, where the CPU has it) into
//! float32 CHW, or kept as uint8 HWC.
//!
//! All randomness comes from [`ImageRng`], a counter-based generator keyed on
//! `(seed, epoch, record id)`: an image's crop and flip never depend on which thread processes
//! it or when.

use fast_image_resize as fir;
use fir::pixels::U8x3;

use crate::decode::{plan, DecodeError, DecodeMode, JpegDecoder};
use crate::sampler::mix64;

pub use crate::augment::{
    eval_resize, Augment, Output, TrainAugment, EVAL_RESIZE_RATIO, IMAGENET_MEAN, IMAGENET_STD,
};

/// Counter-based random numbers for one image: output `k` is a hash of the key and `k`.
#[derive(Clone, Debug)]
pub struct ImageRng {
    key: u64,
    counter: u64,
}

impl ImageRng {
    /// The generator of record `id` in `epoch` under `seed`.
    pub fn new(seed: u64, epoch: u64, id: u64) -> ImageRng {
        let key = mix64(seed ^ mix64(epoch ^ mix64(id ^ 0x4155_474D_454E_5421)));
        ImageRng { key, counter: 0 }
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.counter += 1;
        mix64(self.key ^ self.counter.wrapping_mul(0xD1B5_4A32_D192_ED03))
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Uniform integer in `lo..=hi` (like `torch.randint(lo, hi + 1)`).
    pub fn int_inclusive(&mut self, lo: u32, hi: u32) -> u32 {
        let n = (hi - lo) as u64 + 1;
        lo + ((self.next_u64() as u128 * n as u128) >> 64) as u32
    }
}

/// An integer crop window, as torchvision's `get_params` returns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CropWindow {
    /// Top row.
    pub top: u32,
    /// Left column.
    pub left: u32,
    /// Height in rows.
    pub height: u32,
    /// Width in columns.
    pub width: u32,
}

impl CropWindow {
    /// As a floating-point `[left, top, width, height]` rectangle.
    pub fn rect(&self) -> [f64; 4] {
        [
            self.left as f64,
            self.top as f64,
            self.width as f64,
            self.height as f64,
        ]
    }
}

/// torchvision's `RandomResizedCrop.get_params` for a `width` x `height` image.
///
/// Ten attempts draw an area fraction uniformly from `scale` and a log-uniform aspect ratio
/// from `ratio`; the first window that fits is placed uniformly at random. If none fits, the
/// fallback is a centered crop of the whole image with its aspect ratio clamped into `ratio`.
pub fn random_resized_crop(
    width: u32,
    height: u32,
    scale: (f64, f64),
    ratio: (f64, f64),
    rng: &mut ImageRng,
) -> CropWindow {
    let area = width as f64 * height as f64;
    let (log_lo, log_hi) = (ratio.0.ln(), ratio.1.ln());
    for _ in 0..10 {
        let target_area = area * rng.uniform(scale.0, scale.1);
        let aspect = rng.uniform(log_lo, log_hi).exp();
        let w = (target_area * aspect).sqrt().round_ties_even();
        let h = (target_area / aspect).sqrt().round_ties_even();
        if 0.0 < w && w <= width as f64 && 0.0 < h && h <= height as f64 {
            let (w, h) = (w as u32, h as u32);
            let top = rng.int_inclusive(0, height - h);
            let left = rng.int_inclusive(0, width - w);
            return CropWindow {
                top,
                left,
                height: h,
                width: w,
            };
        }
    }
    let in_ratio = width as f64 / height as f64;
    let (min_r, max_r) = (ratio.0.min(ratio.1), ratio.0.max(ratio.1));
    let (w, h) = if in_ratio < min_r {
        (
            width,
            ((width as f64 / min_r).round_ties_even() as u32).max(1),
        )
    } else if in_ratio > max_r {
        (
            ((height as f64 * max_r).round_ties_even() as u32).max(1),
            height,
        )
    } else {
        (width, height)
    };
    CropWindow {
        top: (height - h.min(height)) / 2,
        left: (width - w.min(width)) / 2,
        height: h.min(height),
        width: w.min(width),
    }
}

/// The source rectangle `[left, top, width, height]` that torchvision's
/// `Resize(resize)` (shorter side) followed by `CenterCrop(size)` keeps of a
/// `width` x `height` image. Requires `resize >= size`.
pub fn resize_center_crop(width: u32, height: u32, resize: u32, size: u32) -> [f64; 4] {
    let (w, h) = (width as f64, height as f64);
    // torchvision: new_short = resize, new_long = int(resize * long / short).
    let (new_w, new_h) = if width <= height {
        (resize as f64, (resize as f64 * h / w).floor())
    } else {
        ((resize as f64 * w / h).floor(), resize as f64)
    };
    let (sx, sy) = (new_w / w, new_h / h);
    let s = size as f64;
    let crop_left = ((new_w - s) / 2.0).round_ties_even().max(0.0);
    let crop_top = ((new_h - s) / 2.0).round_ties_even().max(0.0);
    [
        crop_left / sx,
        crop_top / sy,
        (s / sx).min(w),
        (s / sy).min(h),
    ]
}

/// Per-channel affine map of a byte to `(v / 255 - mean) / std`, evaluated in float32 as
/// `v * scale + bias` (one multiply and one add, never fused, so every thread and every
/// build gets the same bits).
#[derive(Clone, Debug)]
pub struct Normalizer {
    scale: [f32; 3],
    bias: [f32; 3],
}

impl Normalizer {
    /// The map for the given mean and std (0-1 scale, RGB).
    pub fn new(mean: [f32; 3], std: [f32; 3]) -> Normalizer {
        let mut scale = [0f32; 3];
        let mut bias = [0f32; 3];
        for c in 0..3 {
            scale[c] = (1.0 / (255.0 * std[c] as f64)) as f32;
            bias[c] = (-(mean[c] as f64) / std[c] as f64) as f32;
        }
        Normalizer { scale, bias }
    }

    /// Normalized value of byte `v` in channel `c`.
    pub fn value(&self, c: usize, v: u8) -> f32 {
        v as f32 * self.scale[c] + self.bias[c]
    }

    /// Writes the `w` x `h` RGB image `src` (HWC) into `dst` as normalized CHW, mirrored
    /// horizontally when `flip` is set.
    ///
    /// With AVX2 (detected at run time) eight pixels at a time are split into channels with
    /// byte shuffles, widened to float32 and mapped; elsewhere one pass per channel and row.
    /// Both compute exactly [`Normalizer::value`] (a multiply, then an add) for every pixel.
    pub fn write_chw(&self, src: &[u8], w: usize, h: usize, flip: bool, dst: &mut [f32]) {
        let plane = w * h;
        if plane == 0 {
            return;
        }
        let src = &src[..3 * plane];
        let mut planes = dst[..3 * plane].chunks_exact_mut(plane);
        let (Some(r), Some(g), Some(b)) = (planes.next(), planes.next(), planes.next()) else {
            return;
        };
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is available (checked above).
            unsafe { avx2::image(src, w, [r, g, b], self, flip) };
            return;
        }
        channel::<0>(src, w, r, self.scale[0], self.bias[0], flip);
        channel::<1>(src, w, g, self.scale[1], self.bias[1], flip);
        channel::<2>(src, w, b, self.scale[2], self.bias[2], flip);
    }
}

/// The AVX2 kernel of [`Normalizer::write_chw`].
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::Normalizer;

    /// The RGB image `src` (HWC, rows of `w` pixels) into the three channel planes `planes`,
    /// each row mirrored when `flip` is set.
    ///
    /// # Safety
    ///
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn image(
        src: &[u8],
        w: usize,
        planes: [&mut [f32]; 3],
        n: &Normalizer,
        flip: bool,
    ) {
        // Byte positions of channel c among 8 pixels: lanes 0-15 of `lo`, then 16-23 (`hi`).
        const Z: i8 = -128; // pshufb: zero this byte
        let shuffles = |c: i8| {
            let mut lo = [Z; 16];
            let mut hi = [Z; 16];
            for p in 0..8i8 {
                let at = 3 * p + c;
                if at < 16 {
                    lo[p as usize] = at;
                } else {
                    hi[p as usize] = at - 16;
                }
            }
            // SAFETY: plain 16-byte loads of local arrays.
            unsafe {
                (
                    _mm_loadu_si128(lo.as_ptr().cast()),
                    _mm_loadu_si128(hi.as_ptr().cast()),
                )
            }
        };
        let masks = [shuffles(0), shuffles(1), shuffles(2)];
        let scale = n.scale.map(|s| _mm256_set1_ps(s));
        let bias = n.bias.map(|b| _mm256_set1_ps(b));
        let reverse = _mm256_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0);
        let [p0, p1, p2] = planes;
        for (y, row) in src.chunks_exact(3 * w).enumerate() {
            let at = y * w..(y + 1) * w;
            let outs = [
                p0[at.clone()].as_mut_ptr(),
                p1[at.clone()].as_mut_ptr(),
                p2[at].as_mut_ptr(),
            ];
            let mut x = 0;
            while x + 8 <= w {
                // SAFETY: bytes 3x .. 3x + 24 <= 3w are inside `row`; floats x .. x + 8 (or their
                // mirror w - x - 8 .. w - x) are inside every output row.
                unsafe {
                    let lo = _mm_loadu_si128(row.as_ptr().add(3 * x).cast());
                    let hi = _mm_loadl_epi64(row.as_ptr().add(3 * x + 16).cast());
                    for c in 0..3 {
                        let (ml, mh) = masks[c];
                        let bytes =
                            _mm_or_si128(_mm_shuffle_epi8(lo, ml), _mm_shuffle_epi8(hi, mh));
                        let v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
                        let v = _mm256_add_ps(_mm256_mul_ps(v, scale[c]), bias[c]);
                        if flip {
                            let v = _mm256_permutevar8x32_ps(v, reverse);
                            _mm256_storeu_ps(outs[c].add(w - x - 8), v);
                        } else {
                            _mm256_storeu_ps(outs[c].add(x), v);
                        }
                    }
                }
                x += 8;
            }
            for x in x..w {
                let at = if flip { w - 1 - x } else { x };
                for (c, &o) in outs.iter().enumerate() {
                    // SAFETY: `at < w`, inside every output row.
                    unsafe { *o.add(at) = n.value(c, row[3 * x + c]) };
                }
            }
        }
    }
}

/// Channel `C` of the HWC image `src` (rows of `w` pixels) into the plane `out`.
#[inline(always)]
fn channel<const C: usize>(
    src: &[u8],
    w: usize,
    out: &mut [f32],
    scale: f32,
    bias: f32,
    flip: bool,
) {
    for (row, o) in src.chunks_exact(3 * w).zip(out.chunks_exact_mut(w)) {
        if flip {
            for (v, px) in o.iter_mut().rev().zip(row.chunks_exact(3)) {
                *v = px[C] as f32 * scale + bias;
            }
        } else {
            for (v, px) in o.iter_mut().zip(row.chunks_exact(3)) {
                *v = px[C] as f32 * scale + bias;
            }
        }
    }
}

/// Mirrors a `w` x `h` RGB image (HWC) horizontally in place.
pub fn flip_hwc_in_place(img: &mut [u8], w: usize, h: usize) {
    for row in img[..w * h * 3].chunks_exact_mut(w * 3) {
        let (mut a, mut b) = (0, w - 1);
        while a < b {
            for c in 0..3 {
                row.swap(a * 3 + c, b * 3 + c);
            }
            a += 1;
            b -= 1;
        }
    }
}

/// Settings of a [`Transformer`].
#[derive(Clone, Copy, Debug)]
pub struct TransformConfig {
    /// Output side in pixels (224).
    pub size: u32,
    /// Train or eval geometry.
    pub augment: Augment,
    /// Output type and layout.
    pub output: Output,
    /// Channel means for [`Output::F32Nchw`].
    pub mean: [f32; 3],
    /// Channel standard deviations for [`Output::F32Nchw`].
    pub std: [f32; 3],
    /// Seed of the crop and flip draws.
    pub seed: u64,
    /// The train transform's crop and flip settings.
    pub train: TrainAugment,
    /// How much of each JPEG to decode.
    pub decode: DecodeMode,
}

/// The destination of one image: its slot in a batch buffer.
#[derive(Debug)]
pub enum Slot<'a> {
    /// `3 * size * size` floats, CHW.
    F32(&'a mut [f32]),
    /// `size * size * 3` bytes, HWC.
    U8(&'a mut [u8]),
}

/// What a [`Transformer`] did with one image (for statistics and tests).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Applied {
    /// Crop in source pixels: left, top, width, height.
    pub crop: [f64; 4],
    /// Whether the image was mirrored.
    pub flipped: bool,
    /// DCT scaling denominator used.
    pub denom: u32,
    /// Pixels decoded (region width x height).
    pub decoded_pixels: u64,
}

/// One worker's decoder, resizer and scratch buffers, reused for every image it processes.
pub struct Transformer {
    cfg: TransformConfig,
    decoder: JpegDecoder,
    resizer: fir::Resizer,
    resized: Vec<u8>,
    normalizer: Normalizer,
}

impl std::fmt::Debug for Transformer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transformer")
            .field("cfg", &self.cfg)
            .finish()
    }
}

impl Transformer {
    /// Creates a worker's transformer. Fails if `size` is zero, an eval `resize` is smaller
    /// than `size`, a std is not positive, or libjpeg-turbo cannot create a handle.
    pub fn new(cfg: TransformConfig) -> Result<Transformer, DecodeError> {
        if cfg.size == 0 {
            return Err(DecodeError("output size must be positive".to_string()));
        }
        if let Augment::Eval { resize } = cfg.augment {
            if resize < cfg.size {
                return Err(DecodeError(format!(
                    "eval resize {resize} is smaller than the crop size {}",
                    cfg.size
                )));
            }
        }
        if cfg
            .std
            .iter()
            .any(|&s| s.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater))
        {
            return Err(DecodeError(format!("std {:?} must be positive", cfg.std)));
        }
        let n = cfg.size as usize * cfg.size as usize * 3;
        Ok(Transformer {
            decoder: JpegDecoder::new()?,
            resizer: fir::Resizer::new(),
            resized: if cfg.output == Output::F32Nchw {
                vec![0; n]
            } else {
                Vec::new()
            },
            normalizer: Normalizer::new(cfg.mean, cfg.std),
            cfg,
        })
    }

    /// Number of elements (floats or bytes) of one image in a batch.
    pub fn image_len(&self) -> usize {
        3 * self.cfg.size as usize * self.cfg.size as usize
    }

    /// The crop and flip for image `id` of size `width` x `height` in `epoch`.
    pub fn geometry(&self, width: u32, height: u32, epoch: u64, id: u64) -> ([f64; 4], bool) {
        match self.cfg.augment {
            Augment::Train => {
                let t = self.cfg.train;
                let mut rng = ImageRng::new(self.cfg.seed, epoch, id);
                let win = random_resized_crop(width, height, t.scale, t.ratio, &mut rng);
                let flip = rng.unit() < t.flip;
                (win.rect(), flip)
            }
            Augment::Eval { resize } => (
                resize_center_crop(width, height, resize, self.cfg.size),
                false,
            ),
        }
    }

    /// Decodes `jpeg`, crops, resizes, flips and writes it into `slot`.
    ///
    /// `slot` must be exactly [`Transformer::image_len`] elements of the configured output
    /// type; a mismatch is reported as an error.
    pub fn apply(
        &mut self,
        jpeg: &[u8],
        epoch: u64,
        id: u64,
        slot: Slot<'_>,
    ) -> Result<Applied, DecodeError> {
        let size = self.cfg.size;
        let n = self.image_len();
        let header = self.decoder.header(jpeg)?;
        let (crop, flipped) = self.geometry(header.width, header.height, epoch, id);
        let p = plan(&header, crop, (size, size), self.cfg.decode);
        let decoded = self.decoder.decode(jpeg, &p)?;
        let src = fir::images::TypedImageRef::<U8x3>::from_buffer(p.region.w, p.region.h, decoded)
            .map_err(|e| DecodeError(format!("decoded image: {e}")))?;
        let [cl, ct, cw, ch] = p.crop;
        let opts = fir::ResizeOptions::new()
            .resize_alg(fir::ResizeAlg::Convolution(fir::FilterType::Bilinear))
            .crop(cl, ct, cw, ch);
        let s = size as usize;
        match slot {
            Slot::U8(dst) => {
                if dst.len() != n {
                    return Err(DecodeError(format!(
                        "slot of {} bytes, need {n}",
                        dst.len()
                    )));
                }
                let mut img = fir::images::TypedImage::<U8x3>::from_buffer(size, size, dst)
                    .map_err(|e| DecodeError(format!("output slot: {e}")))?;
                self.resizer
                    .resize_typed(&src, &mut img, &opts)
                    .map_err(|e| DecodeError(format!("resize: {e}")))?;
                if flipped {
                    flip_hwc_in_place(dst, s, s);
                }
            }
            Slot::F32(dst) => {
                if dst.len() != n {
                    return Err(DecodeError(format!(
                        "slot of {} floats, need {n}",
                        dst.len()
                    )));
                }
                self.resized.resize(n, 0);
                let mut img =
                    fir::images::TypedImage::<U8x3>::from_buffer(size, size, &mut self.resized)
                        .map_err(|e| DecodeError(format!("scratch image: {e}")))?;
                self.resizer
                    .resize_typed(&src, &mut img, &opts)
                    .map_err(|e| DecodeError(format!("resize: {e}")))?;
                self.normalizer.write_chw(&self.resized, s, s, flipped, dst);
            }
        }
        Ok(Applied {
            crop,
            flipped,
            denom: p.denom,
            decoded_pixels: p.region.w as u64 * p.region.h as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rrc_statistics_match_torchvision() {
        let (w, h) = (500u32, 375u32);
        let n = 20_000;
        let mut areas = Vec::with_capacity(n);
        let mut log_ratios = Vec::with_capacity(n);
        for id in 0..n as u64 {
            let mut rng = ImageRng::new(1, 0, id);
            let c = random_resized_crop(w, h, (0.08, 1.0), (0.75, 4.0 / 3.0), &mut rng);
            assert!(c.width >= 1 && c.height >= 1);
            assert!(c.left + c.width <= w && c.top + c.height <= h, "{c:?}");
            areas.push((c.width * c.height) as f64 / (w * h) as f64);
            log_ratios.push((c.width as f64 / c.height as f64).ln());
        }
        let min_area = areas.iter().cloned().fold(f64::MAX, f64::min);
        assert!(min_area > 0.075, "{min_area}");
        let lr = (0.75f64.ln() - 0.01, (4.0f64 / 3.0).ln() + 0.01);
        let in_range = log_ratios
            .iter()
            .filter(|&&r| r >= lr.0 && r <= lr.1)
            .count();
        // The only windows outside the ratio range come from rounding on tiny crops.
        assert!(in_range as f64 > 0.99 * n as f64);
        // Reference: torchvision's get_params re-implemented in Python with `random`, 200,000
        // draws on 500 x 375: mean area fraction 0.4329, P(area < 0.3) = 0.3227.
        let mean: f64 = areas.iter().sum::<f64>() / n as f64;
        assert!((0.425..0.441).contains(&mean), "mean area fraction {mean}");
        let small = areas.iter().filter(|&&a| a < 0.3).count() as f64 / n as f64;
        assert!((0.31..0.335).contains(&small), "P(area < 0.3) = {small}");
    }

    #[test]
    fn rrc_fallback_is_clamped_center_crop() {
        // A 1000 x 10 strip: no attempt can fit (height 10 allows areas of at most 10 x 13),
        // so the fallback center-crops with the ratio clamped to 4/3.
        let mut rng = ImageRng::new(3, 1, 4);
        let c = random_resized_crop(1000, 10, (0.08, 1.0), (0.75, 4.0 / 3.0), &mut rng);
        assert_eq!(
            c,
            CropWindow {
                top: 0,
                left: 493,
                height: 10,
                width: 13
            }
        );
        // And the tall strip: width kept, height = round(w / (3/4)).
        let mut rng = ImageRng::new(3, 1, 4);
        let c = random_resized_crop(9, 1000, (0.08, 1.0), (0.75, 4.0 / 3.0), &mut rng);
        assert_eq!(
            c,
            CropWindow {
                top: 494,
                left: 0,
                height: 12,
                width: 9
            }
        );
        // Scale 1 with ratio exactly the image's: every attempt fits the whole image.
        let mut rng = ImageRng::new(3, 1, 4);
        let c = random_resized_crop(400, 300, (1.0, 1.0), (4.0 / 3.0, 4.0 / 3.0), &mut rng);
        assert_eq!(
            c,
            CropWindow {
                top: 0,
                left: 0,
                height: 300,
                width: 400
            }
        );
    }

    #[test]
    fn rng_is_counter_based_and_deterministic() {
        let mut a = ImageRng::new(9, 2, 77);
        let mut b = ImageRng::new(9, 2, 77);
        let xs: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..8).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        assert_ne!(ImageRng::new(9, 3, 77).next_u64(), xs[0]);
        assert_ne!(ImageRng::new(9, 2, 78).next_u64(), xs[0]);
    }

    #[test]
    fn eval_geometry_matches_torchvision() {
        // 500 x 375 -> Resize(256): 341 x 256; CenterCrop(224): left round(58.5)=58, top 16.
        let r = resize_center_crop(500, 375, 256, 224);
        let s = 256.0 / 375.0;
        let sx = 341.0 / 500.0;
        assert!((r[0] - 58.0 / sx).abs() < 1e-9);
        assert!((r[1] - 16.0 / s).abs() < 1e-9);
        assert!((r[2] - 224.0 / sx).abs() < 1e-9);
        assert!((r[3] - 224.0 / s).abs() < 1e-9);
    }

    #[test]
    fn normalizer_values() {
        let n = Normalizer::new(IMAGENET_MEAN, IMAGENET_STD);
        assert!((n.value(0, 0) - (-0.485 / 0.229)).abs() < 1e-6);
        assert!((n.value(1, 255) - ((1.0 - 0.456) / 0.224)).abs() < 1e-6);
        assert!((n.value(2, 128) - ((128.0 / 255.0 - 0.406) / 0.225)).abs() < 1e-6);
        let src = [10u8, 20, 30, 40, 50, 60];
        let mut out = [0f32; 6];
        n.write_chw(&src, 2, 1, true, &mut out);
        assert_eq!(out[0], n.value(0, 40));
        assert_eq!(out[1], n.value(0, 10));
        assert_eq!(out[3], n.value(1, 20));
        assert_eq!(out[4], n.value(2, 60));
    }

    #[test]
    fn write_chw_computes_value_for_every_pixel() {
        let n = Normalizer::new(IMAGENET_MEAN, IMAGENET_STD);
        for (w, h) in [(1, 1), (7, 3), (8, 2), (17, 5), (224, 4)] {
            let src: Vec<u8> = (0..w * h * 3).map(|i| (i * 97 % 256) as u8).collect();
            for flip in [false, true] {
                let mut out = vec![f32::NAN; 3 * w * h + 5];
                n.write_chw(&src, w, h, flip, &mut out);
                for y in 0..h {
                    for x in 0..w {
                        let sx = if flip { w - 1 - x } else { x };
                        for c in 0..3 {
                            let want = n.value(c, src[(y * w + sx) * 3 + c]);
                            let got = out[c * w * h + y * w + x];
                            assert_eq!(got.to_bits(), want.to_bits(), "{w}x{h} flip {flip}");
                        }
                    }
                }
                assert!(
                    out[3 * w * h..].iter().all(|v| v.is_nan()),
                    "wrote past the image"
                );
            }
        }
    }

    #[test]
    fn flip_in_place() {
        let mut img = vec![1u8, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 5, 5, 5, 6, 6, 6];
        flip_hwc_in_place(&mut img, 3, 2);
        assert_eq!(
            img,
            vec![3, 3, 3, 2, 2, 2, 1, 1, 1, 6, 6, 6, 5, 5, 5, 4, 4, 4]
        );
    }
}
