//! `ddl-synth`: writes a small ImageNet-style tree of real JPEGs whose content depends on the
//! class, so that packing, loading and training run end to end without ImageNet.
//!
//! Layouts written (conventions that `ddl-pack` reads):
//! - [`Layout::Tree`], ILSVRC-2012 / Kaggle: `OUT/train/<wnid>/<wnid>_<i>.JPEG`,
//!   `OUT/val/ILSVRC2012_val_<8 digits>.JPEG` (flat) and `OUT/LOC_val_solution.csv`
//!   (`ImageId,PredictionString`, first token of the prediction string is the wnid).
//! - [`Layout::Tars`], ImageNet-22k: `OUT/<wnid>.tar` per class holding `<wnid>_<i>.JPEG`, no
//!   validation split. Class sizes are uneven (between half and one and a half times
//!   `per_class`, at least 1), and the first three classes' tars each hold one odd member, as
//!   the real tars do now and then: class 0 a non-image file (`<wnid>_notes.txt`, which
//!   ddl-pack ignores), class 1 a JPEG cut short (`<wnid>_truncated.JPEG`, skipped and
//!   reported), class 2 a PNG under a JPEG name (`<wnid>_png.JPEG`, converted).
//!
//! Each class has its own hue, stripe orientation and stripe frequency; every image gets a random
//! size (sides 200-500), phase, brightness, noise and a distractor rectangle. Encodings vary the
//! way a real crawl does: 4:2:0 and 4:4:4 chroma subsampling, baseline and progressive, quality
//! 75-95, and a few grayscale images.

use std::fs;
use std::io::{Cursor, Write};
use std::path::Path;

use anyhow::{Context, Result};
use rayon::prelude::*;
use turbojpeg::{Compressor, Image, PixelFormat, Subsamp};

/// Which layout to write (see the module documentation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Layout {
    /// ILSVRC-2012 folder tree with a flat, CSV-labelled validation folder.
    #[default]
    Tree,
    /// One ImageNet-22k-style tar per class, no validation split.
    Tars,
}

/// What to generate.
#[derive(Clone, Debug)]
pub struct SynthConfig {
    /// Layout.
    pub layout: Layout,
    /// Number of classes.
    pub classes: usize,
    /// Training images per class (the mean, for [`Layout::Tars`]).
    pub per_class: usize,
    /// Validation images per class ([`Layout::Tree`] only).
    pub val_per_class: usize,
    /// Seed of every random choice; the same seed gives byte-identical files.
    pub seed: u64,
    /// Smallest image side in pixels.
    pub min_side: usize,
    /// Largest image side in pixels.
    pub max_side: usize,
}

impl Default for SynthConfig {
    fn default() -> Self {
        SynthConfig {
            layout: Layout::Tree,
            classes: 10,
            per_class: 100,
            val_per_class: 20,
            seed: 0,
            min_side: 200,
            max_side: 500,
        }
    }
}

/// Counts of what [`generate`] wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SynthSummary {
    /// Training JPEGs written.
    pub train_images: usize,
    /// Validation JPEGs written.
    pub val_images: usize,
    /// Odd tar members written ([`Layout::Tars`]: a text file, a cut-short JPEG, a PNG).
    pub odd_files: usize,
    /// Bytes of all JPEGs written.
    pub bytes: u64,
    /// The cut-short JPEG ([`Layout::Tars`] with 2 classes or more) and the number of
    /// image-named inputs beside it: ddl-pack skips it, so the tree needs a
    /// `--max-skip-fraction` of at least one in that many.
    pub damaged: Option<(String, usize)>,
}

/// The synthetic WordNet id of class `c`; ids sort in class order, like real wnids do.
pub fn wnid(c: usize) -> String {
    format!("n{:08}", 10_000_000 + c * 1_000)
}

/// SplitMix64: a tiny, high-quality generator, so every image depends only on its own seed.
struct SplitMix(u64);

impl SplitMix {
    fn new(seed: u64) -> Self {
        SplitMix(seed)
    }
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Uniform in [lo, hi].
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }
}

/// RGB in [0, 1] of a fully saturated hue in [0, 1).
fn hue_rgb(h: f32) -> [f32; 3] {
    let h6 = (h.fract() * 6.0).max(0.0);
    let x = 1.0 - ((h6 % 2.0) - 1.0).abs();
    match h6 as u32 {
        0 => [1.0, x, 0.0],
        1 => [x, 1.0, 0.0],
        2 => [0.0, 1.0, x],
        3 => [0.0, x, 1.0],
        4 => [x, 0.0, 1.0],
        _ => [1.0, 0.0, x],
    }
}

/// Renders and encodes one image of class `class`; returns the JPEG bytes.
fn render(cfg: &SynthConfig, class: usize, seed: u64) -> Result<Vec<u8>> {
    let mut rng = SplitMix::new(seed);
    let width = rng.range(cfg.min_side, cfg.max_side);
    let height = rng.range(cfg.min_side, cfg.max_side);
    let base = hue_rgb(class as f32 / cfg.classes as f32 + (rng.unit() - 0.5) * 0.04);
    // Orientation and frequency of the stripes are class features too (two orientations that a
    // horizontal flip maps onto themselves, three frequencies).
    let theta = if class % 2 == 0 {
        0.0f32
    } else {
        std::f32::consts::FRAC_PI_2
    };
    let cycles_per_px =
        [1.0 / 10.0, 1.0 / 18.0, 1.0 / 30.0][(class / 2) % 3] * (0.9 + 0.2 * rng.unit());
    let phase = rng.unit() * std::f32::consts::TAU;
    let brightness = 0.75 + 0.25 * rng.unit();
    let (ct, st) = (theta.cos(), theta.sin());
    // A distractor rectangle of a random colour, so that colour alone is not a perfect cue.
    let (rw, rh) = (
        rng.range(width / 8, width / 3),
        rng.range(height / 8, height / 3),
    );
    let (rx, ry) = (rng.range(0, width - rw), rng.range(0, height - rh));
    let rect = hue_rgb(rng.unit());

    let mut pixels = vec![0u8; width * height * 3];
    for y in 0..height {
        for x in 0..width {
            let i = (y * width + x) * 3;
            let noise = (rng.unit() - 0.5) * 0.12;
            let in_rect = x >= rx && x < rx + rw && y >= ry && y < ry + rh;
            let rgb = if in_rect {
                rect
            } else {
                let t = (x as f32 * ct + y as f32 * st) * cycles_per_px * std::f32::consts::TAU;
                let s = 0.5 + 0.5 * (t + phase).sin();
                let shade = brightness * (0.35 + 0.65 * s);
                [base[0] * shade, base[1] * shade, base[2] * shade]
            };
            for k in 0..3 {
                pixels[i + k] = ((rgb[k] + noise).clamp(0.0, 1.0) * 255.0).round() as u8;
            }
        }
    }

    let mut compressor = Compressor::new().context("creating a JPEG compressor")?;
    compressor.set_quality(rng.range(75, 95) as i32)?;
    compressor.set_progressive(rng.unit() < 0.25)?;
    let gray = rng.unit() < 0.05;
    let jpeg = if gray {
        let luma: Vec<u8> = pixels
            .chunks_exact(3)
            .map(|p| (0.299 * p[0] as f32 + 0.587 * p[1] as f32 + 0.114 * p[2] as f32) as u8)
            .collect();
        compressor.set_subsamp(Subsamp::Gray)?;
        compressor.compress_to_vec(Image {
            pixels: &luma[..],
            width,
            pitch: width,
            height,
            format: PixelFormat::GRAY,
        })?
    } else {
        let subsamp = if rng.unit() < 0.7 {
            Subsamp::Sub2x2
        } else {
            Subsamp::None
        };
        compressor.set_subsamp(subsamp)?;
        compressor.compress_to_vec(Image {
            pixels: &pixels[..],
            width,
            pitch: width * 3,
            height,
            format: PixelFormat::RGB,
        })?
    };
    Ok(jpeg)
}

/// Seed of image `index` of `class` in `split` (0 train, 1 val).
fn image_seed(seed: u64, split: u64, class: usize, index: usize) -> u64 {
    let mut rng = SplitMix::new(seed ^ (split << 62) ^ ((class as u64) << 32) ^ index as u64);
    rng.next_u64()
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    f.write_all(bytes)
        .with_context(|| format!("writing {}", path.display()))
}

/// Writes the layout under `out` (created if missing). Parallel with rayon; the output does not
/// depend on the thread count.
pub fn generate(out: &Path, cfg: &SynthConfig) -> Result<SynthSummary> {
    anyhow::ensure!(cfg.classes > 0, "--classes must be at least 1");
    anyhow::ensure!(
        cfg.min_side >= 16 && cfg.min_side <= cfg.max_side,
        "image sides must satisfy 16 <= min ({}) <= max ({})",
        cfg.min_side,
        cfg.max_side
    );
    match cfg.layout {
        Layout::Tree => generate_tree(out, cfg),
        Layout::Tars => generate_tars(out, cfg),
    }
}

/// Number of images of class `class` in [`Layout::Tars`]: between half and one and a half times
/// `per_class`, at least 1.
pub fn tar_class_size(cfg: &SynthConfig, class: usize) -> usize {
    let spread = SplitMix::new(cfg.seed ^ 0x7A25 ^ ((class as u64) << 20)).next_u64();
    (cfg.per_class / 2 + (spread % (cfg.per_class as u64 + 1)) as usize).max(1)
}

/// The odd member of class `class`'s tar, if it has one: (name, bytes).
fn odd_member(cfg: &SynthConfig, class: usize) -> Result<Option<(String, Vec<u8>)>> {
    let w = wnid(class);
    Ok(match class {
        0 => Some((
            format!("{w}_notes.txt"),
            b"not an image: ddl-pack ignores it\n".to_vec(),
        )),
        1 => {
            let jpeg = render(cfg, class, image_seed(cfg.seed, 2, class, 0))?;
            Some((
                format!("{w}_truncated.JPEG"),
                jpeg[..jpeg.len() / 2].to_vec(),
            ))
        }
        2 => {
            let jpeg = render(cfg, class, image_seed(cfg.seed, 2, class, 0))?;
            let img = image::load_from_memory(&jpeg).context("decoding a generated JPEG")?;
            let mut png = Cursor::new(Vec::new());
            img.write_to(&mut png, image::ImageFormat::Png)
                .context("encoding a PNG")?;
            Some((format!("{w}_png.JPEG"), png.into_inner()))
        }
        _ => None,
    })
}

/// Writes one tar per class (see the module documentation).
fn generate_tars(out: &Path, cfg: &SynthConfig) -> Result<SynthSummary> {
    fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let per_class: Vec<(usize, usize, u64)> = (0..cfg.classes)
        .into_par_iter()
        .map(|c| -> Result<(usize, usize, u64)> {
            let path = out.join(format!("{}.tar", wnid(c)));
            let file =
                fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
            let mut tar = tar::Builder::new(std::io::BufWriter::new(file));
            let mut append = |name: &str, data: &[u8]| {
                let mut h = tar::Header::new_gnu();
                h.set_size(data.len() as u64);
                h.set_mode(0o644);
                h.set_mtime(0);
                h.set_cksum();
                tar.append_data(&mut h, name, data)
                    .with_context(|| format!("writing {name} into {}", path.display()))
            };
            let n = tar_class_size(cfg, c);
            let mut bytes = 0;
            for i in 0..n {
                let jpeg = render(cfg, c, image_seed(cfg.seed, 0, c, i))?;
                append(&format!("{}_{i}.JPEG", wnid(c)), &jpeg)?;
                bytes += jpeg.len() as u64;
            }
            let odd = odd_member(cfg, c)?;
            if let Some((name, data)) = &odd {
                append(name, data)?;
            }
            tar.into_inner()
                .and_then(|mut w| w.flush())
                .with_context(|| format!("writing {}", path.display()))?;
            Ok((n, usize::from(odd.is_some()), bytes))
        })
        .collect::<Result<_>>()?;
    let train_images: usize = per_class.iter().map(|c| c.0).sum();
    // Every odd member but the text file has an image name: ddl-pack counts it as an input.
    let odd_images = cfg.classes.clamp(1, 3) - 1;
    Ok(SynthSummary {
        train_images,
        val_images: 0,
        odd_files: per_class.iter().map(|c| c.1).sum(),
        bytes: per_class.iter().map(|c| c.2).sum(),
        damaged: (cfg.classes > 1).then(|| {
            (
                format!("{}_truncated.JPEG", wnid(1)),
                train_images + odd_images,
            )
        }),
    })
}

/// Writes the ILSVRC tree (see the module documentation).
fn generate_tree(out: &Path, cfg: &SynthConfig) -> Result<SynthSummary> {
    let train = out.join("train");
    let val = out.join("val");
    for c in 0..cfg.classes {
        fs::create_dir_all(train.join(wnid(c)))
            .with_context(|| format!("creating {}", train.display()))?;
    }
    fs::create_dir_all(&val).with_context(|| format!("creating {}", val.display()))?;

    let train_jobs: Vec<(usize, usize)> = (0..cfg.classes)
        .flat_map(|c| (0..cfg.per_class).map(move |i| (c, i)))
        .collect();
    let train_bytes: u64 = train_jobs
        .par_iter()
        .map(|&(c, i)| -> Result<u64> {
            let jpeg = render(cfg, c, image_seed(cfg.seed, 0, c, i))?;
            let name = format!("{}_{}.JPEG", wnid(c), i);
            write_file(&train.join(wnid(c)).join(name), &jpeg)?;
            Ok(jpeg.len() as u64)
        })
        .sum::<Result<u64>>()?;

    // Validation images are numbered 1.. in a class-interleaved order, like ILSVRC2012's.
    let val_jobs: Vec<(usize, usize)> = (0..cfg.val_per_class)
        .flat_map(|i| (0..cfg.classes).map(move |c| (c, i)))
        .collect();
    let val_bytes: u64 = val_jobs
        .par_iter()
        .enumerate()
        .map(|(n, &(c, i))| -> Result<u64> {
            let jpeg = render(cfg, c, image_seed(cfg.seed, 1, c, i))?;
            write_file(&val.join(val_name(n + 1)), &jpeg)?;
            Ok(jpeg.len() as u64)
        })
        .sum::<Result<u64>>()?;

    let mut csv = String::from("ImageId,PredictionString\n");
    for (n, &(c, _)) in val_jobs.iter().enumerate() {
        let id = val_name(n + 1);
        let id = id.trim_end_matches(".JPEG");
        csv.push_str(&format!("{id},{} 10 10 190 190 \n", wnid(c)));
    }
    write_file(&out.join("LOC_val_solution.csv"), csv.as_bytes())?;

    Ok(SynthSummary {
        train_images: train_jobs.len(),
        val_images: val_jobs.len(),
        odd_files: 0,
        damaged: None,
        bytes: train_bytes + val_bytes,
    })
}

/// ILSVRC-2012 validation file name of the 1-based image number `n`.
pub fn val_name(n: usize) -> String {
    format!("ILSVRC2012_val_{n:08}.JPEG")
}
