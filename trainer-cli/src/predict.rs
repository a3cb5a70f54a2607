//! `ddl-predict`'s command line (the binary: `src/bin/ddl-predict.rs`; the library call:
//! [`ddl_trainer::predict`]).

use std::path::PathBuf;

use clap::Parser;

use ddl_trainer::model::ModelKind;

/// Classify images with a model written by `ddl-train --export` or `ddl-export` (or a
/// torchvision state dict in .safetensors, with --arch).
#[derive(Parser, Debug)]
#[command(name = "ddl-predict", version, max_term_width = 100)]
pub struct Args {
    /// The model (.safetensors).
    #[arg(long, value_name = "FILE")]
    pub model: PathBuf,
    /// Images (any format ddl-pack reads), or folders searched recursively for .jpg, .jpeg,
    /// .png, .bmp, .gif, .webp, .tif and .tiff files, in name order.
    #[arg(required = true, value_name = "IMAGE")]
    pub inputs: Vec<PathBuf>,
    /// Classes printed per image.
    #[arg(long, default_value_t = 5)]
    pub top: usize,
    /// auto (the first GPU if there is one) | cpu | cuda | cuda:N.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Images per forward pass.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..))]
    pub batch: u64,
    /// One JSON object per image ({"image", "top": [{"class", "label", "probability"}]}).
    #[arg(long)]
    pub json: bool,
    /// Also write every classified image's transformed pixels ("input", [n, 3, S, S]) and
    /// logits ("logits", [n, classes]) to FILE (.safetensors), to compare the model with
    /// another framework on exactly the same input.
    #[arg(long, value_name = "FILE")]
    pub save_tensors: Option<PathBuf>,
    /// The architecture, for a file without ddl's metadata (checked against it otherwise).
    #[arg(long, value_parser = crate::named::<ModelKind>())]
    pub arch: Option<ModelKind>,
    /// Input side in pixels (default: the file's metadata, else 224).
    #[arg(long)]
    pub image_size: Option<u32>,
    /// Shorter side before the center crop (default: the file's metadata, else image size x
    /// 8/7).
    #[arg(long)]
    pub eval_resize: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use ddl_trainer::Setting;

    /// The settings `ddl-predict`'s library calls name in their messages have a flag.
    #[test]
    fn every_setting_it_names_has_a_flag() {
        crate::assert_flags::<Args>(&[
            Setting::Device,
            Setting::Arch,
            Setting::ImageSize,
            Setting::EvalResize,
        ]);
    }
}
