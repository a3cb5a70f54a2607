//! The arithmetic a device computes forward and backward in.

use serde::Serialize;

use crate::flag_value::{flag_value_named, Named};

/// Arithmetic precision of forward and backward (`precision`). Gradients are always reduced
/// in f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Everything in f32.
    Fp32,
    /// CUDA autocast to bfloat16 (on CPU: f32).
    Bf16,
    /// CUDA autocast to float16 with dynamic loss scaling (on CPU: f32).
    Fp16,
}

impl Named for Precision {
    const ALL: &'static [Self] = &[Precision::Fp32, Precision::Bf16, Precision::Fp16];

    fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
        }
    }

    fn help(self) -> &'static str {
        match self {
            Precision::Fp32 => "everything in f32",
            Precision::Bf16 => "CUDA autocast to bfloat16 (on CPU: f32)",
            Precision::Fp16 => "CUDA autocast to float16 with dynamic loss scaling (on CPU: f32)",
        }
    }
}

flag_value_named!(Precision);
