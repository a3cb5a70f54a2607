//! Image-classifier models: the torchvision ResNets (same variable names and shapes, so
//! torchvision weights map one to one), a small ResNet for CPU runs and a BatchNorm-free
//! convnet whose gradients are exactly batch-decomposable (used by the exactness tests).

use std::fmt;
use std::str::FromStr;

use tch::nn::{self, ModuleT};
use tch::Tensor;

use crate::error::{Result, TrainError};

/// Which network to train.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelKind {
    /// torchvision `resnet18` (BasicBlock, [2, 2, 2, 2]).
    Resnet18,
    /// torchvision `resnet34` (BasicBlock, [3, 4, 6, 3]).
    Resnet34,
    /// torchvision `resnet50` (Bottleneck, [3, 4, 6, 3]).
    Resnet50,
    /// torchvision `resnet101` (Bottleneck, [3, 4, 23, 3]).
    Resnet101,
    /// torchvision `resnet152` (Bottleneck, [3, 8, 36, 3]).
    Resnet152,
    /// A small ResNet (widths 16/32/64, 3 stages of 2 BasicBlocks) for CPU tests and demos.
    ResnetSmall,
    /// Two strided convolutions with bias, ReLU, global average pool and a linear layer:
    /// no BatchNorm, so the gradient of a batch is the mean of its parts.
    ConvnetNobn,
}

impl ModelKind {
    /// All models, in the order `--help` lists them.
    pub const ALL: [ModelKind; 7] = [
        ModelKind::Resnet18,
        ModelKind::Resnet34,
        ModelKind::Resnet50,
        ModelKind::Resnet101,
        ModelKind::Resnet152,
        ModelKind::ResnetSmall,
        ModelKind::ConvnetNobn,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Resnet18 => "resnet18",
            ModelKind::Resnet34 => "resnet34",
            ModelKind::Resnet50 => "resnet50",
            ModelKind::Resnet101 => "resnet101",
            ModelKind::Resnet152 => "resnet152",
            ModelKind::ResnetSmall => "resnet_small",
            ModelKind::ConvnetNobn => "convnet_nobn",
        }
    }

    /// Whether the model contains BatchNorm layers (whose statistics stay per replica).
    pub fn has_batch_norm(self) -> bool {
        self != ModelKind::ConvnetNobn
    }
}

impl fmt::Display for ModelKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ModelKind {
    type Err = TrainError;

    fn from_str(s: &str) -> Result<Self> {
        ModelKind::ALL
            .iter()
            .copied()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = ModelKind::ALL.iter().map(|m| m.name()).collect();
                TrainError::config(
                    "--model",
                    format!("unknown model {s:?}; one of {}", names.join(", ")),
                )
            })
    }
}

/// A model built into a variable store; `forward_t(images, train)` returns logits.
pub type Model = Box<dyn ModuleT>;

/// Builds `kind` for `classes` output classes under `p`, sized for square `image_size` inputs.
pub fn build(kind: ModelKind, p: &nn::Path, classes: i64, image_size: u32) -> Model {
    match kind {
        ModelKind::Resnet18 => Box::new(ResNet::torchvision(
            p,
            BlockKind::Basic,
            [2, 2, 2, 2],
            classes,
        )),
        ModelKind::Resnet34 => Box::new(ResNet::torchvision(
            p,
            BlockKind::Basic,
            [3, 4, 6, 3],
            classes,
        )),
        ModelKind::Resnet50 => Box::new(ResNet::torchvision(
            p,
            BlockKind::Bottleneck,
            [3, 4, 6, 3],
            classes,
        )),
        ModelKind::Resnet101 => Box::new(ResNet::torchvision(
            p,
            BlockKind::Bottleneck,
            [3, 4, 23, 3],
            classes,
        )),
        ModelKind::Resnet152 => Box::new(ResNet::torchvision(
            p,
            BlockKind::Bottleneck,
            [3, 8, 36, 3],
            classes,
        )),
        ModelKind::ResnetSmall => Box::new(ResNet::small(p, classes, image_size)),
        ModelKind::ConvnetNobn => Box::new(ConvNet::new(p, classes)),
    }
}

fn conv(p: nn::Path, c_in: i64, c_out: i64, k: i64, stride: i64, padding: i64) -> nn::Conv2D {
    let cfg = nn::ConvConfig {
        stride,
        padding,
        bias: false,
        // torchvision: kaiming_normal_(mode="fan_out", nonlinearity="relu").
        ws_init: nn::Init::Kaiming {
            dist: nn::init::NormalOrUniform::Normal,
            fan: nn::init::FanInOut::FanOut,
            non_linearity: nn::init::NonLinearity::ReLU,
        },
        ..Default::default()
    };
    nn::conv2d(p, c_in, c_out, k, cfg)
}

fn bn(p: nn::Path, c: i64, zero_gamma: bool) -> nn::BatchNorm {
    let cfg = nn::BatchNormConfig {
        ws_init: if zero_gamma {
            nn::Init::Const(0.0)
        } else {
            nn::Init::Const(1.0)
        },
        ..Default::default()
    };
    nn::batch_norm2d(p, c, cfg)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BlockKind {
    Basic,
    Bottleneck,
}

impl BlockKind {
    fn expansion(self) -> i64 {
        match self {
            BlockKind::Basic => 1,
            BlockKind::Bottleneck => 4,
        }
    }
}

#[derive(Debug)]
struct Block {
    convs: Vec<(nn::Conv2D, nn::BatchNorm)>,
    downsample: Option<(nn::Conv2D, nn::BatchNorm)>,
}

impl Block {
    /// torchvision's BasicBlock / Bottleneck (stride on the 3x3 convolution, "ResNet v1.5").
    /// The last BatchNorm of each block starts with gamma = 0 (Goyal et al. 2017), so every
    /// block starts as the identity, which makes large-batch warmup stable.
    fn new(p: &nn::Path, kind: BlockKind, c_in: i64, width: i64, stride: i64) -> Block {
        let c_out = width * kind.expansion();
        let convs = match kind {
            BlockKind::Basic => vec![
                (
                    conv(p / "conv1", c_in, width, 3, stride, 1),
                    bn(p / "bn1", width, false),
                ),
                (
                    conv(p / "conv2", width, width, 3, 1, 1),
                    bn(p / "bn2", width, true),
                ),
            ],
            BlockKind::Bottleneck => vec![
                (
                    conv(p / "conv1", c_in, width, 1, 1, 0),
                    bn(p / "bn1", width, false),
                ),
                (
                    conv(p / "conv2", width, width, 3, stride, 1),
                    bn(p / "bn2", width, false),
                ),
                (
                    conv(p / "conv3", width, c_out, 1, 1, 0),
                    bn(p / "bn3", c_out, true),
                ),
            ],
        };
        let downsample = (stride != 1 || c_in != c_out).then(|| {
            let d = p / "downsample";
            (
                conv(&d / "0", c_in, c_out, 1, stride, 0),
                bn(&d / "1", c_out, false),
            )
        });
        Block { convs, downsample }
    }

    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        let last = self.convs.len() - 1;
        let mut ys = xs.shallow_clone();
        for (i, (c, b)) in self.convs.iter().enumerate() {
            ys = ys.apply(c).apply_t(b, train);
            if i != last {
                ys = ys.relu();
            }
        }
        let shortcut = match &self.downsample {
            Some((c, b)) => xs.apply(c).apply_t(b, train),
            None => xs.shallow_clone(),
        };
        (ys + shortcut).relu()
    }
}

/// How the stem reduces the input before the first stage.
#[derive(Debug, Clone, Copy)]
enum Stem {
    /// 7x7 stride-2 convolution then 3x3 stride-2 max-pool (torchvision).
    ImageNet,
    /// 3x3 convolution with the given stride, then optionally a 3x3 stride-2 max-pool.
    Small { stride: i64, pool: bool },
}

#[derive(Debug)]
struct ResNet {
    stem: Stem,
    conv1: nn::Conv2D,
    bn1: nn::BatchNorm,
    layers: Vec<Vec<Block>>,
    fc: nn::Linear,
}

impl ResNet {
    fn torchvision(p: &nn::Path, kind: BlockKind, depths: [usize; 4], classes: i64) -> ResNet {
        let conv1 = conv(p / "conv1", 3, 64, 7, 2, 3);
        let bn1 = bn(p / "bn1", 64, false);
        Self::stages(
            p,
            Stem::ImageNet,
            conv1,
            bn1,
            kind,
            &[64, 128, 256, 512],
            &depths,
            classes,
        )
    }

    /// Widths 16/32/64, two BasicBlocks per stage. The stem keeps about 32x32 positions into
    /// the first stage whatever the image size in 64..224.
    fn small(p: &nn::Path, classes: i64, image_size: u32) -> ResNet {
        let stem = match image_size {
            0..=48 => Stem::Small {
                stride: 1,
                pool: false,
            },
            49..=96 => Stem::Small {
                stride: 2,
                pool: false,
            },
            _ => Stem::Small {
                stride: 2,
                pool: true,
            },
        };
        let stride = match stem {
            Stem::Small { stride, .. } => stride,
            Stem::ImageNet => 2,
        };
        let conv1 = conv(p / "conv1", 3, 16, 3, stride, 1);
        let bn1 = bn(p / "bn1", 16, false);
        Self::stages(
            p,
            stem,
            conv1,
            bn1,
            BlockKind::Basic,
            &[16, 32, 64],
            &[2, 2, 2],
            classes,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn stages(
        p: &nn::Path,
        stem: Stem,
        conv1: nn::Conv2D,
        bn1: nn::BatchNorm,
        kind: BlockKind,
        widths: &[i64],
        depths: &[usize],
        classes: i64,
    ) -> ResNet {
        let mut c_in = widths[0];
        let mut layers = Vec::new();
        for (i, (&w, &d)) in widths.iter().zip(depths).enumerate() {
            let lp = p / format!("layer{}", i + 1);
            let mut blocks = Vec::new();
            for b in 0..d {
                let stride = if i > 0 && b == 0 { 2 } else { 1 };
                blocks.push(Block::new(&(&lp / b.to_string()), kind, c_in, w, stride));
                c_in = w * kind.expansion();
            }
            layers.push(blocks);
        }
        let fc = nn::linear(p / "fc", c_in, classes, Default::default());
        ResNet {
            stem,
            conv1,
            bn1,
            layers,
            fc,
        }
    }
}

impl ModuleT for ResNet {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        let mut ys = xs.apply(&self.conv1).apply_t(&self.bn1, train).relu();
        let pool = match self.stem {
            Stem::ImageNet => true,
            Stem::Small { pool, .. } => pool,
        };
        if pool {
            ys = ys.max_pool2d([3, 3], [2, 2], [1, 1], [1, 1], false);
        }
        for layer in &self.layers {
            for block in layer {
                ys = block.forward_t(&ys, train);
            }
        }
        ys.adaptive_avg_pool2d([1, 1]).flat_view().apply(&self.fc)
    }
}

#[derive(Debug)]
struct ConvNet {
    conv1: nn::Conv2D,
    conv2: nn::Conv2D,
    fc: nn::Linear,
}

impl ConvNet {
    fn new(p: &nn::Path, classes: i64) -> ConvNet {
        let cfg = nn::ConvConfig {
            stride: 2,
            padding: 1,
            ..Default::default()
        };
        ConvNet {
            conv1: nn::conv2d(p / "conv1", 3, 16, 3, cfg),
            conv2: nn::conv2d(p / "conv2", 16, 32, 3, cfg),
            fc: nn::linear(p / "fc", 32, classes, Default::default()),
        }
    }
}

impl ModuleT for ConvNet {
    fn forward_t(&self, xs: &Tensor, _train: bool) -> Tensor {
        xs.apply(&self.conv1)
            .relu()
            .apply(&self.conv2)
            .relu()
            .adaptive_avg_pool2d([1, 1])
            .flat_view()
            .apply(&self.fc)
    }
}
