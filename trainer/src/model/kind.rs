//! `model`: which network to train, as the command line names it.

use std::fmt;

use crate::flag_value::{flag_value_named, Named};

/// Which network to train.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
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

impl Named for ModelKind {
    const ALL: &'static [Self] = &[
        ModelKind::Resnet18,
        ModelKind::Resnet34,
        ModelKind::Resnet50,
        ModelKind::Resnet101,
        ModelKind::Resnet152,
        ModelKind::ResnetSmall,
        ModelKind::ConvnetNobn,
    ];

    fn name(self) -> &'static str {
        ModelKind::name(self)
    }
}

impl ModelKind {
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
}

impl fmt::Display for ModelKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

flag_value_named!(ModelKind);
