//! One image through the evaluation transform outside a pipeline, for inference
//! (`ddl-predict`): the decode, `Resize(resize)` + `CenterCrop(size)` and normalisation of an
//! eval batch ([`Augment::Eval`]), from the bytes of an image file.
//!
//! JPEGs go straight to the transform, as records of a shard do. Anything else (PNG, a CMYK
//! JPEG, ...) is first converted the way `ddl-pack` stores it (decoded to RGB, re-encoded as a
//! baseline JPEG at its default quality, full size), so that the model sees the pixels it would
//! have seen from a packed dataset.

use crate::decode::{DecodeError, DecodeMode};
use crate::pack::convert::{convert, ConvertOptions};
use crate::transform::{Augment, Output, Slot, TrainAugment, TransformConfig, Transformer};

/// `ddl-pack`'s default JPEG quality for re-encoded images.
const PACK_QUALITY: u8 = 90;

/// The evaluation transform of one model: reuse it for every image.
#[derive(Debug)]
pub struct EvalTransform {
    transformer: Transformer,
}

impl EvalTransform {
    /// The transform to `size` x `size` float32 CHW after resizing the shorter side to
    /// `resize`, normalised with `mean` and `std` (RGB, 0-1 scale). Fails as
    /// [`Transformer::new`] does (size 0, `resize < size`, a std not positive).
    pub fn new(
        size: u32,
        resize: u32,
        mean: [f32; 3],
        std: [f32; 3],
    ) -> Result<EvalTransform, DecodeError> {
        let transformer = Transformer::new(TransformConfig {
            size,
            augment: Augment::Eval { resize },
            output: Output::F32Nchw,
            mean,
            std,
            seed: 0,
            train: TrainAugment::default(),
            decode: DecodeMode::default(),
        })?;
        Ok(EvalTransform { transformer })
    }

    /// Number of floats of one image (3 x size x size).
    pub fn image_len(&self) -> usize {
        self.transformer.image_len()
    }

    /// The image in `bytes` (any format ddl-pack reads), transformed into `out`
    /// ([`EvalTransform::image_len`] floats, CHW).
    pub fn apply(&mut self, bytes: &[u8], out: &mut [f32]) -> Result<(), DecodeError> {
        let direct = self.transformer.apply(bytes, 0, 0, Slot::F32(out));
        let Err(direct) = direct else {
            return Ok(());
        };
        let opts = ConvertOptions {
            max_short_side: 0,
            quality: PACK_QUALITY,
            reencode: true,
        };
        let converted = convert(bytes, &opts).map_err(|skip| {
            DecodeError(format!(
                "{} ({}); as a JPEG: {direct}",
                skip.reason.as_str(),
                skip.detail
            ))
        })?;
        self.transformer
            .apply(&converted.bytes, 0, 0, Slot::F32(out))
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transform::{IMAGENET_MEAN, IMAGENET_STD};
    use image::ImageEncoder;

    /// Smooth gradients: what JPEG keeps well, whatever its quality and subsampling.
    fn rgb(w: usize, h: usize) -> Vec<u8> {
        (0..h)
            .flat_map(|y| (0..w).flat_map(move |x| [x * 6, y * 8, (x + y) * 3]))
            .map(|v| v.min(255) as u8)
            .collect()
    }

    #[test]
    fn jpeg_and_png_of_the_same_pixels_agree() {
        let (w, h) = (40, 30);
        let pixels = rgb(w, h);
        let jpeg = ddl_testkit::encode_jpeg(&pixels, w, h, 95, ddl_testkit::Subsamp::None);
        let mut png = Vec::new();
        image::codecs::png::PngEncoder::new(&mut png)
            .write_image(&pixels, w as u32, h as u32, image::ExtendedColorType::Rgb8)
            .unwrap();
        let mut t = EvalTransform::new(16, 18, IMAGENET_MEAN, IMAGENET_STD).unwrap();
        assert_eq!(t.image_len(), 3 * 16 * 16);
        let mut a = vec![0f32; t.image_len()];
        let mut b = vec![0f32; t.image_len()];
        t.apply(&jpeg, &mut a).unwrap();
        t.apply(&png, &mut b).unwrap();
        // Two JPEG encodings of the same pixels: close, not equal.
        let mean = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).sum::<f32>() / a.len() as f32;
        assert!(mean < 0.05, "mean difference {mean}");
        assert!(a.iter().any(|&v| v != a[0]), "a real image, not a constant");
        let e = t.apply(b"not an image", &mut a).unwrap_err().to_string();
        assert!(e.contains("not an image"), "{e}");
    }
}
