//! Transform correctness on known images: where crops land, flips, decode modes.

use crate::common;

use ddl_loader::decode::DecodeMode;
use ddl_loader::transform::{
    Augment, Output, Slot, TransformConfig, Transformer, IMAGENET_MEAN, IMAGENET_STD,
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
