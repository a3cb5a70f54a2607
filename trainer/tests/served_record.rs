//! A mid-epoch checkpoint's record of the records its epoch served (the bitmap an elastic
//! resume deals the rest from) is checked against what the layout that wrote it must have
//! served: all set, none set, one bit swapped or another epoch's are refused naming the
//! checkpoint; a missing one is recomputed, or for an older ddl's checkpoint, refused on
//! another layout.

use std::path::{Path, PathBuf};

use ddl_loader::progress::EpochProgress;
use ddl_loader::trace_records::read;
use ddl_trainer::checkpoint::{self, Checkpoint};
use ddl_trainer::config::ResidencyMode;
use ddl_trainer::TrainConfig;

use crate::common;

/// 53 records that do not divide evenly over 2 nodes (27 and 26 held): 6 steps of 2 x 4.
const SHARDS: [usize; 5] = [13, 9, 11, 12, 8];

fn config(data: &Path, ck: &Path, trace: &Path) -> TrainConfig {
    let mut cfg = common::config(data, "convnet_nobn", 4, "cpu:1");
    cfg.residency = ResidencyMode::Rank;
    cfg.epochs = 2;
    cfg.exchange = 0.5;
    cfg.stage = Some(ck.with_extension("stage"));
    cfg.checkpoint_dir = Some(ck.to_path_buf());
    cfg.trace_records = Some(trace.to_path_buf());
    cfg
}

/// Resumes from a copy of `original` altered by `alter`, on 3 nodes: the error, or the ids
/// epoch 1 served over both runs (`first`'s trace and the resumed one's).
fn resume_altered(
    tmp: &Path,
    name: &str,
    (data, original, first): (&Path, &Path, &Path),
    alter: impl FnOnce(&mut Checkpoint),
) -> Result<Vec<u64>, (PathBuf, String)> {
    let dir = tmp.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let mut ck = Checkpoint::read(original).unwrap();
    alter(&mut ck);
    let path = dir.join(original.file_name().unwrap());
    std::fs::write(&path, ck.to_bytes().unwrap()).unwrap();
    let trace = tmp.join(format!("{name}.jsonl"));
    let mut cfg = config(data, &dir, &trace);
    cfg.resume = true;
    cfg.allow_new_layout = true;
    let results = common::try_all(&cfg, 3);
    if let Some(e) = common::first_error(&results) {
        return Err((path, e.to_string()));
    }
    let lines = (0..2)
        .flat_map(|r| read(&first.with_extension(format!("jsonl.{r}"))).unwrap())
        .chain((0..3).flat_map(|r| read(&trace.with_extension(format!("jsonl.{r}"))).unwrap()));
    Ok(lines.filter(|l| l.epoch == 1).flat_map(|l| l.ids).collect())
}

#[test]
fn a_record_of_served_records_that_does_not_match_its_layout_is_refused() {
    let tmp = ddl_testkit::scratch("served-record");
    let data = tmp.path().join("data");
    common::make_shards(&data, 4, &SHARDS, 32);
    let first = tmp.path().join("first.jsonl");
    let mut cfg = config(&data, &tmp.path().join("ck"), &first);
    cfg.max_steps = Some(9); // epoch 1, step 3 of 6
    common::run_all(&cfg, 2);
    let found = checkpoint::newest_valid(&tmp.path().join("ck")).unwrap();
    let (original, ck) = found.checkpoint.expect("the mid-epoch checkpoint");
    assert_eq!((ck.meta.epoch, ck.meta.step), (1, 3));
    let served = ck
        .meta
        .progress
        .clone()
        .expect("its record of what epoch 1 served");
    assert_eq!(served.served(), 3 * 2 * 4);
    let files = (data.as_path(), original.as_path(), first.as_path());
    let records = served.records;
    let swapped = {
        let (a, b) = (
            served.unserved()[0],
            (0..records).find(|&i| served.is_served(i)).unwrap(),
        );
        let mut words = served.words().to_vec();
        words[a as usize / 32] ^= 1 << (a % 32);
        words[b as usize / 32] ^= 1 << (b % 32);
        EpochProgress::from_words(1, records, words).unwrap()
    };
    let all = {
        let mut p = EpochProgress::new(1, records);
        p.mark_rest();
        p
    };
    let other_epoch = EpochProgress::from_words(0, records, served.words().to_vec()).unwrap();
    for (name, bitmap, why) in [
        ("all", all, "is not what its layout"),
        (
            "none",
            EpochProgress::new(1, records),
            "is not what its layout",
        ),
        ("swapped", swapped, "2 differ"),
        ("other-epoch", other_epoch, "of epoch 0"),
    ] {
        let altered = resume_altered(tmp.path(), name, files, |ck| {
            ck.meta.progress = Some(bitmap)
        });
        let (path, e) = altered.expect_err(name);
        assert!(
            e.contains(&path.display().to_string()) && e.contains(why),
            "{name}: {e}"
        );
    }
    // Without a record it is recomputed, and the epoch ends serving each record once.
    let ids = resume_altered(tmp.path(), "missing", files, |ck| ck.meta.progress = None).unwrap();
    let distinct: std::collections::BTreeSet<u64> = ids.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        ids.len(),
        "a record served twice in epoch 1"
    );
    assert!(
        53 - distinct.len() < 3 * 4,
        "{} never served",
        53 - distinct.len()
    );
    // An older ddl's checkpoint without one cannot say what it served: its own layout only.
    let older = resume_altered(tmp.path(), "older", files, |ck| {
        ck.meta.progress = None;
        ck.meta.placement = None;
    });
    let (path, e) = older.expect_err("an older checkpoint without a record on 3 nodes");
    assert!(
        e.contains(&path.display().to_string()) && e.contains("its own layout"),
        "{e}"
    );
}
