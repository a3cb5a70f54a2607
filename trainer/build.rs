//! Bakes libtorch's directory into every binary as an rpath, so that `ddl-train` runs under
//! mpirun on any node without LD_LIBRARY_PATH.

fn main() {
    if let Some(dir) = std::env::var_os("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.to_string_lossy());
    }
    // Keep libtorch_cuda linked even though no symbol of it is referenced directly, so that CUDA
    // devices are visible when the same binary runs on a GPU node.
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
}
