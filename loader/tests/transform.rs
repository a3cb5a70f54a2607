//! Transform correctness on known images: where crops land, flips, decode modes.

use crate::common;

use ddl_loader::decode::DecodeMode;
use ddl_loader::transform::{
    Augment, Output, Slot, TrainAugment, TransformConfig, Transformer, IMAGENET_MEAN, IMAGENET_STD,
};

/// Four vertical stripes of 16 columns each: red, green, blue, white; 64 x 48.
fn stripes() -> Vec<u8> {
    let colours = [[255u8, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 255]];
    let rgb: Vec<u8> = (0..64 * 48).flat_map(|i| colours[(i % 64) / 16]).collect();
    common::jpeg(&rgb, 64, 48)
}

fn cfg(size: u32, augment: Augment, decode: DecodeMode) -> TransformConfig {
    TransformConfig {
        size,
        augment,
        output: Output::U8Nhwc,
        mean: IMAGENET_MEAN,
        std: IMAGENET_STD,
        seed: 1,
        train: TrainAugment::default(),
        decode,
    }
}

fn pixel(img: &[u8], size: usize, x: usize, y: usize) -> [u8; 3] {
    let i = (y * size + x) * 3;
    [img[i], img[i + 1], img[i + 2]]
}

fn near(a: [u8; 3], b: [u8; 3]) -> bool {
    a.iter()
        .zip(&b)
        .all(|(&x, &y)| (x as i32 - y as i32).abs() <= 12)
}

#[test]
fn eval_center_crop_lands_where_expected() {
    // Resize(48) keeps 64 x 48; CenterCrop(48) keeps columns 8..56: 8 red, 16 green,
    // 16 blue, 8 white.
    for mode in [DecodeMode::Full, DecodeMode::Scaled, DecodeMode::Region] {
        let mut t = Transformer::new(cfg(48, Augment::Eval { resize: 48 }, mode)).unwrap();
        let mut out = vec![0u8; 48 * 48 * 3];
        let applied = t.apply(&stripes(), 0, 0, Slot::U8(&mut out)).unwrap();
        assert_eq!(applied.crop, [8.0, 0.0, 48.0, 48.0]);
        assert!(!applied.flipped);
        for (x, want) in [
            (3, [255, 0, 0]),
            (16, [0, 255, 0]),
            (31, [0, 0, 255]),
            (44, [255, 255, 255]),
        ] {
            for y in [0, 24, 47] {
                let got = pixel(&out, 48, x, y);
                assert!(near(got, want), "{mode:?} ({x}, {y}): {got:?} vs {want:?}");
            }
        }
    }
    // Downscaled: Resize(24) makes 32 x 24, CenterCrop(16) keeps resized columns 8..24 =
    // source columns 16..48: green then blue, 8 output columns each.
    let mut t =
        Transformer::new(cfg(16, Augment::Eval { resize: 24 }, DecodeMode::Region)).unwrap();
    let mut out = vec![0u8; 16 * 16 * 3];
    t.apply(&stripes(), 0, 0, Slot::U8(&mut out)).unwrap();
    assert!(near(pixel(&out, 16, 2, 8), [0, 255, 0]));
    assert!(near(pixel(&out, 16, 13, 8), [0, 0, 255]));
}

#[test]
fn train_flip_mirrors_the_crop() {
    // Red grows with x, green with y: a flipped crop has red falling left to right.
    let (w, h) = (200usize, 150usize);
    let rgb: Vec<u8> = (0..w * h)
        .flat_map(|i| [((i % w) * 255 / w) as u8, ((i / w) * 255 / h) as u8, 90])
        .collect();
    let jpeg = common::jpeg(&rgb, w, h);
    let mut t = Transformer::new(cfg(32, Augment::Train, DecodeMode::Region)).unwrap();
    let mut out = vec![0u8; 32 * 32 * 3];
    let (mut flips, mut plain) = (0, 0);
    for id in 0..40 {
        let a = t.apply(&jpeg, 2, id, Slot::U8(&mut out)).unwrap();
        assert_eq!(t.geometry(w as u32, h as u32, 2, id), (a.crop, a.flipped));
        let left = pixel(&out, 32, 0, 16)[0] as i32;
        let right = pixel(&out, 32, 31, 16)[0] as i32;
        if a.flipped {
            flips += 1;
            assert!(
                left > right,
                "id {id}: flipped but red rises ({left} -> {right})"
            );
        } else {
            plain += 1;
            assert!(
                left < right,
                "id {id}: not flipped but red falls ({left} -> {right})"
            );
        }
        assert!(pixel(&out, 32, 16, 0)[1] < pixel(&out, 32, 16, 31)[1]);
        // The crop's mean red matches the source region it covers.
        let [cl, _, cw, _] = a.crop;
        let want = ((cl + cw / 2.0) * 255.0 / w as f64) as i32;
        let got = (0..32)
            .map(|x| pixel(&out, 32, x, 16)[0] as i32)
            .sum::<i32>()
            / 32;
        assert!(
            (got - want).abs() <= 6,
            "id {id}: mean red {got}, expected {want}"
        );
    }
    assert!(flips > 8 && plain > 8, "{flips} flipped of 40");
}

#[test]
fn decode_modes_agree_closely() {
    // Smooth image, 480 x 360: scaled and region decoding change pixels only slightly.
    let (w, h) = (480usize, 360usize);
    let rgb: Vec<u8> = (0..w * h)
        .flat_map(|i| {
            let (x, y) = ((i % w) as f64, (i / w) as f64);
            [
                (127.0 + 100.0 * (x / 40.0).sin()) as u8,
                (127.0 + 100.0 * (y / 30.0).cos()) as u8,
                ((x + y) * 255.0 / 840.0) as u8,
            ]
        })
        .collect();
    let jpeg = common::jpeg(&rgb, w, h);
    let mut outs = Vec::new();
    for mode in [DecodeMode::Full, DecodeMode::Scaled, DecodeMode::Region] {
        let mut t = Transformer::new(cfg(64, Augment::Train, mode)).unwrap();
        let mut all = Vec::new();
        let mut denoms = Vec::new();
        for id in 0..20 {
            let mut out = vec![0u8; 64 * 64 * 3];
            let a = t.apply(&jpeg, 0, id, Slot::U8(&mut out)).unwrap();
            denoms.push(a.denom);
            all.extend(out);
        }
        if mode != DecodeMode::Full {
            assert!(
                denoms.iter().any(|&d| d > 1),
                "{mode:?} never scaled: {denoms:?}"
            );
        }
        outs.push(all);
    }
    let mean_abs = |a: &[u8], b: &[u8]| {
        a.iter()
            .zip(b)
            .map(|(&x, &y)| (x as i32 - y as i32).abs() as f64)
            .sum::<f64>()
            / a.len() as f64
    };
    let full_vs_scaled = mean_abs(&outs[0], &outs[1]);
    let scaled_vs_region = mean_abs(&outs[1], &outs[2]);
    assert!(full_vs_scaled < 3.0, "full vs scaled: {full_vs_scaled}");
    assert!(
        scaled_vs_region < 0.5,
        "scaled vs region: {scaled_vs_region}"
    );
}

#[test]
fn f32_output_is_normalized_chw() {
    let jpeg = common::solid_jpeg([200, 100, 50], 80, 60);
    let mut t = Transformer::new(TransformConfig {
        output: Output::F32Nchw,
        ..cfg(16, Augment::Train, DecodeMode::Region)
    })
    .unwrap();
    let mut out = vec![0f32; 3 * 16 * 16];
    t.apply(&jpeg, 0, 3, Slot::F32(&mut out)).unwrap();
    for (c, v) in [200f32, 100.0, 50.0].iter().enumerate() {
        let want = (v / 255.0 - IMAGENET_MEAN[c]) / IMAGENET_STD[c];
        for &x in &out[c * 256..(c + 1) * 256] {
            assert!((x - want).abs() < 0.05, "channel {c}: {x} vs {want}");
        }
    }
    // A slot of the wrong size is an error, not a panic.
    let mut short = vec![0f32; 10];
    assert!(t.apply(&jpeg, 0, 3, Slot::F32(&mut short)).is_err());
}

// Augmentation a recipe sets -----------------------------------------------------------------

/// A gradient image: red grows with x, green with y, so crops and flips show in the pixels.
fn gradient(w: usize, h: usize) -> Vec<u8> {
    let rgb: Vec<u8> = (0..w * h)
        .flat_map(|i| [((i % w) * 255 / w) as u8, ((i / w) * 255 / h) as u8, 90])
        .collect();
    common::jpeg(&rgb, w, h)
}

fn train(size: u32, train: TrainAugment) -> Transformer {
    Transformer::new(TransformConfig {
        train,
        ..cfg(size, Augment::Train, DecodeMode::Region)
    })
    .unwrap()
}

#[test]
fn crop_scale_and_ratio_follow_the_settings() {
    // Scale (1, 1) at the image's own aspect: the whole image, every time.
    let whole = train(
        32,
        TrainAugment {
            scale: (1.0, 1.0),
            ratio: (4.0 / 3.0, 4.0 / 3.0),
            ..TrainAugment::default()
        },
    );
    for id in 0..200 {
        assert_eq!(whole.geometry(400, 300, 0, id).0, [0.0, 0.0, 400.0, 300.0]);
    }
    // A narrow ratio range: every crop 2:1 (up to the rounding of its sides), of 10-30% of
    // the area; the defaults give no crop that wide.
    let wide = train(
        32,
        TrainAugment {
            scale: (0.1, 0.3),
            ratio: (2.0, 2.0),
            ..TrainAugment::default()
        },
    );
    let default = train(32, TrainAugment::default());
    for id in 0..500 {
        let [_, _, w, h] = wide.geometry(400, 300, 1, id).0;
        assert!((w / h - 2.0).abs() < 0.05, "{w} x {h}");
        let area = w * h / (400.0 * 300.0);
        assert!((0.095..0.305).contains(&area), "area {area}");
        let [_, _, w, h] = default.geometry(400, 300, 1, id).0;
        assert!(w / h < 1.4, "default {w} x {h}");
    }
}

#[test]
fn flip_probability_0_never_flips_and_1_always_does() {
    // The crop is the whole image whatever the draws, so the only difference is the flip.
    let fixed = |flip| TrainAugment {
        scale: (1.0, 1.0),
        ratio: (4.0 / 3.0, 4.0 / 3.0),
        flip,
    };
    let jpeg = gradient(64, 48);
    let (mut never, mut always) = (train(24, fixed(0.0)), train(24, fixed(1.0)));
    let n = 24 * 24 * 3;
    for id in 0..64 {
        let (mut plain, mut mirrored) = (vec![0u8; n], vec![0u8; n]);
        let a = never.apply(&jpeg, 0, id, Slot::U8(&mut plain)).unwrap();
        let b = always.apply(&jpeg, 0, id, Slot::U8(&mut mirrored)).unwrap();
        assert!(!a.flipped && b.flipped, "id {id}");
        // Red grows left to right in the unflipped decode, falls in the flipped one.
        assert!(pixel(&plain, 24, 2, 12)[0] < pixel(&plain, 24, 21, 12)[0]);
        ddl_loader::transform::flip_hwc_in_place(&mut plain, 24, 24);
        assert_eq!(
            plain, mirrored,
            "id {id}: p = 1 is the mirror of the unflipped decode"
        );
    }
}

#[test]
fn mean_and_std_set_the_float_output() {
    let jpeg = gradient(64, 48);
    let (mean, std) = ([0.1f32, 0.5, 0.9], [0.5f32, 2.0, 0.125]);
    let mut bytes = Transformer::new(cfg(16, Augment::Train, DecodeMode::Region)).unwrap();
    let mut floats = Transformer::new(TransformConfig {
        output: Output::F32Nchw,
        mean,
        std,
        ..cfg(16, Augment::Train, DecodeMode::Region)
    })
    .unwrap();
    let mut u8s = vec![0u8; 16 * 16 * 3];
    let mut f32s = vec![0f32; 3 * 16 * 16];
    let a = bytes.apply(&jpeg, 2, 5, Slot::U8(&mut u8s)).unwrap();
    let b = floats.apply(&jpeg, 2, 5, Slot::F32(&mut f32s)).unwrap();
    assert_eq!(a, b, "the same crop and flip");
    for y in 0..16 {
        for x in 0..16 {
            let px = pixel(&u8s, 16, x, y);
            for c in 0..3 {
                let want = (f32::from(px[c]) / 255.0 - mean[c]) / std[c];
                let got = f32s[c * 256 + y * 16 + x];
                assert!(
                    (got - want).abs() < 1e-4,
                    "({x}, {y}) c{c}: {got} vs {want}"
                );
            }
        }
    }
}

#[test]
fn eval_resize_ratio_sets_the_center_crop() {
    use ddl_loader::transform::{eval_resize, EVAL_RESIZE_RATIO};
    // The default ratio is the integer ceil(8 size / 7) of every size.
    for size in 16..=1024 {
        assert_eq!(
            eval_resize(size, EVAL_RESIZE_RATIO),
            (size * 8).div_ceil(7),
            "{size}"
        );
    }
    assert_eq!(eval_resize(224, 1.0), 224);
    assert_eq!(eval_resize(160, 1.5), 240);
    // 64 x 48 at crop 48: ratio 1 keeps the full height and columns 8..56; 8/7 (resize 55)
    // keeps a smaller centre; ratio 2 (resize 96) half the height.
    let crop = |ratio| {
        let resize = eval_resize(48, ratio);
        let mut t =
            Transformer::new(cfg(48, Augment::Eval { resize }, DecodeMode::Region)).unwrap();
        let mut out = vec![0u8; 48 * 48 * 3];
        t.apply(&stripes(), 0, 0, Slot::U8(&mut out)).unwrap().crop
    };
    assert_eq!(crop(1.0), [8.0, 0.0, 48.0, 48.0]);
    let [_, top, _, h] = crop(EVAL_RESIZE_RATIO);
    assert!(h < 48.0 && top > 0.0, "8/7: {h} rows from {top}");
    let [_, top, _, h] = crop(2.0);
    assert_eq!((top, h), (12.0, 24.0));
}
