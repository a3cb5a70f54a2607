//! What can be wrong with a weights file: every error names the file and, where there is one,
//! the tensor (its torchvision key).

use std::fmt;
use std::path::PathBuf;

use crate::config::Setting;

/// The problems a `.safetensors` weights file can have, each naming the file and the key.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    /// The file could not be read or written.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a readable safetensors file (too short, a damaged header, ...).
    #[error("{}: not a readable safetensors file: {message}", .path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The file ends before the data of a tensor (an interrupted copy or download).
    #[error(
        "{}: truncated: tensor {key} needs bytes {start}..{end} of the data section, the file \
         holds {have}",
        .path.display()
    )]
    Truncated {
        /// The file.
        path: PathBuf,
        /// The first tensor whose data is cut off.
        key: String,
        /// Its first byte in the data section.
        start: usize,
        /// One past its last byte.
        end: usize,
        /// Bytes the data section actually holds.
        have: usize,
    },
    /// A tensor's header entry is inconsistent (its byte range does not fit its shape and
    /// dtype, or it overlaps another).
    #[error("{}: tensor {key}: {message}", .path.display())]
    BadEntry {
        /// The file.
        path: PathBuf,
        /// The tensor.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// A tensor the model needs is not in the file.
    #[error(
        "{}: tensor {key} missing: {model} needs it{}",
        .path.display(),
        more_note(*.more, "missing")
    )]
    Missing {
        /// The file.
        path: PathBuf,
        /// The first missing key, in torchvision's order.
        key: String,
        /// The model.
        model: String,
        /// How many other keys are missing too.
        more: usize,
    },
    /// The file holds a tensor the model does not have (strict loading, as torch's
    /// `load_state_dict(strict=True)`).
    #[error(
        "{}: tensor {key} is not part of {model}{}",
        .path.display(),
        more_note(*.more, "unexpected")
    )]
    Unexpected {
        /// The file.
        path: PathBuf,
        /// The first unexpected key (sorted).
        key: String,
        /// The model.
        model: String,
        /// How many other keys are unexpected too.
        more: usize,
    },
    /// A tensor has another shape than the model's.
    #[error(
        "{}: tensor {key} has shape {}, {model} needs {}{}",
        .path.display(),
        Shape(.found),
        Shape(.expected),
        head_hint(.key)
    )]
    Shape {
        /// The file.
        path: PathBuf,
        /// The tensor.
        key: String,
        /// The model.
        model: String,
        /// Its shape in the file.
        found: Vec<usize>,
        /// The model's shape.
        expected: Vec<usize>,
    },
    /// A tensor has another dtype than torchvision's (float32, int64 for
    /// `num_batches_tracked`).
    #[error(
        "{}: tensor {key} is {found:?}, ddl reads {expected:?} (torchvision's dtype for this \
         tensor: save float weights as float32)",
        .path.display()
    )]
    Dtype {
        /// The file.
        path: PathBuf,
        /// The tensor.
        key: String,
        /// Its dtype in the file.
        found: safetensors::Dtype,
        /// The dtype ddl reads.
        expected: safetensors::Dtype,
    },
    /// ddl's metadata in the file is missing a field or holds a bad value.
    #[error("{}: metadata {key}: {message}", .path.display())]
    Metadata {
        /// The file.
        path: PathBuf,
        /// The metadata field.
        key: String,
        /// What is wrong.
        message: String,
    },
}

/// What to do about a classifier head of another shape: another class count.
fn head_hint(key: &str) -> String {
    if super::head::is_head(key) {
        format!(
            " (the classifier head: pass {} to re-initialise it for this dataset's classes)",
            Setting::ResetHead
        )
    } else {
        String::new()
    }
}

/// ` (and N more KIND)` when `more` > 0.
fn more_note(more: usize, kind: &str) -> String {
    if more == 0 {
        String::new()
    } else {
        format!(" (and {more} more {kind})")
    }
}

/// A shape as torch prints it: `[64, 3, 7, 7]`, `[]` for a scalar.
struct Shape<'a>(&'a [usize]);

impl fmt::Display for Shape<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}
