//! The end-to-end tests read ddl-train's checkpoints through ddl-trainer, which links libtorch:
//! the test binaries get the same rpath and CUDA libraries as ddl-train (see
//! trainer/build/libtorch.rs).

include!("../trainer/build/libtorch.rs");

fn main() {
    link_libtorch();
}
