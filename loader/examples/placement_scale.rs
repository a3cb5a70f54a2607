//! The record placement at ImageNet-22k's scale, from shard sizes alone (no shard files).
//!
//! ```text
//! cargo run --release -p ddl-loader --example placement_scale -- DIR [RECORDS SHARDS]
//! cargo run --release -p ddl-loader --example placement_scale -- --resume NODES Q EPOCH \
//!     [RECORDS SHARDS]
//! ```
//!
//! The first form writes `DIR/manifest.json` for RECORDS train records (14,197,122 by default,
//! ImageNet-22k's) in SHARDS shards (1024) as ddl-pack deals them (sizes within one), 110 KB a
//! record, for `ddl-plan --exchange Q --data DIR`. The second prints the seconds a run of 90
//! epochs resumed at EPOCH with `--exchange Q` on NODES nodes spends placing the records before
//! the epoch's records can move.

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use ddl_loader::manifest::{ClassInfo, Manifest, ShardInfo, SplitInfo};
use ddl_loader::placement::{difference, Placement};

/// ImageNet-22k's images (the fall 2011 release).
const RECORDS: u64 = 14_197_122;
const SHARDS: u64 = 1024;
/// The epochs of the run resumed.
const EPOCHS: u64 = 90;

/// Records of each of `shards` shards of `records`, as ddl-pack deals inputs (`i % shards`).
fn sizes(records: u64, shards: u64) -> Vec<u64> {
    (0..shards)
        .map(|s| records / shards + u64::from(s < records % shards))
        .collect()
}

fn write_manifest(dir: &Path, records: u64, shards: u64) -> ddl_loader::Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| ddl_loader::LoaderError::io("create", dir, e))?;
    let shards: Vec<ShardInfo> = sizes(records, shards)
        .into_iter()
        .enumerate()
        .map(|(s, n)| ShardInfo {
            file: format!("train-{s:05}.ddl"),
            records: n,
            bytes: n * 110_000,
            crc32c: 0,
            node: 0,
        })
        .collect();
    let manifest = Manifest {
        format_version: ddl_loader::format::VERSION,
        classes: vec![ClassInfo {
            wnid: "n00000001".into(),
            label: 0,
        }],
        splits: [("train".to_string(), SplitInfo { records, shards })]
            .into_iter()
            .collect(),
        pack: serde_json::json!({"generated": "placement_scale: shard sizes only"}),
        nodes: 1,
    };
    manifest.save(dir)
}

/// Times what a run resumed at `epoch` computes of the placement before its first step: the
/// placement, node 0's memory bound over `EPOCHS`, the holdings the transfer goes from (the
/// home records) and to (`epoch`'s), and every node's new records.
fn resume(nodes: usize, q: f64, epoch: u64, records: u64, shards: u64) -> ddl_loader::Result<()> {
    let t = Instant::now();
    let placement = Placement::new(&sizes(records, shards), nodes, q, 0)?;
    let new_s = t.elapsed().as_secs_f64();
    let bound = placement.most_foreign(0, EPOCHS);
    let from = placement.home_holdings();
    let to = placement.holdings(epoch);
    let moved: usize = (0..nodes)
        .map(|n| difference(to.node(n), from.node(n)).len())
        .sum();
    println!(
        "{records} records, {shards} shards, {nodes} nodes, Q {q}, epoch {epoch} of {EPOCHS}: \
         {:.2} s ({new_s:.2} s the placement); node 0 holds {} (at most {bound} of other nodes), \
         {moved} records move",
        t.elapsed().as_secs_f64(),
        to.node(0).len(),
    );
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |i: usize, default: u64| args.get(i).map_or(Ok(default), |a| a.parse());
    let done = match args.first().map(String::as_str) {
        Some("--resume") if args.len() >= 4 => {
            let (nodes, q, epoch) = (args[1].parse(), args[2].parse(), args[3].parse());
            match (nodes, q, epoch, number(4, RECORDS), number(5, SHARDS)) {
                (Ok(n), Ok(q), Ok(e), Ok(r), Ok(s)) => {
                    resume(n, q, e, r, s).map_err(|e| e.to_string())
                }
                _ => Err("--resume NODES Q EPOCH [RECORDS SHARDS]: numbers".into()),
            }
        }
        Some(dir) if !dir.starts_with('-') => match (number(1, RECORDS), number(2, SHARDS)) {
            (Ok(r), Ok(s)) => write_manifest(Path::new(dir), r, s).map_err(|e| e.to_string()),
            _ => Err("DIR [RECORDS SHARDS]: numbers".into()),
        },
        _ => Err("usage: placement_scale DIR [RECORDS SHARDS] | --resume NODES Q EPOCH".into()),
    };
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("placement_scale: {e}");
            ExitCode::FAILURE
        }
    }
}
