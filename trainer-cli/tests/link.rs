//! Every binary that can build a CUDA replica loads libtorch_cuda.so and libc10_cuda.so when
//! the libtorch it links ships them: libtorch registers its CUDA backend from their static
//! initialisers, and without them tch sees no GPU on a GPU node. Skipped only with a
//! CPU-only libtorch.

use std::path::PathBuf;
use std::process::Command;

const BINARIES: [&str; 4] = [
    env!("CARGO_BIN_EXE_ddl-train"),
    env!("CARGO_BIN_EXE_ddl-predict"),
    env!("CARGO_BIN_EXE_ddl-export"),
    env!("CARGO_BIN_EXE_ddl-plan"),
];
const CUDA_LIBRARIES: [&str; 2] = ["libtorch_cuda.so", "libc10_cuda.so"];

/// The libraries mapped into this process.
fn mapped() -> String {
    std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps")
}

/// The folder of the libtorch this test links (where libtorch_cpu.so was loaded from).
fn libtorch_dir() -> PathBuf {
    let maps = mapped();
    let path = maps
        .split_whitespace()
        .find(|w| w.ends_with("/libtorch_cpu.so"))
        .expect("libtorch_cpu.so is mapped");
    PathBuf::from(path).parent().unwrap().to_path_buf()
}

fn cuda_libtorch() -> bool {
    let dir = libtorch_dir();
    let ships = CUDA_LIBRARIES.iter().all(|l| dir.join(l).exists());
    if !ships {
        eprintln!(
            "skipped: the libtorch in {} has no CUDA libraries",
            dir.display()
        );
    }
    ships
}

#[test]
fn binaries_load_the_cuda_libraries_of_a_cuda_libtorch() {
    if !cuda_libtorch() {
        return;
    }
    for bin in BINARIES {
        let out = Command::new(bin)
            .arg("--version")
            .env("LD_DEBUG", "libs")
            .output()
            .unwrap();
        assert!(out.status.success(), "{bin} --version");
        let log = String::from_utf8_lossy(&out.stderr);
        for lib in CUDA_LIBRARIES {
            assert!(
                log.lines()
                    .any(|l| l.contains("calling init:") && l.ends_with(lib)),
                "{bin} does not load {lib}"
            );
        }
    }
    // Test binaries build replicas too: this one is linked the same way.
    let maps = mapped();
    for lib in CUDA_LIBRARIES {
        assert!(
            maps.contains(&format!("/{lib}")),
            "this test does not load {lib}"
        );
    }
}

#[test]
fn a_gpu_that_is_not_there_is_named() {
    if tch::Cuda::device_count() > 0 {
        return;
    }
    let out = Command::new(BINARIES[0])
        .args([
            "--synthetic-data",
            "--devices",
            "cuda:0",
            "--max-steps",
            "1",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--devices") && err.contains("cuda:0 requested but 0 CUDA device(s) visible"),
        "{err}"
    );
}
