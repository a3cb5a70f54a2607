//! What a pack run tells its caller: `pack-report.json` (every count, skipped input and
//! left-over file) and, when the skip fraction is within the limit, `manifest.json`.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::names::REPORT_FILE;
use super::options::PackOptions;
use super::shard_plan::SplitPlan;
use super::shards::Tally;
use super::source::{Inputs, LabelSource};
use super::split::ValSplitReport;
use crate::error::{LoaderError, Result};
use crate::manifest::{write_atomic, ClassInfo, Manifest, SplitInfo};

/// An input that was not packed, as listed in the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedInput {
    /// Split ("train" or "val").
    pub split: String,
    /// File path, or `ARCHIVE:MEMBER` for a tar member.
    pub path: String,
    /// One of "unreadable", "zero-byte", "truncated", "not an image", "corrupt", "too large".
    pub reason: String,
    /// Details (decoder or I/O message).
    pub detail: String,
}

/// Per-class counts of one split.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassCount {
    /// WordNet id.
    pub wnid: String,
    /// Label.
    pub label: u32,
    /// Records packed.
    pub records: u64,
    /// Inputs skipped.
    pub skipped: u64,
}

/// Counts of one split.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SplitReport {
    /// How the split's inputs were found.
    pub layout: String,
    /// Where its labels come from (files and rule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<LabelSource>,
    /// Inputs found (those rejected before decoding included).
    pub inputs: u64,
    /// Their total size in bytes.
    pub input_bytes: u64,
    /// Records packed.
    pub records: u64,
    /// Inputs skipped (those rejected before decoding included).
    pub skipped: u64,
    /// Total size of the split's shard files.
    pub output_bytes: u64,
    /// Number of shards.
    pub shards: usize,
    /// Shards kept from a previous, interrupted run.
    pub shards_kept: usize,
    /// Records copied byte for byte.
    pub copied: u64,
    /// Records re-encoded at their original size.
    pub reencoded: u64,
    /// Records resized and re-encoded.
    pub resized: u64,
    /// Per-class counts in label order.
    pub classes: Vec<ClassCount>,
}

/// A file that was not considered an input, with the reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IgnoredFile {
    /// Path (or `ARCHIVE:MEMBER`).
    pub path: String,
    /// Why it was ignored.
    pub reason: String,
}

/// `pack-report.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PackReport {
    /// Input directory.
    pub input: String,
    /// Output directory.
    pub output: String,
    /// Number of classes.
    pub classes: usize,
    /// Per split.
    pub splits: BTreeMap<String, SplitReport>,
    /// Inputs of classes left out by the class list, by wnid.
    pub ignored_classes: BTreeMap<String, u64>,
    /// The minimum per class (0: no class dropped).
    #[serde(default)]
    pub min_per_class: u64,
    /// Classes dropped by that minimum, with their usable input counts.
    #[serde(default)]
    pub dropped_classes: BTreeMap<String, u64>,
    /// The validation split carved from the training inputs, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_split: Option<ValSplitReport>,
    /// Files that were not inputs (wrong extension, unlabelled validation images).
    pub ignored_files: Vec<IgnoredFile>,
    /// Every skipped input, in split and input order.
    pub skipped: Vec<SkippedInput>,
    /// Skipped inputs / all inputs.
    pub skip_fraction: f64,
    /// The limit it was checked against.
    pub max_skip_fraction: f64,
    /// Training classes left without a record although they had inputs (every one failed),
    /// by wnid, with their input counts: the pack stops unless `keep_empty_classes`.
    #[serde(default)]
    pub empty_classes: BTreeMap<String, u64>,
    /// Whether the pack is usable (manifest written): the skip fraction within the limit and
    /// no class emptied by skipped inputs.
    pub ok: bool,
    /// Entries of the output directory this pack did not write, left untouched.
    #[serde(default)]
    pub left_in_place: Vec<String>,
    /// Worker threads used.
    pub threads: usize,
    /// Wall time of this run in seconds.
    pub elapsed_s: f64,
    /// Inputs processed per second in this run (kept shards excluded).
    pub images_per_s: f64,
}

/// The report of one split and its manifest entry, with its skipped inputs in input order.
fn split_report(
    p: &SplitPlan<'_>,
    inputs: &Inputs,
    tally: &Tally,
) -> (SplitReport, SplitInfo, Vec<SkippedInput>) {
    let rejected: Vec<SkippedInput> = inputs
        .rejected
        .iter()
        .filter(|r| r.split == p.name)
        .map(|r| SkippedInput {
            split: r.split.clone(),
            path: r.path.clone(),
            reason: r.reason.clone(),
            detail: r.detail.clone(),
        })
        .collect();
    let mut rep = SplitReport {
        layout: inputs.layouts.get(&p.name).cloned().unwrap_or_default(),
        labels: inputs.labels.get(&p.name).cloned(),
        inputs: (p.items.len() + rejected.len()) as u64,
        input_bytes: p.items.iter().map(|i| i.size).sum(),
        records: 0,
        skipped: 0,
        output_bytes: 0,
        shards: p.shards,
        shards_kept: 0,
        copied: 0,
        reencoded: 0,
        resized: 0,
        classes: inputs
            .classes
            .iter()
            .zip(&tally.class_records[&p.name])
            .enumerate()
            .map(|(l, (w, &records))| ClassCount {
                wnid: w.clone(),
                label: l as u32,
                records,
                skipped: 0,
            })
            .collect(),
    };
    let mut shard_infos = Vec::with_capacity(p.shards);
    let mut skips = Vec::new();
    for s in 0..p.shards {
        let o = &tally.outcomes[&(p.name.clone(), s)];
        rep.records += o.info.records;
        rep.output_bytes += o.info.bytes;
        rep.copied += o.done.copied;
        rep.reencoded += o.done.reencoded;
        rep.resized += o.done.resized;
        rep.shards_kept += usize::from(o.kept);
        for (i, reason, detail) in &o.done.skipped {
            let item = &p.items[*i as usize];
            rep.classes[item.label as usize].skipped += 1;
            skips.push((
                *i,
                SkippedInput {
                    split: p.name.clone(),
                    path: inputs.display(item),
                    reason: reason.clone(),
                    detail: detail.clone(),
                },
            ));
        }
        shard_infos.push(o.info.clone());
    }
    rep.skipped = (skips.len() + rejected.len()) as u64;
    skips.sort_by_key(|(i, _)| *i);
    let info = SplitInfo {
        records: rep.records,
        shards: shard_infos,
    };
    let skipped = rejected
        .into_iter()
        .chain(skips.into_iter().map(|(_, s)| s))
        .collect();
    (rep, info, skipped)
}

/// How the run went, besides the shards.
pub(crate) struct RunFacts {
    /// The held-out split, if carved.
    pub val_split: Option<ValSplitReport>,
    /// Entries of the output directory left untouched.
    pub left: Vec<String>,
    /// Worker threads.
    pub threads: usize,
    /// When the run started.
    pub started: Instant,
}

/// Writes `pack-report.json` and, when the pack is usable, `manifest.json`; returns the
/// report, or [`LoaderError::ClassesWithoutRecords`] when skipped inputs emptied a training
/// class, or [`LoaderError::SkipFraction`] above the limit.
pub(crate) fn finish(
    opts: &PackOptions,
    inputs: &Inputs,
    plans: &[SplitPlan<'_>],
    tally: &Tally,
    run: RunFacts,
) -> Result<PackReport> {
    let mut splits = BTreeMap::new();
    let mut splits_manifest = BTreeMap::new();
    let mut skipped = Vec::new();
    for p in plans {
        let (rep, info, skips) = split_report(p, inputs, tally);
        skipped.extend(skips);
        splits_manifest.insert(p.name.clone(), info);
        splits.insert(p.name.clone(), rep);
    }
    // Inputs rejected before decoding count as found and skipped.
    let total: u64 = splits.values().map(|r| r.inputs).sum();
    let skip_fraction = if total == 0 {
        0.0
    } else {
        skipped.len() as f64 / total as f64
    };
    let empty_classes = if opts.keep_empty_classes {
        BTreeMap::new()
    } else {
        emptied_classes(plans, &splits)
    };
    let elapsed = run.started.elapsed().as_secs_f64();
    let converted: u64 = plans.iter().map(|p| p.items.len() as u64).sum();
    let report = PackReport {
        input: opts.input.display().to_string(),
        output: opts.output.display().to_string(),
        classes: inputs.classes.len(),
        splits,
        ignored_classes: inputs.ignored_classes.clone(),
        min_per_class: opts.min_per_class,
        dropped_classes: inputs.dropped_classes.clone(),
        val_split: run.val_split.clone(),
        ignored_files: inputs
            .ignored_files
            .iter()
            .map(|(p, r)| IgnoredFile {
                path: p.clone(),
                reason: r.clone(),
            })
            .collect(),
        skipped,
        skip_fraction,
        max_skip_fraction: opts.max_skip_fraction,
        ok: skip_fraction <= opts.max_skip_fraction && empty_classes.is_empty(),
        empty_classes,
        left_in_place: run.left,
        threads: run.threads,
        elapsed_s: elapsed,
        images_per_s: (converted - tally.kept_inputs) as f64 / elapsed.max(1e-9),
    };
    let report_path = opts.output.join(REPORT_FILE);
    let text = serde_json::to_vec_pretty(&report).map_err(|source| LoaderError::Json {
        path: report_path.clone(),
        source,
    })?;
    write_atomic(&report_path, &text)?;
    if !report.empty_classes.is_empty() {
        return Err(LoaderError::ClassesWithoutRecords {
            path: report_path,
            classes: report.empty_classes.clone(),
        });
    }
    if !report.ok {
        return Err(LoaderError::SkipFraction {
            path: report_path,
            skipped: report.skipped.len() as u64,
            inputs: total,
            max: opts.max_skip_fraction,
        });
    }
    manifest(opts, inputs, plans, splits_manifest, run.val_split).save(&opts.output)?;
    Ok(report)
}

/// The training classes that had inputs but got no record (every input skipped), with their
/// input counts: a model would carry an output no image ever trains.
fn emptied_classes(
    plans: &[SplitPlan<'_>],
    splits: &BTreeMap<String, SplitReport>,
) -> BTreeMap<String, u64> {
    let (Some(plan), Some(rep)) = (
        plans.iter().find(|p| p.name == "train"),
        splits.get("train"),
    ) else {
        return BTreeMap::new();
    };
    let mut inputs = vec![0u64; rep.classes.len()];
    for it in plan.items {
        inputs[it.label as usize] += 1;
    }
    rep.classes
        .iter()
        .filter(|c| c.records == 0 && inputs[c.label as usize] > 0)
        .map(|c| (c.wnid.clone(), inputs[c.label as usize]))
        .collect()
}

/// The manifest of a finished pack.
fn manifest(
    opts: &PackOptions,
    inputs: &Inputs,
    plans: &[SplitPlan<'_>],
    splits: BTreeMap<String, SplitInfo>,
    val_split: Option<ValSplitReport>,
) -> Manifest {
    Manifest {
        format_version: crate::format::VERSION,
        classes: inputs
            .classes
            .iter()
            .enumerate()
            .map(|(l, w)| ClassInfo {
                wnid: w.clone(),
                label: l as u32,
            })
            .collect(),
        splits,
        pack: serde_json::json!({
            "packer": concat!("ddl-pack ", env!("CARGO_PKG_VERSION")),
            "max_short_side": opts.convert.max_short_side,
            "quality": opts.convert.quality,
            "subsampling": "4:2:0",
            "reencode": opts.convert.reencode,
            "resize_filter": "lanczos3",
            "order": opts.order.describe(),
            "plans": plans.iter().map(|p| (p.name.clone(), p.plan.clone())).collect::<BTreeMap<_, _>>(),
            "min_per_class": opts.min_per_class,
            "dropped_classes": inputs.dropped_classes.len(),
            "val_split": val_split,
            "labels": inputs.labels,
        }),
        nodes: opts.nodes,
    }
}
