//! The text tables `ddl-prof` prints.

use super::report::Report;
use super::stage::Stage;

/// `12,345` style integer rate.
pub fn fmt_rate(x: f64) -> String {
    let v = x.round().max(0.0) as u64;
    let s = v.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes with a binary unit (`12.3 MiB`).
pub fn fmt_bytes(x: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = x;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", units[u])
}

/// The report as a table (images/s per stage and thread count, bytes/s of the read stages,
/// the end-to-end scaling curve) followed by the verdict line.
pub fn render_table(r: &Report) -> String {
    let threads = &r.config.threads;
    let mut s = String::new();
    s.push_str(&format!(
        "ddl-prof: {} split {} node {}/{}: {} records in {} shards, {}, mean {:.0} x {:.0} px, {} per record{}\n",
        r.dataset.dir.display(),
        r.dataset.split,
        r.dataset.node,
        r.dataset.nodes,
        r.dataset.records,
        r.dataset.shards,
        fmt_bytes(r.dataset.file_bytes as f64),
        r.dataset.mean_width,
        r.dataset.mean_height,
        fmt_bytes(r.dataset.mean_record_bytes),
        if r.config.cold { ", cold reads" } else { "" }
    ));
    if let Some(c) = &r.cold {
        s.push_str(&format!(
            "page cache: {} of {} resident before the drop, {} after\n",
            fmt_bytes(c.resident_bytes_before as f64),
            fmt_bytes(c.file_bytes as f64),
            fmt_bytes(c.resident_bytes_after as f64)
        ));
    }
    s.push_str(&format!("{:<16}", "images/s"));
    for t in threads {
        s.push_str(&format!("{:>14}", format!("{t} thr")));
    }
    s.push_str(&format!("{:>16}\n", "bytes/s (max)"));
    for stage in Stage::ALL {
        s.push_str(&format!("{:<16}", stage.name()));
        let mut last_bytes = 0.0;
        for &t in threads {
            match r.stages.iter().find(|x| x.stage == stage && x.threads == t) {
                Some(x) => {
                    s.push_str(&format!("{:>14}", fmt_rate(x.images_per_s)));
                    last_bytes = x.bytes_per_s;
                }
                None => s.push_str(&format!("{:>14}", "-")),
            }
        }
        let bytes = if stage == Stage::Queue {
            "(by reference)".to_string()
        } else {
            format!("{}/s", fmt_bytes(last_bytes))
        };
        s.push_str(&format!("{bytes:>16}\n"));
    }
    s.push_str(&format!("{:<16}", "end_to_end"));
    for &t in threads {
        match r.end_to_end.iter().find(|x| x.threads == t) {
            Some(x) => s.push_str(&format!("{:>14}", fmt_rate(x.images_per_s))),
            None => s.push_str(&format!("{:>14}", "-")),
        }
    }
    s.push('\n');
    s.push_str(&format!("{:<16}", "  speedup"));
    for x in &r.end_to_end {
        s.push_str(&format!(
            "{:>14}",
            format!("{:.2}x ({:.0}%)", x.speedup, 100.0 * x.efficiency)
        ));
    }
    s.push('\n');
    s.push_str(&format!(
        "predicted from stages (1/sum of 1/rate): {} images/s\n",
        fmt_rate(r.verdict.predicted_images_per_s)
    ));
    s.push_str(&render_bad_records(r));
    s.push_str(&r.verdict.line);
    s.push('\n');
    s
}

/// The bad records of a report: a count line and one line for each named record (empty when
/// there were none).
pub fn render_bad_records(r: &Report) -> String {
    let b = &r.bad_records;
    if b.count == 0 {
        return String::new();
    }
    let mut s = format!(
        "bad records: {} met (left out of the stages; end to end: {}); `ddl-pack --verify {}` \
         lists every damaged record\n",
        b.count,
        match r.config.on_bad_record.as_str() {
            "skip" => "skipped",
            _ => "replaced by the next good record",
        },
        r.dataset.dir.display()
    );
    for x in &b.first {
        s.push_str(&format!(
            "  {} record {}: {}\n",
            x.file.display(),
            x.record,
            x.reason
        ));
    }
    if b.count as usize > b.first.len() {
        s.push_str(&format!(
            "  ... and {} more\n",
            b.count as usize - b.first.len()
        ));
    }
    s
}

/// Per-node summary of several nodes' reports (one per MPI rank), naming the slowest node.
pub fn render_nodes(reports: &[Report]) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "{:<6}{:>10}{:>12}{:>16}{:>16}{:>10}\n",
        "node", "records", "threads", "images/s", "bottleneck", "GPUs"
    ));
    for r in reports {
        s.push_str(&format!(
            "{:<6}{:>10}{:>12}{:>16}{:>16}{:>10}\n",
            r.dataset.node,
            r.dataset.records,
            r.verdict.threads,
            fmt_rate(r.verdict.node_images_per_s),
            r.verdict.bottleneck.name(),
            r.verdict.gpus_fed
        ));
    }
    if let Some(slow) = reports.iter().min_by(|a, b| {
        a.verdict
            .node_images_per_s
            .total_cmp(&b.verdict.node_images_per_s)
    }) {
        s.push_str(&format!(
            "slowest node: {} at {} images/s (bottleneck {}); every node feeds at least {} GPU(s) at {} images/s\n",
            slow.dataset.node,
            fmt_rate(slow.verdict.node_images_per_s),
            slow.verdict.bottleneck.name(),
            slow.verdict.gpus_fed,
            fmt_rate(slow.verdict.gpu_rate_images_per_s)
        ));
    }
    s
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::prof::default_threads;

    #[test]
    fn formats() {
        assert_eq!(fmt_rate(1234567.4), "1,234,567");
        assert_eq!(fmt_rate(999.0), "999");
        assert_eq!(fmt_bytes(1536.0), "1.5 KiB");
        assert!(default_threads().starts_with(&[1]));
    }
}
