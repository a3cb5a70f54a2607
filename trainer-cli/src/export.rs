//! `ddl-export`'s command line (the binary: `src/bin/ddl-export.rs`; the library call:
//! [`ddl_trainer::export`]).

use std::path::PathBuf;

use clap::Parser;

/// Write the model of a ddl-train checkpoint as FILE.safetensors, with torchvision's keys,
/// shapes and dtypes and ddl's metadata (classes, eval transform, flags, val top-1/top-5).
#[derive(Parser, Debug)]
#[command(name = "ddl-export", version, max_term_width = 100)]
pub struct Args {
    /// A checkpoint file (ckpt-*.ddlck), or a checkpoint directory (its newest intact one).
    pub checkpoint: PathBuf,
    /// The .safetensors file to write.
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
    /// Shards whose manifest names the classes, for a checkpoint that predates class names
    /// (default: the --data of the run that wrote it).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Only errors.
    #[arg(long)]
    pub quiet: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use ddl_trainer::Setting;

    /// The settings `ddl-export`'s library calls name in their messages have a flag.
    #[test]
    fn every_setting_it_names_has_a_flag() {
        crate::assert_flags::<Args>(&[Setting::Output, Setting::Data]);
    }
}
