//! Links libtorch (rpath, CUDA libraries: trainer/build/libtorch.rs) and compiles the small C++
//! shim of the libtorch calls tch does not bind (src/device/shim.cpp) and the loader of the
//! compiled step (src/compiled/package.cpp) against the same headers.

include!("build/libtorch.rs");

fn main() {
    let Some(lib) = link_libtorch() else {
        panic!("torch-sys gave no DEP_TCH_LIBTORCH_LIB: cannot find libtorch's headers");
    };
    // libtorch's own layout, for a pip torch (torch/lib, torch/include) as for the libtorch zip.
    let include = lib.join("../include");
    println!("cargo:rerun-if-changed=src/device/shim.cpp");
    println!("cargo:rerun-if-changed=src/compiled/package.cpp");
    println!("cargo:rerun-if-changed=src/device/guarded.h");
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".into());
    cc::Build::new()
        .cpp(true)
        .pic(true)
        .warnings(false)
        .std("c++17")
        .define("_GLIBCXX_USE_CXX11_ABI", abi.as_str())
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .file("src/device/shim.cpp")
        .file("src/compiled/package.cpp")
        .compile("ddl_torch_shim");
}
