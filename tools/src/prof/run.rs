//! One profile run ([`profile`]): index the node's records, sample and resize a few, then per
//! thread count measure every stage alone and the whole pipeline, and judge the result.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use ddl_loader::dataset::Dataset;
use ddl_loader::decode::DecodeMode;
use ddl_loader::pipeline::OnBadRecord;
use ddl_loader::transform::{Output, Slot, Transformer};

use super::bad_records::BadLog;
use super::config::ProfConfig;
use super::os::{drop_page_cache, resident_bytes};
use super::render::{fmt_bytes, fmt_rate};
use super::report::SCHEMA_VERSION;
use super::report::{
    units, ColdInfo, ConfigInfo, DatasetInfo, EndToEndRow, Report, StageRow, Verdict,
};
use super::stage::Stage;
use super::stages::{end_to_end, open_dataset, permutation, Prof, ReadItem, SampleImage};
use super::verdict::verdict;

/// Resized images kept for the normalize stage.
const RESIZED_SAMPLE: usize = 8;

/// Profiles node `cfg.residency.node`'s shards of `cfg.split`; `progress` receives one line
/// per finished measurement.
pub fn profile(cfg: &ProfConfig, mut progress: impl FnMut(&str)) -> Result<Report> {
    cfg.validate()?;
    let bad = BadLog::new(cfg);
    let mut threads = cfg.threads.clone();
    threads.sort_unstable();
    threads.dedup();

    let ds = open_dataset(cfg, !cfg.cold)?;
    let paths: Vec<PathBuf> = ds.shard_paths().iter().map(|p| p.to_path_buf()).collect();
    let (items, dataset) = index(cfg, &ds, &paths);
    let n = items.len();
    if n < cfg.batch {
        bail!(
            "node {} has {n} records of split {}, fewer than one batch of {}",
            cfg.residency.node,
            cfg.split,
            cfg.batch
        );
    }
    let order = permutation(n, cfg.seed);
    let sample_n = cfg.sample_records.clamp(1, n.max(1)).min(n);
    let sample = sample(&ds, &order[..sample_n], &paths, &bad)?;
    let resized = resize_some(cfg, &sample, &paths, &bad, sample_n)?;
    let prof = Prof {
        cfg,
        paths: paths.clone(),
        items,
        order,
        sample,
        resized,
        bad: &bad,
    };
    let mut run = Measured {
        ds: Some(ds),
        cold: None,
        stages: Vec::new(),
        e2e: Vec::new(),
    };
    for &t in &threads {
        run.thread_count(&prof, &dataset, t, &mut progress)?;
    }
    let Measured {
        cold,
        stages,
        mut e2e,
        ..
    } = run;
    scale(&mut e2e);
    let verdict: Verdict = verdict(&stages, &e2e, cfg.gpu_rate)?;
    Ok(Report {
        schema_version: SCHEMA_VERSION,
        units: units(),
        dataset,
        config: config_info(cfg, threads, sample_n),
        cold,
        stages,
        end_to_end: e2e,
        bad_records: bad.report(),
        verdict,
    })
}

/// Where each of `ds`'s records lies, and the dataset's description.
fn index(cfg: &ProfConfig, ds: &Dataset, paths: &[PathBuf]) -> (Vec<ReadItem>, DatasetInfo) {
    let n = ds.len();
    let file_of: BTreeMap<&Path, u32> = paths
        .iter()
        .enumerate()
        .map(|(k, p)| (p.as_path(), k as u32))
        .collect();
    let mut items = Vec::with_capacity(n);
    let (mut bytes, mut w, mut h) = (0u64, 0f64, 0f64);
    for i in 0..n {
        let (reader, r) = ds.locate(i);
        let row = reader.row(r);
        items.push(ReadItem {
            file: file_of[reader.path()],
            offset: reader.header().data_offset + row.offset,
            len: row.length,
        });
        bytes += row.length as u64;
        w += row.width as f64;
        h += row.height as f64;
    }
    let info = DatasetInfo {
        dir: cfg.dir.clone(),
        split: cfg.split.clone(),
        node: cfg.residency.node,
        nodes: cfg.residency.nodes,
        shards: paths.len(),
        records: n as u64,
        file_bytes: ds.file_bytes(),
        mean_record_bytes: bytes as f64 / n.max(1) as f64,
        mean_width: w / n.max(1) as f64,
        mean_height: h / n.max(1) as f64,
    };
    (items, info)
}

/// The records `ids` of `ds` copied to RAM, leaving out (and logging) those that fail their
/// check.
fn sample(
    ds: &Dataset,
    ids: &[usize],
    paths: &[PathBuf],
    bad: &BadLog,
) -> Result<Vec<SampleImage>> {
    let file_index: BTreeMap<&Path, u32> = paths
        .iter()
        .enumerate()
        .map(|(k, p)| (p.as_path(), k as u32))
        .collect();
    let mut sample = Vec::with_capacity(ids.len());
    for &i in ids {
        let (reader, r) = ds.locate(i);
        match ds.record(i) {
            Ok(rec) => sample.push(SampleImage {
                bytes: rec.bytes.to_vec(),
                id: ds.global_id(i),
                file: file_index[reader.path()],
                record: r,
            }),
            Err(e) => bad.met_error(e)?,
        }
    }
    Ok(sample)
}

/// Up to [`RESIZED_SAMPLE`] of `sample` cropped and resized to uint8; fails when none decodes.
fn resize_some(
    cfg: &ProfConfig,
    sample: &[SampleImage],
    paths: &[PathBuf],
    bad: &BadLog,
    sampled: usize,
) -> Result<Vec<Vec<u8>>> {
    let size = cfg.image_size as usize;
    let mut tr = Transformer::new(cfg.transform(Output::U8Nhwc, DecodeMode::Region))
        .map_err(|e| anyhow!("{e}"))?;
    let mut resized = Vec::new();
    for img in sample {
        if resized.len() == RESIZED_SAMPLE {
            break;
        }
        let mut out = vec![0u8; 3 * size * size];
        match tr.apply(&img.bytes, 0, img.id, Slot::U8(&mut out)) {
            Ok(_) => resized.push(out),
            Err(e) => bad.met(
                &paths[img.file as usize],
                img.record,
                &format!("cannot decode: {e}"),
            )?,
        }
    }
    if resized.is_empty() {
        bail!(
            "node {}: none of the {} sampled records of split {} is a good image ({} bad); \
             `ddl-pack --verify {}` lists the damaged ones",
            cfg.residency.node,
            sampled,
            cfg.split,
            bad.report().count,
            cfg.dir.display()
        );
    }
    Ok(resized)
}

/// What the run measured so far, and the dataset it keeps mapped between thread counts (none
/// with `--cold`).
struct Measured {
    ds: Option<Arc<Dataset>>,
    cold: Option<ColdInfo>,
    stages: Vec<StageRow>,
    e2e: Vec<EndToEndRow>,
}

impl Measured {
    /// Every stage alone, then the whole pipeline, at `t` threads.
    fn thread_count(
        &mut self,
        prof: &Prof<'_>,
        dataset: &DatasetInfo,
        t: usize,
        progress: &mut impl FnMut(&str),
    ) -> Result<()> {
        let cfg = prof.cfg;
        // Read first: with --cold, unmap and drop the shards right before it.
        if cfg.cold {
            self.go_cold(&prof.paths, dataset.file_bytes)?;
        }
        let mut measured = vec![{
            let _g = stage_span("read", t);
            prof.read(t)?
        }];
        // Opened after the read stage: opening reads the shards' headers and indexes, which
        // would bring cold pages back into the page cache.
        let d = match &self.ds {
            Some(d) => Arc::clone(d),
            None => open_dataset(cfg, false)?,
        };
        measured.extend(stages_after_read(prof, &d, t)?);
        for r in &measured {
            progress(&format!(
                "{:<14} threads {t:>3}: {:>12} images/s  {:>12}",
                r.stage.name(),
                fmt_rate(r.images_per_s),
                if r.stage == Stage::Queue {
                    "(by reference)".to_string()
                } else {
                    format!("{}/s", fmt_bytes(r.bytes_per_s))
                }
            ));
        }
        self.stages.extend(measured);
        let d = if cfg.cold {
            drop(d);
            self.ds = None;
            drop_page_cache(&prof.paths)?;
            open_dataset(cfg, false)?
        } else {
            d
        };
        let r = end_to_end(&d, cfg, t, prof.bad)?;
        progress(&format!(
            "{:<14} threads {t:>3}: {:>12} images/s  (workers busy {:.0}%)",
            "end_to_end",
            fmt_rate(r.images_per_s),
            100.0 * r.worker_busy_frac
        ));
        self.e2e.push(r);
        if !cfg.cold {
            self.ds = Some(d);
        }
        Ok(())
    }

    /// Unmaps the shards and drops them from the page cache; the first time, records how much
    /// of them was resident before and after.
    fn go_cold(&mut self, paths: &[PathBuf], file_bytes: u64) -> Result<()> {
        self.ds = None;
        let before = if self.cold.is_none() {
            Some(resident_bytes(paths)?)
        } else {
            None
        };
        drop_page_cache(paths)?;
        if let Some(before) = before {
            self.cold = Some(ColdInfo {
                files: paths.len(),
                file_bytes,
                resident_bytes_before: before,
                resident_bytes_after: resident_bytes(paths)?,
            });
        }
        Ok(())
    }
}

/// The trace span of one stage's measurement at `t` threads.
fn stage_span(stage: &str, t: usize) -> ddl_trace::SpanGuard {
    ddl_trace::span_args(format!("stage {stage}"), "prof", &[("threads", t as i64)])
}

/// Each stage after `read` alone at `t` threads, in pipeline order, each in a trace span.
fn stages_after_read(prof: &Prof<'_>, d: &Dataset, t: usize) -> Result<Vec<StageRow>> {
    let mut measured = Vec::new();
    {
        let _g = stage_span("check", t);
        measured.push(prof.check(d, t)?);
    }
    for stage in [Stage::DecodeFull, Stage::DecodeScaled, Stage::DecodeRegion] {
        let _g = stage_span(stage.name(), t);
        measured.push(prof.decode(stage, t)?);
    }
    {
        let _g = stage_span("crop_resize", t);
        measured.push(prof.crop_resize(t)?);
    }
    {
        let _g = stage_span("normalize", t);
        measured.push(prof.normalize(t)?);
    }
    {
        let _g = stage_span("queue", t);
        measured.push(prof.queue(t)?);
    }
    Ok(measured)
}

/// Speed-up and efficiency of each end-to-end row against the smallest thread count.
fn scale(e2e: &mut [EndToEndRow]) {
    let base = e2e[0].images_per_s.max(1e-9);
    let base_t = e2e[0].threads as f64;
    for r in e2e {
        r.speedup = r.images_per_s / base;
        r.efficiency = r.speedup / (r.threads as f64 / base_t);
    }
}

/// The configuration as the report records it.
fn config_info(cfg: &ProfConfig, threads: Vec<usize>, sample_n: usize) -> ConfigInfo {
    ConfigInfo {
        threads,
        batch: cfg.batch,
        image_size: cfg.image_size,
        augment: if cfg.eval { "eval" } else { "train" }.to_string(),
        output: "f32_nchw".to_string(),
        decode_mode: "region".to_string(),
        seconds: cfg.seconds,
        stage_seconds: cfg.stage_seconds,
        prefetch: cfg.prefetch,
        seed: cfg.seed,
        gpu_rate_images_per_s: cfg.gpu_rate,
        cold: cfg.cold,
        sample_records: sample_n,
        on_bad_record: match cfg.on_bad_record {
            OnBadRecord::Fail => "fail",
            OnBadRecord::Skip => "skip",
            OnBadRecord::Replace => "replace",
        }
        .to_string(),
    }
}
