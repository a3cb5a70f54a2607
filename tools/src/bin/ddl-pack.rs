//! `ddl-pack`: packs an ImageNet-style input into ddl shards (see `ddl_tools::pack_cli`).

use clap::Parser;

fn main() -> anyhow::Result<()> {
    ddl_tools::pack_cli::run(ddl_tools::pack_cli::Args::parse())
}
