//! The binaries link libtorch through ddl-trainer: they get its rpath and CUDA libraries (see
//! trainer/build/libtorch.rs), as do the integration tests, which build CPU replicas too.

include!("../trainer/build/libtorch.rs");

fn main() {
    link_libtorch();
}
