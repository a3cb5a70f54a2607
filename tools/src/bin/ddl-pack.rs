//! `ddl-pack`: packs an ImageNet-style input into ddl shards (see `ddl_tools::pack_cli`).

use std::process::ExitCode;

use ddl_cli as cli;
use ddl_tools::pack_cli;

fn main() -> ExitCode {
    cli::run("ddl-pack", || pack_cli::run(cli::parse()))
}
