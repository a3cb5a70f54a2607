//! `ddl-predict --model FILE.safetensors IMAGE|FOLDER...`: the top classes of each image with
//! their probabilities, using the model's classes and eval transform (see
//! `ddl_trainer::predict`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use ddl_trainer::console::eprint_line;
use ddl_trainer::model::ModelKind;
use ddl_trainer::predict::{image_files, parse_device, Classifier, Overrides};
use ddl_trainer::weights::{file, Entry, StateDict};

#[path = "../cli/flags.rs"]
mod flags;

/// Classify images with a model written by `ddl-train --export` or `ddl-export` (or a
/// torchvision state dict in .safetensors, with --arch).
#[derive(Parser, Debug)]
#[command(name = "ddl-predict", version, about)]
struct Args {
    /// The model (.safetensors).
    #[arg(long, value_name = "FILE")]
    model: PathBuf,
    /// Images (any format ddl-pack reads), or folders searched recursively for .jpg, .jpeg,
    /// .png, .bmp, .gif, .webp, .tif and .tiff files, in name order.
    #[arg(required = true, value_name = "IMAGE")]
    inputs: Vec<PathBuf>,
    /// Classes printed per image.
    #[arg(long, default_value_t = 5)]
    top: usize,
    /// auto (the first GPU if there is one) | cpu | cuda | cuda:N.
    #[arg(long, default_value = "auto")]
    device: String,
    /// Images per forward pass.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..))]
    batch: u64,
    /// One JSON object per image ({"image", "top": [{"class", "label", "probability"}]}).
    #[arg(long)]
    json: bool,
    /// Also write every classified image's transformed pixels ("input", [n, 3, S, S]) and
    /// logits ("logits", [n, classes]) to FILE (.safetensors), to compare the model with
    /// another framework on exactly the same input.
    #[arg(long, value_name = "FILE")]
    save_tensors: Option<PathBuf>,
    /// The architecture, for a file without ddl's metadata (checked against it otherwise).
    #[arg(long, value_enum)]
    arch: Option<ModelKind>,
    /// Input side in pixels (default: the file's metadata, else 224).
    #[arg(long)]
    image_size: Option<u32>,
    /// Shorter side before the center crop (default: the file's metadata, else image size x
    /// 8/7).
    #[arg(long)]
    eval_resize: Option<u32>,
}

fn main() -> ExitCode {
    ddl_comm::cli::init_binary_signals();
    flags::install();
    let args = Args::parse();
    match run(&args) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprint_line(&format!(
                "ddl-predict: error: {}",
                ddl_comm::cli::error_chain(&*e)
            ));
            ExitCode::FAILURE
        }
    }
}

/// Classifies every image; returns how many could not be read.
fn run(args: &Args) -> anyhow::Result<usize> {
    if let Some(path) = &args.save_tensors {
        file::check_destination(path).map_err(anyhow::Error::msg)?;
    }
    let device = parse_device(&args.device)?;
    let overrides = Overrides {
        arch: args.arch,
        image_size: args.image_size,
        eval_resize: args.eval_resize,
    };
    let classifier = Classifier::load(&args.model, device, &overrides)?;
    let files = image_files(&args.inputs)?;
    anyhow::ensure!(!files.is_empty(), "no image found in {:?}", args.inputs);
    let mut failed = 0;
    let kept = classifier.classify_files(
        &files,
        args.batch as usize,
        args.top,
        args.save_tensors.is_some(),
        &mut |path, result| match result {
            Err(why) => {
                failed += 1;
                eprint_line(&format!("ddl-predict: error: {}: {why}", path.display()));
            }
            Ok(top) if args.json => {
                let top: Vec<serde_json::Value> = top
                    .iter()
                    .map(|p| {
                        serde_json::json!({
                            "class": p.class, "label": p.label, "probability": p.probability
                        })
                    })
                    .collect();
                ddl_comm::outln!("{}", serde_json::json!({"image": path, "top": top}));
            }
            Ok(top) => {
                let mut text = format!("{}\n", path.display());
                for (i, p) in top.iter().enumerate() {
                    text.push_str(&format!(
                        "  {}. {:<12} {:.4}\n",
                        i + 1,
                        p.class,
                        p.probability
                    ));
                }
                ddl_comm::cli::write_stdout(&text);
            }
        },
    )?;
    if let Some(path) = &args.save_tensors {
        let m = classifier.meta();
        let n = kept.images.len();
        let s = m.image_size as usize;
        let mut dict = StateDict::default();
        dict.tensors
            .insert("input".into(), Entry::f32(vec![n, 3, s, s], &kept.inputs));
        dict.tensors.insert(
            "logits".into(),
            Entry::f32(vec![n, m.classes.len()], &kept.logits),
        );
        let images: Vec<String> = kept
            .images
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        let meta = [(
            "images".to_string(),
            serde_json::to_string(&images).unwrap_or_default(),
        )]
        .into();
        file::write(path, &dict, &meta)
            .with_context(|| format!("writing --save-tensors {}", path.display()))?;
    }
    Ok(failed)
}
