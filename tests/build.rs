//! The end-to-end tests read ddl-train's checkpoints through ddl-trainer, which links libtorch:
//! bake libtorch's directory into the test binaries as an rpath, as trainer/build.rs does for
//! ddl-train, so that `cargo test` finds it without LD_LIBRARY_PATH.

fn main() {
    if let Some(dir) = std::env::var_os("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.to_string_lossy());
    }
}
