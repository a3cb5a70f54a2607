//! `ddl-predict --model FILE.safetensors IMAGE|FOLDER...`: the top classes of each image with
//! their probabilities, using the model's classes and eval transform (see
//! `ddl_trainer::predict`).

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use ddl_trainer::console::eprint_line;
use ddl_trainer::predict::{image_files, parse_device, Classifier, Overrides};
use ddl_trainer::weights::{file, Entry, StateDict};
use ddl_trainer_cli::predict::Args;

fn main() -> ExitCode {
    ddl_cli::init_binary_signals();
    let args = Args::parse();
    match run(&args) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprint_line(&format!(
                "ddl-predict: error: {}",
                ddl_cli::error_chain(&*e)
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
                ddl_cli::outln!("{}", serde_json::json!({"image": path, "top": top}));
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
                ddl_cli::write_stdout(&text);
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
