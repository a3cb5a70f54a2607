// Shared by the build scripts of the crates whose binaries link libtorch (`include!`d).

/// Bakes libtorch's directory into every binary as an rpath (so that `ddl-train` runs under
/// mpirun on any node without LD_LIBRARY_PATH) and, when that libtorch ships CUDA, makes every
/// binary load libtorch_cuda and libc10_cuda.
///
/// libtorch registers its CUDA backend from static initialisers in libtorch_cuda.so. No symbol
/// of it is referenced, so the linker's `--as-needed` (Debian's default) drops the
/// `-ltorch_cuda` that torch-sys asks for, and tch then sees no GPU. The libraries are named
/// again here between `--no-as-needed` and `--as-needed`: link arguments come last on the
/// command line, so a bare `--no-as-needed` would apply to nothing.
///
/// libtorch.so itself is kept for the same reason: the compiled step's package (an
/// AOTInductor shared library, `dlopen`ed by libtorch) needs it, and finds it only when it is
/// already loaded (the binary's rpath does not apply to a `dlopen`ed library's dependencies).
fn link_libtorch() -> Option<std::path::PathBuf> {
    let dir = std::path::PathBuf::from(std::env::var_os("DEP_TCH_LIBTORCH_LIB")?);
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    let cuda = ["torch_cuda", "c10_cuda"];
    let mut kept = vec!["torch"];
    if cuda.iter().all(|l| dir.join(format!("lib{l}.so")).exists()) {
        kept.extend(cuda);
    }
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    for l in kept {
        println!("cargo:rustc-link-arg=-l{l}");
    }
    println!("cargo:rustc-link-arg=-Wl,--as-needed");
    Some(dir)
}
