//! The stages of torchvision's ResNets as `ddl-bench sim` schedules them: the stem, every
//! residual block and the classifier, the stages at which ddl-train's `--overlap backward`
//! cuts its buckets (trainer/src/model.rs), each with its parameters and the
//! multiply-accumulates of one image's forward pass (convolutions and the classifier; the
//! BatchNorm, ReLU and pooling arithmetic is left out).

/// One stage of a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stage {
    /// Parameters (trainable: weights, biases, BatchNorm's scale and shift).
    pub params: u64,
    /// Multiply-accumulates of one image's forward pass.
    pub macs: u64,
}

/// The output side of a convolution (or max-pool) of stride 2 whose padding keeps "same"
/// (torchvision's 7x7 stem, 3x3 max-pool and strided 3x3 and 1x1 convolutions).
fn halved(side: u64) -> u64 {
    (side.saturating_sub(1)) / 2 + 1
}

/// A BasicBlock of `inp` -> `out` channels with `stride`, on inputs of side `side`; returns the
/// stage and the output side.
fn basic(inp: u64, out: u64, stride: u64, side: u64) -> (Stage, u64) {
    let side = if stride == 2 { halved(side) } else { side };
    let down = stride != 1 || inp != out;
    let conv = 9 * inp * out + 9 * out * out + u64::from(down) * inp * out;
    let bn = 2 * out * (2 + u64::from(down));
    (
        Stage {
            params: conv + bn,
            macs: conv * side * side,
        },
        side,
    )
}

/// A Bottleneck of `inp` channels, width `w` (4w out) and `stride` (on the 3x3, as torchvision
/// has it), on inputs of side `side`; returns the stage and the output side.
fn bottleneck(inp: u64, w: u64, stride: u64, side: u64) -> (Stage, u64) {
    let out_side = if stride == 2 { halved(side) } else { side };
    let down = stride != 1 || inp != 4 * w;
    let first = inp * w;
    let rest = 9 * w * w + 4 * w * w + u64::from(down) * inp * 4 * w;
    let bn = 2 * (w + w + 4 * w) + u64::from(down) * 8 * w;
    (
        Stage {
            params: first + rest + bn,
            macs: first * side * side + rest * out_side * out_side,
        },
        out_side,
    )
}

/// The stages of `name` (resnet18, resnet34, resnet50, resnet101, resnet152) with a
/// `classes`-way classifier on square images of `image_size` pixels, in forward order; `None`
/// for a model the simulator does not know.
pub fn stages(name: &str, classes: u64, image_size: u32) -> Option<Vec<Stage>> {
    let (blocks, bottlenecks) = match name {
        "resnet18" => ([2, 2, 2, 2], false),
        "resnet34" => ([3, 4, 6, 3], false),
        "resnet50" => ([3, 4, 6, 3], true),
        "resnet101" => ([3, 4, 23, 3], true),
        "resnet152" => ([3, 8, 36, 3], true),
        _ => return None,
    };
    let stem_side = halved(u64::from(image_size));
    let mut out = vec![Stage {
        params: 3 * 64 * 49 + 2 * 64,
        macs: 3 * 64 * 49 * stem_side * stem_side,
    }];
    let mut side = halved(stem_side);
    let mut channels = 64;
    for (layer, &n) in blocks.iter().enumerate() {
        let width = 64 << layer;
        for b in 0..n {
            let stride = if layer > 0 && b == 0 { 2 } else { 1 };
            let (stage, next) = match bottlenecks {
                true => bottleneck(channels, width, stride, side),
                false => basic(channels, width, stride, side),
            };
            out.push(stage);
            side = next;
            channels = if bottlenecks { 4 * width } else { width };
        }
    }
    out.push(Stage {
        params: channels * classes + classes,
        macs: channels * classes,
    });
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_and_macs_are_torchvisions() {
        // torchvision's parameter counts and "GFLOPS" (multiply-accumulates) at 224 px.
        for (name, params, gmac, stages_n) in [
            ("resnet18", 11_689_512u64, 1.81, 10),
            ("resnet34", 21_797_672, 3.66, 18),
            ("resnet50", 25_557_032, 4.09, 18),
            ("resnet101", 44_549_160, 7.80, 35),
            ("resnet152", 60_192_808, 11.51, 52),
        ] {
            let s = stages(name, 1000, 224).unwrap();
            assert_eq!(s.len(), stages_n, "{name}");
            assert_eq!(s.iter().map(|s| s.params).sum::<u64>(), params, "{name}");
            let macs = s.iter().map(|s| s.macs).sum::<u64>() as f64 / 1e9;
            assert!((macs / gmac - 1.0).abs() < 0.01, "{name}: {macs} GMAC");
        }
        assert!(stages("vgg16", 1000, 224).is_none());
    }

    #[test]
    fn the_pixels_scale_the_convolutions_and_not_the_classifier() {
        let big = stages("resnet18", 1000, 224).unwrap();
        let small = stages("resnet18", 1000, 112).unwrap();
        assert_eq!(small[0].macs * 4, big[0].macs);
        assert_eq!(small[9].macs, big[9].macs);
        assert_eq!(small[9].params, 513_000);
    }
}
