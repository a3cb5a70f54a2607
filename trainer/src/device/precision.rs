//! The arithmetic a device computes forward and backward in.

use clap::ValueEnum;
use serde::Serialize;

/// Arithmetic precision of forward and backward (`precision`). Gradients are always reduced
/// in f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Everything in f32.
    Fp32,
    /// CUDA autocast to bfloat16 (on CPU: f32).
    Bf16,
    /// CUDA autocast to float16 with dynamic loss scaling (on CPU: f32).
    Fp16,
}
