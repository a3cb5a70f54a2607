//! Image-classifier models: the torchvision ResNets (same variable names and shapes, so
//! torchvision weights map one to one), a small ResNet for CPU runs and a BatchNorm-free
//! convnet whose gradients are exactly batch-decomposable (used by the exactness tests).
//!
//! Every model is a chain of stages ([`Network`]): the ResNets run stem, each residual block
//! and the head (pool + fc) as stages; the convnet runs conv1, conv2 and the head. The full
//! forward pass is the composition of the stages, so a staged forward/backward (the table's
//! `overlap` backward) computes exactly the same operations. The head is the pooled
//! features ([`Network::features`]) through one linear layer ([`Network::classifier`]), which
//! `head_parallel` runs apart, on the features of the whole global batch.

use std::marker::PhantomData;
use std::sync::Mutex;

use tch::nn::{self, ModuleT};
use tch::Tensor;

use crate::error::Result;

pub mod kind;

pub use kind::ModelKind;

/// A network whose forward pass is a chain of stages: `forward_t(x)` is
/// `forward_stage(n - 1, ... forward_stage(0, x))`. Running backward stage by stage (last
/// first) makes the gradients of a stage's parameters final as soon as its backward is done.
pub trait Network: ModuleT {
    /// Number of stages.
    fn stages(&self) -> usize;
    /// Runs stage `stage` on its input (the images for stage 0, the previous stage's output
    /// otherwise); the last stage returns logits.
    fn forward_stage(&self, stage: usize, xs: &Tensor, train: bool) -> Tensor;
    /// The stage owning the variable `name` (dotted, relative to the model's root path).
    fn stage_of(&self, name: &str) -> usize;
    /// The input of the last stage reduced to the features the classifier reads, `[batch,
    /// features]`: the last stage is `features(xs).apply(classifier())`.
    fn features(&self, xs: &Tensor) -> Tensor;
    /// The classifier: one linear layer over the features, created last (`fc`).
    fn classifier(&self) -> &nn::Linear;
}

/// Runs all stages of `net` in order.
fn chain(net: &dyn Network, xs: &Tensor, train: bool) -> Tensor {
    (0..net.stages()).fold(xs.shallow_clone(), |x, s| net.forward_stage(s, &x, train))
}

/// The features `net` computes from `xs`: every stage but the classifier.
pub fn features_t(net: &dyn Network, xs: &Tensor, train: bool) -> Tensor {
    let last = net.stages() - 1;
    let x = (0..last).fold(xs.shallow_clone(), |x, s| net.forward_stage(s, &x, train));
    net.features(&x)
}

/// A model built into a variable store; `forward_t(images, train)` returns logits.
pub type Model = Box<dyn Network>;

/// A training forward pass kept for a backward pass that runs stage by stage, last first.
/// The graph is cut between stages: the input of stage s > 0 is the detached output of stage
/// s - 1, marked as requiring grad, so that the backward of stage s + 1 leaves the gradient of
/// stage s's output in that input, and the backward of stage s starts from `out_s` seeded with
/// it (`torch.autograd.backward(out_s, g)`).
///
/// The pass holds the graph of its input, which may view a loader batch's memory: it borrows
/// the input for `'a`, so that the batch cannot be released while the pass lives.
pub struct StagedPass<'a> {
    /// Input of every stage still to backpropagate (stage 0: the images).
    inputs: Vec<Tensor>,
    /// Output of every such stage.
    outputs: Vec<Tensor>,
    /// The input the graph starts from.
    input: PhantomData<&'a Tensor>,
}

/// Called with a stage's index just before the stage runs in a forward pass: where the table
/// applies the weight updates of that stage still pending from the previous step (the
/// `priority` communication order), so that the pass waits only for the stage it is about to
/// run.
pub type BeforeStage<'h> = &'h mut dyn FnMut(usize) -> Result<()>;

/// How a [`StagedPass`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PassMode {
    /// BatchNorm in training mode.
    pub train: bool,
    /// As a chain of stages with the graph cut between them, else in one piece (a single
    /// stage).
    pub staged: bool,
    /// Ends with the classifier (the output is the logits), else before it (the features).
    pub classify: bool,
}

impl<'a> StagedPass<'a> {
    /// Runs `net` forward on `xs` as `mode` says, calling `before` with each stage's index
    /// just before the stage runs (unstaged: for every stage first).
    pub fn run(
        net: &dyn Network,
        xs: &'a Tensor,
        mode: PassMode,
        before: BeforeStage<'_>,
    ) -> Result<Self> {
        let PassMode {
            train,
            staged,
            classify,
        } = mode;
        let mut inputs = Vec::new();
        let mut outputs = Vec::new();
        let last = net.stages() - 1;
        if staged {
            let mut x = xs.shallow_clone();
            for s in 0..net.stages() {
                before(s)?;
                if s > 0 {
                    x = x.f_detach()?.set_requires_grad(true);
                }
                let y = match s == last && !classify {
                    true => net.features(&x),
                    false => net.forward_stage(s, &x, train),
                };
                inputs.push(std::mem::replace(&mut x, y.shallow_clone()));
                outputs.push(y);
            }
        } else {
            for s in 0..net.stages() {
                before(s)?;
            }
            inputs.push(xs.shallow_clone());
            outputs.push(match classify {
                true => net.forward_t(xs, train),
                false => features_t(net, xs, train),
            });
        }
        Ok(StagedPass {
            inputs,
            outputs,
            input: PhantomData,
        })
    }

    /// Number of stages of the pass.
    pub fn stages(&self) -> usize {
        self.outputs.len()
    }

    /// The output of the last stage: the logits, or the features of a pass without the
    /// classifier.
    pub fn output(&self) -> &Tensor {
        &self.outputs[self.outputs.len() - 1]
    }

    /// Backpropagates through stage `stage` the gradient that the backward of stage
    /// `stage + 1` left at its input, and frees the tensors of the later stages. Call it for
    /// `stages() - 2` down to 0 after the backward of the loss (which covers the last stage).
    pub fn backward_stage(&mut self, stage: usize) -> Result<()> {
        let g = self
            .inputs
            .get(stage + 1)
            .map(|x| x.grad())
            .filter(|g| g.defined())
            .ok_or_else(|| {
                tch::TchError::Torch(format!(
                    "no gradient reached the input of stage {}",
                    stage + 1
                ))
            })?;
        crate::device::backward(&[&self.outputs[stage]], &[&g])?;
        self.inputs.truncate(stage + 1);
        self.outputs.truncate(stage + 1);
        Ok(())
    }
}

/// Serialises every use of torch's random generator, which is global to the process: building
/// a model draws its initial weights from it. Without it, a model built on one thread (a
/// table's, an export's layout) shifts the sequence another thread's seeded model draws from
/// (ranks simulated by threads, tests running side by side), and "the weights of the seed"
/// change from run to run.
static GENERATOR: Mutex<()> = Mutex::new(());

/// Builds `kind` for `classes` output classes under `p`, sized for square `image_size` inputs
/// (its initial weights drawn from torch's generator wherever it stands).
pub fn build(kind: ModelKind, p: &nn::Path, classes: i64, image_size: u32) -> Model {
    let _generator = GENERATOR.lock().unwrap_or_else(|e| e.into_inner());
    build_unlocked(kind, p, classes, image_size)
}

/// As [`build`], with the initial weights of `seed`: the same in every thread and process.
pub fn build_seeded(
    seed: i64,
    kind: ModelKind,
    p: &nn::Path,
    classes: i64,
    image_size: u32,
) -> Model {
    let _generator = GENERATOR.lock().unwrap_or_else(|e| e.into_inner());
    tch::manual_seed(seed);
    build_unlocked(kind, p, classes, image_size)
}

fn build_unlocked(kind: ModelKind, p: &nn::Path, classes: i64, image_size: u32) -> Model {
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
    /// (layer, block) of every block stage, in forward order.
    blocks: Vec<(usize, usize)>,
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
        let blocks = layers
            .iter()
            .enumerate()
            .flat_map(|(l, blocks)| (0..blocks.len()).map(move |b| (l, b)))
            .collect();
        ResNet {
            stem,
            conv1,
            bn1,
            layers,
            blocks,
            fc,
        }
    }
}

impl ModuleT for ResNet {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        chain(self, xs, train)
    }
}

impl Network for ResNet {
    /// Stem, every residual block, head.
    fn stages(&self) -> usize {
        self.blocks.len() + 2
    }

    fn forward_stage(&self, stage: usize, xs: &Tensor, train: bool) -> Tensor {
        if stage == 0 {
            let ys = xs.apply(&self.conv1).apply_t(&self.bn1, train).relu();
            let pool = match self.stem {
                Stem::ImageNet => true,
                Stem::Small { pool, .. } => pool,
            };
            if pool {
                ys.max_pool2d([3, 3], [2, 2], [1, 1], [1, 1], false)
            } else {
                ys
            }
        } else if let Some(&(l, b)) = self.blocks.get(stage - 1) {
            self.layers[l][b].forward_t(xs, train)
        } else {
            self.features(xs).apply(&self.fc)
        }
    }

    fn features(&self, xs: &Tensor) -> Tensor {
        xs.adaptive_avg_pool2d([1, 1]).flat_view()
    }

    fn classifier(&self) -> &nn::Linear {
        &self.fc
    }

    fn stage_of(&self, name: &str) -> usize {
        let mut parts = name.split('.');
        let first = parts.next().unwrap_or_default();
        if first == "fc" {
            return self.stages() - 1;
        }
        let layer = first
            .strip_prefix("layer")
            .and_then(|l| l.parse::<usize>().ok());
        let block = parts.next().and_then(|b| b.parse::<usize>().ok());
        match (layer, block) {
            (Some(l), Some(b)) => self
                .blocks
                .iter()
                .position(|&x| x == (l - 1, b))
                .map_or(0, |i| i + 1),
            _ => 0,
        }
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
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        chain(self, xs, train)
    }
}

impl Network for ConvNet {
    /// conv1, conv2, head.
    fn stages(&self) -> usize {
        3
    }

    fn forward_stage(&self, stage: usize, xs: &Tensor, _train: bool) -> Tensor {
        match stage {
            0 => xs.apply(&self.conv1).relu(),
            1 => xs.apply(&self.conv2).relu(),
            _ => self.features(xs).apply(&self.fc),
        }
    }

    fn features(&self, xs: &Tensor) -> Tensor {
        xs.adaptive_avg_pool2d([1, 1]).flat_view()
    }

    fn classifier(&self) -> &nn::Linear {
        &self.fc
    }

    fn stage_of(&self, name: &str) -> usize {
        match name.split('.').next() {
            Some("conv1") => 0,
            Some("conv2") => 1,
            _ => 2,
        }
    }
}
