//! What the per-image transform is told (the output layout, the augmentation and its
//! parameters, the eval resize), below the transform, the limits that check it and the
//! pipeline; `transform.rs` does the work.

/// Layout and type of the images in a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// float32, normalized with the configured mean and std, batch x 3 x size x size.
    F32Nchw,
    /// uint8 RGB as decoded, batch x size x size x 3 (normalize on the accelerator).
    U8Nhwc,
}

/// Which geometric transform to apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Augment {
    /// RandomResizedCrop and a horizontal flip, as [`TrainAugment`] sets them.
    Train,
    /// Resize the shorter side to `resize`, then center-crop `size` x `size`.
    Eval {
        /// Shorter side after resizing (256 for the usual 224 crop); at least the crop size.
        resize: u32,
    },
}

/// ImageNet channel means (RGB, on the 0-1 scale).
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
/// ImageNet channel standard deviations (RGB, on the 0-1 scale).
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// The random draws of the train transform: what a recipe sets of torchvision's
/// `RandomResizedCrop(size, scale, ratio)` and `RandomHorizontalFlip(p)`. The default is
/// torchvision's; [`crate::limits::check_augment`] checks a user's values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrainAugment {
    /// Range of the crop's area as a fraction of the image's, `0 < lo <= hi <= 1`.
    pub scale: (f64, f64),
    /// Range of the crop's aspect ratio (width / height), drawn log-uniformly, `0 < lo <= hi`.
    pub ratio: (f64, f64),
    /// Probability of a horizontal flip, in `[0, 1]`.
    pub flip: f64,
}

impl Default for TrainAugment {
    /// torchvision's: scale 0.08-1, ratio 3/4-4/3, flip with p = 0.5.
    fn default() -> Self {
        TrainAugment {
            scale: (0.08, 1.0),
            ratio: (0.75, 4.0 / 3.0),
            flip: 0.5,
        }
    }
}

/// The eval resize ratio every recipe started from: resize to 256 for a 224 crop.
pub const EVAL_RESIZE_RATIO: f64 = 8.0 / 7.0;

/// The shorter side an eval image is resized to before its `size` center crop:
/// `ceil(size x ratio)`, a product within 1e-9 of an integer counting as that integer (so
/// that 8/7 gives 256 for 224, as the integer `ceil(8 size / 7)` does, whatever the rounding
/// of 8/7 as a float).
pub fn eval_resize(size: u32, ratio: f64) -> u32 {
    let x = f64::from(size) * ratio;
    let near = x.round();
    let px = if (x - near).abs() <= 1e-9 * x.max(1.0) {
        near
    } else {
        x.ceil()
    };
    px.clamp(f64::from(size), f64::from(u32::MAX)) as u32
}
