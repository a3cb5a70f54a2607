//! Which Python compiles the step: the one whose torch is the libtorch this process runs on,
//! so that the package is built by the same torch that loads it.

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{Result, TrainError};

/// The Python that compiles, and the version of the libtorch it must match.
#[derive(Clone, Debug)]
pub struct Python {
    /// The interpreter.
    pub exe: PathBuf,
    /// `torch.__version__` of the loaded libtorch, e.g. `2.11.0+cu130`.
    pub torch_version: String,
}

/// The directory of the libtorch_cpu.so mapped into this process.
fn loaded_libtorch() -> Result<PathBuf> {
    let maps =
        fs::read_to_string("/proc/self/maps").map_err(|e| TrainError::io("/proc/self/maps", e))?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.ends_with("/libtorch_cpu.so"))
        .and_then(|p| Path::new(p).parent().map(Path::to_path_buf))
        .ok_or_else(|| TrainError::Compile("libtorch_cpu.so is not loaded in this process".into()))
}

/// The version of the libtorch in `lib`: torch's `version.py` beside it (a pip torch), or the
/// `build-version` file of a libtorch download.
fn torch_version(lib: &Path) -> Result<String> {
    let root = lib.parent().unwrap_or(lib);
    if let Ok(text) = fs::read_to_string(root.join("version.py")) {
        let found = text.lines().find_map(|l| {
            let v = l
                .strip_prefix("__version__")?
                .trim_start()
                .strip_prefix('=')?;
            Some(v.trim().trim_matches(|c| c == '\'' || c == '"').to_string())
        });
        if let Some(v) = found {
            return Ok(v);
        }
    }
    if let Ok(v) = fs::read_to_string(root.join("build-version")) {
        return Ok(v.trim().to_string());
    }
    Err(TrainError::Compile(format!(
        "cannot tell the version of the libtorch in {}: neither {} nor {} says it",
        lib.display(),
        root.join("version.py").display(),
        root.join("build-version").display()
    )))
}

/// The Python that compiles: `explicit` if given (DDL_PYTHON), else the interpreter of the
/// environment the loaded torch is installed in (`<prefix>/lib/pythonX.Y/site-packages/torch`
/// gives `<prefix>/bin/python3`: a virtualenv's own), else `python3` on the PATH.
pub fn find(explicit: Option<&Path>) -> Result<Python> {
    let lib = loaded_libtorch()?;
    let torch_version = torch_version(&lib)?;
    let exe = match explicit {
        Some(p) => p.to_path_buf(),
        None => lib
            .ancestors()
            .nth(5)
            .map(|prefix| prefix.join("bin/python3"))
            .filter(|p| p.is_file())
            .unwrap_or_else(|| PathBuf::from("python3")),
    };
    Ok(Python { exe, torch_version })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loaded_libtorch_and_its_python_are_found() {
        let _ = tch::Tensor::zeros([1], (tch::Kind::Float, tch::Device::Cpu));
        let python = find(None).unwrap();
        assert!(python.torch_version.starts_with("2."), "{python:?}");
        // The project's virtualenv: its python imports the same torch.
        let out = std::process::Command::new(&python.exe)
            .args(["-c", "import torch; print(torch.__version__)"])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            python.torch_version
        );
    }
}
