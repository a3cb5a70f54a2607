//! The limits of the settings a user gives the pipeline (batch, image size, decode workers,
//! prefetch depth, eval resize; the augmentation of [`check_augment`]) and the memory check of
//! its batch buffers: one definition for
//! ddl-train, ddl-prof and the Python binding, checked before anything is allocated. Errors
//! carry the typed [`Setting`]; each caller names it its own way (a flag, a keyword argument).

use crate::augment::{Output, TrainAugment};
use crate::units::gib;

/// A setting of the pipeline that callers take from their users.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setting {
    /// Images per batch of one replica.
    Batch,
    /// Output side in pixels.
    ImageSize,
    /// Decode threads of one process.
    Workers,
    /// Ready batches queued per replica.
    Prefetch,
    /// The shorter side before the eval center crop (0: the image size x 8/7).
    EvalResize,
}

impl Setting {
    /// Every setting, in declaration order.
    pub const ALL: [Setting; 5] = [
        Setting::Batch,
        Setting::ImageSize,
        Setting::Workers,
        Setting::Prefetch,
        Setting::EvalResize,
    ];
}

/// Largest image, in pixels, that ddl-pack stores, the pipeline decodes and ddl-predict reads
/// (one limit, so that nothing packed is refused later): checked from the header before any
/// pixel is allocated, against hostile dimensions (134 M pixels, 400 MB of RGB).
pub const MAX_PIXELS: u64 = 1 << 27;

/// Smallest output side: at 16 pixels the ResNets' stride-32 stages already reduce an image
/// to one pixel; a smaller side is a slip, not a model input.
pub const MIN_IMAGE_SIZE: u32 = 16;

/// Most decode threads of one process: every one holds a decoder and its buffers, and beyond
/// the cores of the largest machines they only contend (100,000 of them never got as far as
/// a batch).
pub const MAX_WORKERS: usize = 1024;

/// Deepest queue of ready batches per replica: a consumer takes one batch at a time, so a
/// deeper queue only holds memory.
pub const MAX_PREFETCH: usize = 1024;

/// The settings of one process's pipeline, as the user gave them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Images per batch of one replica.
    pub batch: usize,
    /// Output side in pixels.
    pub image_size: u32,
    /// Decode threads.
    pub workers: usize,
    /// Ready batches queued per replica.
    pub prefetch: usize,
    /// The shorter side before the eval center crop (0: the image size x 8/7).
    pub eval_resize: u32,
}

/// Where the batch buffers of [`Settings`] live: how many of them a node holds, and in which
/// element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buffers {
    /// Replicas fed by one process.
    pub replicas: usize,
    /// Processes (ranks) on the node, each with its own buffers.
    pub ranks_on_node: usize,
    /// The batches' element type.
    pub output: Output,
}

/// Why a setting, or the memory all of them take, is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// A setting below its smallest value.
    #[error("{value} is below {min}")]
    Below {
        /// The setting.
        setting: Setting,
        /// Its value.
        value: u64,
        /// The smallest allowed.
        min: u64,
    },
    /// A setting above its largest value.
    #[error("{value} is above the limit of {max}")]
    Above {
        /// The setting.
        setting: Setting,
        /// Its value.
        value: u64,
        /// The largest allowed.
        max: u64,
    },
    /// An eval resize smaller than the crop taken from it.
    #[error("{resize} is below the image size {image_size}: the center crop would not fit (0 = image size x 8/7)")]
    ResizeBelowCrop {
        /// The resize.
        resize: u32,
        /// The image size.
        image_size: u32,
    },
    /// The batch buffers of the node's ranks would not fit in the memory available.
    #[error(
        "the input batches of {ranks_on_node} rank(s) on this node need {need} bytes ({:.1} GiB: \
         {replicas} replica(s) x ({prefetch} prefetched + 1) + {in_flight} in flight, each {batch} \
         images of 3 x {image_size} x {image_size} x {bytes_per_value} bytes), but only {available} \
         bytes ({:.1} GiB) are available (MemAvailable); lower the image size, the batch or the \
         prefetch depth",
        gib(*.need),
        gib(*.available)
    )]
    Memory {
        /// Bytes the buffers take.
        need: u64,
        /// Bytes available.
        available: u64,
        /// Ranks on the node.
        ranks_on_node: usize,
        /// Replicas per rank.
        replicas: usize,
        /// Prefetch depth.
        prefetch: usize,
        /// Buffers being filled by the workers.
        in_flight: usize,
        /// Images per batch.
        batch: usize,
        /// Output side.
        image_size: u32,
        /// Bytes per value.
        bytes_per_value: u64,
    },
    /// With the last incomplete step dropped, an epoch would have no batch at all.
    #[error(
        "a step takes {per_step} images ({ranks_in_node} rank(s) x {replicas} replica(s) x {batch}) \
         but the smallest node holds {records} records: an epoch would have no full batch"
    )]
    NoFullStep {
        /// Images one step takes from a node.
        per_step: usize,
        /// Ranks sharing a node's records.
        ranks_in_node: usize,
        /// Replicas per rank.
        replicas: usize,
        /// Images per batch.
        batch: usize,
        /// Records of the smallest node.
        records: usize,
    },
}

impl LimitError {
    /// The settings to name in the message (the ones that would lift the refusal).
    pub fn settings(&self) -> &'static [Setting] {
        match self {
            LimitError::Below { setting, .. } | LimitError::Above { setting, .. } => {
                std::slice::from_ref(&Setting::ALL[*setting as usize])
            }
            LimitError::ResizeBelowCrop { .. } => &[Setting::EvalResize],
            LimitError::Memory { .. } => &[Setting::ImageSize, Setting::Batch, Setting::Prefetch],
            LimitError::NoFullStep { .. } => &[Setting::Batch],
        }
    }

    /// [`LimitError::settings`] as the caller names them (`name`), joined by "/": what a
    /// message starts with.
    pub fn named(&self, name: impl Fn(Setting) -> &'static str) -> String {
        let names: Vec<&str> = self.settings().iter().map(|s| name(*s)).collect();
        names.join("/")
    }
}

/// Checks every setting against its limits.
pub fn check(s: &Settings) -> Result<(), LimitError> {
    let at_least = |setting, value: u64, min: u64| {
        if value < min {
            Err(LimitError::Below {
                setting,
                value,
                min,
            })
        } else {
            Ok(())
        }
    };
    let at_most = |setting, value: u64, max: u64| {
        if value > max {
            Err(LimitError::Above {
                setting,
                value,
                max,
            })
        } else {
            Ok(())
        }
    };
    at_least(Setting::Batch, s.batch as u64, 1)?;
    at_least(
        Setting::ImageSize,
        u64::from(s.image_size),
        u64::from(MIN_IMAGE_SIZE),
    )?;
    at_least(Setting::Workers, s.workers as u64, 1)?;
    at_most(Setting::Workers, s.workers as u64, MAX_WORKERS as u64)?;
    at_least(Setting::Prefetch, s.prefetch as u64, 1)?;
    at_most(Setting::Prefetch, s.prefetch as u64, MAX_PREFETCH as u64)?;
    if s.eval_resize != 0 && s.eval_resize < s.image_size {
        return Err(LimitError::ResizeBelowCrop {
            resize: s.eval_resize,
            image_size: s.image_size,
        });
    }
    Ok(())
}

/// Batch buffers in flight: at most two batches are being filled at once, whatever the worker
/// count.
fn in_flight(workers: usize) -> usize {
    workers.min(2)
}

/// How many batch buffers one pipeline allocates: `replicas x (prefetch + 1)` queued or held
/// by the consumer, and [`in_flight`] being filled (see [`crate::pipeline`]). The pipeline
/// allocates this many and the memory check counts this many.
pub fn batch_buffers(replicas: usize, prefetch: usize, workers: usize) -> usize {
    replicas * (prefetch + 1) + in_flight(workers)
}

/// Bytes of one process's batch buffers: [`batch_buffers`] of `batch x 3 x size x size`
/// values.
pub fn batch_bytes(s: &Settings, replicas: usize, output: Output) -> u64 {
    let buffers = batch_buffers(replicas, s.prefetch, s.workers) as u64;
    let side = u64::from(s.image_size);
    buffers
        .saturating_mul(s.batch as u64)
        .saturating_mul(3 * side * side)
        .saturating_mul(bytes_per_value(output))
}

fn bytes_per_value(output: Output) -> u64 {
    match output {
        Output::F32Nchw => 4,
        Output::U8Nhwc => 1,
    }
}

/// Memory available for new allocations on this machine (`MemAvailable` of /proc/meminfo), if
/// the kernel says.
pub fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Fails when the batch buffers of the node's ranks would not fit in `available` bytes
/// (None: unknown, not checked).
pub fn check_memory(s: &Settings, b: Buffers, available: Option<u64>) -> Result<(), LimitError> {
    let Some(available) = available else {
        return Ok(());
    };
    let need = batch_bytes(s, b.replicas, b.output).saturating_mul(b.ranks_on_node as u64);
    if need <= available {
        return Ok(());
    }
    Err(LimitError::Memory {
        need,
        available,
        ranks_on_node: b.ranks_on_node,
        replicas: b.replicas,
        prefetch: s.prefetch,
        in_flight: in_flight(s.workers),
        batch: s.batch,
        image_size: s.image_size,
        bytes_per_value: bytes_per_value(b.output),
    })
}

/// Fails when a training epoch that drops its last incomplete step would have no step: the
/// smallest node holds fewer than `ranks_in_node x replicas x batch` records.
pub fn check_full_step(
    batch: usize,
    ranks_in_node: usize,
    replicas: usize,
    smallest_node_records: usize,
) -> Result<(), LimitError> {
    let per_step = ranks_in_node.saturating_mul(replicas).saturating_mul(batch);
    if smallest_node_records >= per_step {
        return Ok(());
    }
    Err(LimitError::NoFullStep {
        per_step,
        ranks_in_node,
        replicas,
        batch,
        records: smallest_node_records,
    })
}

/// A setting of the augmentation a recipe gives the pipeline (see [`check_augment`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AugmentSetting {
    /// RandomResizedCrop's range of the crop's area fraction.
    Scale,
    /// RandomResizedCrop's range of the crop's aspect ratio.
    Ratio,
    /// The probability of a horizontal flip.
    Flip,
    /// The eval resize as a multiple of the image size.
    EvalResizeRatio,
    /// The channel means of the float32 output.
    Mean,
    /// The channel standard deviations of the float32 output.
    Std,
}

/// Why an augmentation setting is refused; each caller names the setting its own way.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{why}")]
pub struct AugmentError {
    /// The setting.
    pub setting: AugmentSetting,
    /// What is wrong and what is allowed.
    pub why: String,
}

/// The augmentation of one pipeline, as the user gave it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AugmentSettings {
    /// Crop scale and ratio, flip probability.
    pub train: TrainAugment,
    /// Eval resize as a multiple of the image size.
    pub eval_resize_ratio: f64,
    /// Channel means (0-1 scale).
    pub mean: [f32; 3],
    /// Channel standard deviations (0-1 scale).
    pub std: [f32; 3],
}

/// Checks a recipe's augmentation: scale in (0, 1] with lo <= hi, ratio positive with
/// lo <= hi, flip probability in [0, 1], eval resize ratio at least 1 (the center crop must
/// fit), means finite, stds positive; every value finite.
pub fn check_augment(a: &AugmentSettings) -> Result<(), AugmentError> {
    let refuse = |setting, why: String| Err(AugmentError { setting, why });
    let (lo, hi) = a.train.scale;
    if !(lo.is_finite() && hi.is_finite() && 0.0 < lo && lo <= hi && hi <= 1.0) {
        return refuse(
            AugmentSetting::Scale,
            format!("({lo}, {hi}): the area fractions must satisfy 0 < lo <= hi <= 1"),
        );
    }
    let (lo, hi) = a.train.ratio;
    if !(lo.is_finite() && hi.is_finite() && 0.0 < lo && lo <= hi) {
        return refuse(
            AugmentSetting::Ratio,
            format!("({lo}, {hi}): the aspect ratios must satisfy 0 < lo <= hi"),
        );
    }
    let p = a.train.flip;
    if !(0.0..=1.0).contains(&p) {
        return refuse(AugmentSetting::Flip, format!("{p} is outside [0, 1]"));
    }
    let r = a.eval_resize_ratio;
    if !(r.is_finite() && r >= 1.0) {
        return refuse(
            AugmentSetting::EvalResizeRatio,
            format!("{r} is below 1 (or not finite): the center crop would not fit"),
        );
    }
    if a.mean.iter().any(|m| !m.is_finite()) {
        return refuse(
            AugmentSetting::Mean,
            format!("{:?}: every mean must be finite", a.mean),
        );
    }
    if a.std.iter().any(|s| !(s.is_finite() && *s > 0.0)) {
        return refuse(
            AugmentSetting::Std,
            format!("{:?}: every std must be above 0 (and finite)", a.std),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            batch: 32,
            image_size: 224,
            workers: 2,
            prefetch: 4,
            eval_resize: 0,
        }
    }

    #[test]
    fn each_limit_names_its_setting() {
        assert_eq!(check(&settings()), Ok(()));
        let refused = |s: Settings| check(&s).unwrap_err();
        let e = refused(Settings {
            workers: 100_000,
            ..settings()
        });
        assert_eq!(e.settings(), &[Setting::Workers]);
        assert_eq!(e.to_string(), "100000 is above the limit of 1024");
        let e = refused(Settings {
            image_size: 7,
            ..settings()
        });
        assert_eq!(e.settings(), &[Setting::ImageSize]);
        assert_eq!(e.to_string(), "7 is below 16");
        for (s, setting) in [
            (
                Settings {
                    batch: 0,
                    ..settings()
                },
                Setting::Batch,
            ),
            (
                Settings {
                    prefetch: 0,
                    ..settings()
                },
                Setting::Prefetch,
            ),
            (
                Settings {
                    prefetch: 1_000_000,
                    ..settings()
                },
                Setting::Prefetch,
            ),
            (
                Settings {
                    workers: 0,
                    ..settings()
                },
                Setting::Workers,
            ),
            (
                Settings {
                    eval_resize: 100,
                    ..settings()
                },
                Setting::EvalResize,
            ),
        ] {
            assert_eq!(refused(s).settings(), &[setting], "{s:?}");
        }
    }

    #[test]
    fn memory_counts_every_buffer_of_every_rank() {
        let s = Settings {
            image_size: 8192,
            ..settings()
        };
        // 1 replica: 5 + 2 buffers of 32 x 3 x 8192^2 f32.
        let want = 7 * 32 * 3 * 8192 * 8192 * 4u64;
        assert_eq!(batch_bytes(&s, 1, Output::F32Nchw), want);
        assert_eq!(batch_bytes(&s, 1, Output::U8Nhwc), want / 4);
        let buffers = Buffers {
            replicas: 1,
            ranks_on_node: 2,
            output: Output::F32Nchw,
        };
        let e = check_memory(&s, buffers, Some(1 << 34)).unwrap_err();
        assert!(e.to_string().contains(&(2 * want).to_string()), "{e}");
        assert!(e.to_string().contains("MemAvailable"), "{e}");
        assert_eq!(check_memory(&settings(), buffers, Some(1 << 34)), Ok(()));
        assert_eq!(check_memory(&s, buffers, None), Ok(()));
    }

    #[test]
    fn each_augment_check_names_its_setting() {
        let ok = AugmentSettings {
            train: TrainAugment::default(),
            eval_resize_ratio: 8.0 / 7.0,
            mean: [0.5; 3],
            std: [0.25; 3],
        };
        assert_eq!(check_augment(&ok), Ok(()));
        let with = |f: fn(&mut AugmentSettings)| {
            let mut a = ok;
            f(&mut a);
            check_augment(&a).unwrap_err().setting
        };
        assert_eq!(with(|a| a.train.scale = (0.0, 1.0)), AugmentSetting::Scale);
        assert_eq!(with(|a| a.train.scale = (0.5, 1.5)), AugmentSetting::Scale);
        assert_eq!(with(|a| a.train.scale = (0.9, 0.5)), AugmentSetting::Scale);
        assert_eq!(with(|a| a.train.ratio = (2.0, 1.0)), AugmentSetting::Ratio);
        assert_eq!(with(|a| a.train.ratio = (0.0, 1.0)), AugmentSetting::Ratio);
        assert_eq!(with(|a| a.train.flip = 1.5), AugmentSetting::Flip);
        assert_eq!(with(|a| a.train.flip = f64::NAN), AugmentSetting::Flip);
        assert_eq!(
            with(|a| a.eval_resize_ratio = 0.9),
            AugmentSetting::EvalResizeRatio
        );
        assert_eq!(with(|a| a.mean[1] = f32::NAN), AugmentSetting::Mean);
        assert_eq!(with(|a| a.std[2] = 0.0), AugmentSetting::Std);
        assert!(check_augment(&AugmentSettings {
            train: TrainAugment {
                scale: (1.0, 1.0),
                ratio: (1.0, 1.0),
                flip: 0.0,
            },
            eval_resize_ratio: 1.0,
            ..ok
        })
        .is_ok());
    }

    #[test]
    fn a_batch_larger_than_the_smallest_node_is_no_step() {
        assert_eq!(check_full_step(40, 2, 1, 80), Ok(()));
        let e = check_full_step(100, 1, 1, 80).unwrap_err();
        assert_eq!(e.settings(), &[Setting::Batch]);
        assert!(e.to_string().contains("holds 80 records"), "{e}");
    }
}
