//! The stages of the input pipeline that `ddl-prof` measures alone ([`Stage`]).

use serde::{Deserialize, Serialize};

/// One stage of the input pipeline, measured alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Record bytes from the shard file (page cache, or storage with `--cold`).
    Read,
    /// Index row, bounds and crc32c check of a mapped record.
    Check,
    /// Full-resolution JPEG decode.
    DecodeFull,
    /// DCT-scaled JPEG decode of the whole image.
    DecodeScaled,
    /// DCT-scaled decode of the crop's region (the pipeline's decoder).
    DecodeRegion,
    /// Crop and antialiased resize to the output size.
    CropResize,
    /// Normalization into a float32 batch buffer (collate).
    Normalize,
    /// Hand-off of batch-sized messages through a bounded channel.
    Queue,
}

impl Stage {
    /// All stages, in pipeline order.
    pub const ALL: [Stage; 8] = [
        Stage::Read,
        Stage::Check,
        Stage::DecodeFull,
        Stage::DecodeScaled,
        Stage::DecodeRegion,
        Stage::CropResize,
        Stage::Normalize,
        Stage::Queue,
    ];

    /// The stages every image of the real pipeline goes through (the other decoders are
    /// references): the candidates for the bottleneck.
    pub const PIPELINE: [Stage; 6] = [
        Stage::Read,
        Stage::Check,
        Stage::DecodeRegion,
        Stage::CropResize,
        Stage::Normalize,
        Stage::Queue,
    ];

    /// The snake_case name used in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Read => "read",
            Stage::Check => "check",
            Stage::DecodeFull => "decode_full",
            Stage::DecodeScaled => "decode_scaled",
            Stage::DecodeRegion => "decode_region",
            Stage::CropResize => "crop_resize",
            Stage::Normalize => "normalize",
            Stage::Queue => "queue",
        }
    }

    /// What the stage's `bytes_per_s` counts.
    pub fn bytes_basis(self) -> &'static str {
        match self {
            Stage::Read
            | Stage::Check
            | Stage::DecodeFull
            | Stage::DecodeScaled
            | Stage::DecodeRegion => "encoded",
            Stage::CropResize => "rgb_u8",
            Stage::Normalize => "f32",
            Stage::Queue => "payload",
        }
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
