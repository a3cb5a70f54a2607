//! A checkpoint directory belongs to one run: a new run refuses one holding another run's
//! checkpoints (whose higher step numbers would survive pruning and be resumed later) and
//! deletes nothing; `--restart` moves them aside; `--resume` refuses a checkpoint written with
//! flags that change the trajectory, naming them, and accepts flags that do not. A checkpoint
//! write that fills the disk removes its partial file and says how much it needed; resuming
//! with fewer checkpoints kept makes room by pruning before writing. A run holds the
//! directory's lock from before it looks into it to its end: a second run is refused naming
//! the holder. (Two `ddl-train` processes started together, and `--resume` of a missing
//! directory: trainer-cli's tests, which run the binary.)

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use ddl_comm::{thread_group, Topology, Transport};
use ddl_trainer::checkpoint::{self, Checkpoint};
use ddl_trainer::{train, RankInfo, TrainConfig, TrainError, TrainSummary};

/// One rank, in-process.
fn run(cfg: &TrainConfig) -> Result<TrainSummary, TrainError> {
    let t: Arc<dyn Transport> = Arc::new(thread_group(1).pop().unwrap());
    train(cfg, t, Topology::new(1, 1), RankInfo::single())
}

/// (file name, bytes) of every checkpoint file in `dir`.
fn contents(dir: &Path) -> Vec<(String, Vec<u8>)> {
    checkpoint::occupants(dir)
        .unwrap()
        .iter()
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(p).unwrap(),
            )
        })
        .collect()
}

/// A scratch directory holding a small dataset in `data/`.
fn scratch_with_data(name: &str) -> (ddl_testkit::TempDir, PathBuf) {
    let tmp = ddl_testkit::scratch(name);
    let data = tmp.path().join("data");
    common::make_dataset(&data, 3, 4, 0, 1, 0, 24);
    (tmp, data)
}

fn base(data: &Path, ckpt: &Path) -> TrainConfig {
    let mut cfg = common::config(data, "convnet_nobn", 2, "cpu:1");
    cfg.checkpoint_dir = Some(ckpt.to_path_buf());
    cfg.checkpoint_every = 1;
    cfg.keep_checkpoints = 10;
    cfg
}

#[test]
fn a_run_never_mixes_with_or_deletes_another_runs_checkpoints() {
    let (tmp, data) = scratch_with_data("ckdir");
    let dir = tmp.path();
    let ckpt = dir.join("ckpt");

    // The old run: 6 steps, a checkpoint after each.
    let mut old = base(&data, &ckpt);
    old.max_steps = Some(6);
    run(&old).unwrap();
    let before = contents(&ckpt);
    assert_eq!(before.len(), 6);

    // A new run with another seed, 2 steps, keeping 2: refused, the old files untouched.
    let mut new = base(&data, &ckpt);
    new.seed = old.seed + 1;
    new.max_steps = Some(2);
    new.keep_checkpoints = 2;
    let e = run(&new).unwrap_err().to_string();
    assert!(
        e.contains("--resume") && e.contains("--restart") && e.contains("6 checkpoint file(s)"),
        "{e}"
    );
    assert_eq!(
        contents(&ckpt),
        before,
        "a refused run changed the directory"
    );

    // --resume with the other seed: refused, naming the flag and both values.
    let mut resumed = new.clone();
    resumed.resume = true;
    let e = run(&resumed).unwrap_err().to_string();
    assert!(e.contains("--seed 7 (this run: 8)"), "{e}");
    assert_eq!(contents(&ckpt), before);

    // --resume with the old flags and a longer run, other output flags: continues it.
    let mut cont = old.clone();
    cont.resume = true;
    cont.epochs = 2;
    cont.max_steps = Some(8);
    cont.keep_checkpoints = 3;
    cont.checkpoint_every = 2;
    let s = run(&cont).unwrap();
    assert_eq!((s.global_steps, s.steps_run), (8, 2));
    let names: Vec<String> = contents(&ckpt).into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [5, 6, 8].map(checkpoint::file_name).to_vec(),
        "pruned to the 3 newest of the continued run"
    );
    let kept = contents(&ckpt);

    // --restart: the old run's files move into a dated subdirectory, the new run starts over.
    let mut restart = new.clone();
    restart.restart = true;
    let s = run(&restart).unwrap();
    assert_eq!((s.global_steps, s.resumed_from), (2, None));
    let aside: Vec<PathBuf> = std::fs::read_dir(&ckpt)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert!(aside[0]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .starts_with("previous-"));
    assert_eq!(contents(&aside[0]), kept, "moved, every byte kept");
    let ck = Checkpoint::read(&ckpt.join(checkpoint::file_name(2))).unwrap();
    assert_eq!(ck.meta.flags["seed"], 8);
    assert_eq!(contents(&ckpt).len(), 2);
}

/// A tmpfs mounted for the test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `bytes` at `dir`; `Err` says why it could not (not root, no
    /// CAP_SYS_ADMIN in this container, no mount binary).
    fn mount(dir: &Path, bytes: u64) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if out.status.success() {
            Ok(Tmpfs(dir.to_path_buf()))
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn full_disk_leaves_no_partial_file_and_resume_makes_room() {
    let tmp = ddl_testkit::scratch("fulldisk");
    let dir = tmp.path();
    let data = dir.join("data");
    common::make_dataset(&data, 3, 4, 0, 1, 0, 24);
    let disk = dir.join("disk");
    // The size of one checkpoint of this model (the flags in its header differ by a few bytes
    // with the directory's name).
    let mut probe = base(&data, &dir.join("probe"));
    probe.max_steps = Some(1);
    run(&probe).unwrap();
    let one = std::fs::metadata(dir.join("probe").join(checkpoint::file_name(1)))
        .unwrap()
        .len();
    // Room for 3 checkpoints and a half, in pages (a file takes whole pages; its header may
    // be a few bytes longer than the probe's).
    let page = 4096;
    let pages = (one + 256).div_ceil(page);
    let fs = match Tmpfs::mount(&disk, (3 * pages + pages / 2) * page) {
        Ok(fs) => fs,
        Err(why) => {
            println!("skipped: cannot mount a small tmpfs for the full-disk test ({why})");
            return;
        }
    };
    let ckpt = disk.join("ckpt");

    // Keeping 3 and writing a 4th does not fit.
    let mut cfg = base(&data, &ckpt);
    cfg.keep_checkpoints = 3;
    cfg.max_steps = Some(6);
    let e = run(&cfg).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, TrainError::CheckpointWrite { needed, .. } if needed.abs_diff(one) < 256),
        "{msg}"
    );
    assert!(msg.contains(&checkpoint::file_name(4)), "{msg}");
    assert!(
        msg.contains("No space left") && msg.contains("free"),
        "{msg}"
    );
    let names: Vec<String> = contents(&ckpt).into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [1, 2, 3].map(checkpoint::file_name).to_vec(),
        "the partial file must be gone, the complete ones kept"
    );

    // Resuming with one checkpoint kept prunes before writing: the run goes on to the end.
    let mut cont = cfg.clone();
    cont.resume = true;
    cont.keep_checkpoints = 1;
    let s = run(&cont).unwrap();
    assert_eq!((s.global_steps, s.steps_run), (6, 3));
    let names: Vec<String> = contents(&ckpt).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, vec![checkpoint::file_name(6)]);
    drop(fs);
}

#[test]
fn a_locked_directory_is_refused_naming_the_holder() {
    use fs4::fs_std::FileExt;
    let (tmp, data) = scratch_with_data("cklock");
    let dir = tmp.path();
    let ckpt = dir.join("ckpt");
    std::fs::create_dir_all(&ckpt).unwrap();
    // This test holds the lock, as a run on another host would, and says who it is.
    let path = ckpt.join(ddl_trainer::train::dir_lock::LOCK_FILE);
    let held = std::fs::File::create(&path).unwrap();
    assert!(held.try_lock_exclusive().unwrap());
    std::fs::write(&path, "pid 4242 host elsewhere\n").unwrap();
    let mut cfg = base(&data, &ckpt);
    cfg.max_steps = Some(2);
    for resume in [false, true] {
        cfg.resume = resume;
        let e = run(&cfg).unwrap_err();
        assert!(
            matches!(e, TrainError::CheckpointDirLocked { .. }),
            "--resume {resume}: {e}"
        );
        let e = e.to_string();
        assert!(e.contains("pid 4242 on host elsewhere"), "{e}");
        assert!(
            contents(&ckpt).is_empty(),
            "a refused run wrote a checkpoint"
        );
    }
    // Released (as the kernel does when the holder dies): the run takes it.
    drop(held);
    cfg.resume = false;
    run(&cfg).unwrap();
    assert_eq!(contents(&ckpt).len(), 2);
}

#[test]
fn resume_with_every_checkpoint_damaged_is_refused_and_touches_nothing() {
    let (tmp, data) = scratch_with_data("ckdir-damaged");
    let ckpt = tmp.path().join("ckpt");
    let mut first = base(&data, &ckpt);
    first.max_steps = Some(3);
    run(&first).unwrap();
    // Every checkpoint damaged (a byte flipped in the middle of each).
    for (name, mut bytes) in contents(&ckpt) {
        if name.starts_with("ckpt-") {
            let mid = bytes.len() / 2;
            bytes[mid] ^= 0xff;
            std::fs::write(ckpt.join(&name), bytes).unwrap();
        }
    }
    let before = contents(&ckpt);
    let mut again = base(&data, &ckpt);
    again.resume = true;
    again.max_steps = Some(6);
    // On three ranks: rank 0 reads the directory and refuses; the others refuse with it,
    // saying the same, instead of starting from scratch or waiting for rank 0.
    let results = common::try_all(&again, 3);
    let e = results[0].as_ref().unwrap_err();
    assert!(
        matches!(e, TrainError::NoIntactCheckpoint { damaged: 3, .. }),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("--resume") && msg.contains("--restart"),
        "{msg}"
    );
    for (rank, r) in results.iter().enumerate().skip(1) {
        match r {
            Err(TrainError::FromRoot(theirs)) => assert_eq!(theirs, &msg, "rank {rank}"),
            other => panic!("rank {rank} must refuse with rank 0: {other:?}"),
        }
    }
    assert_eq!(
        contents(&ckpt),
        before,
        "the damaged checkpoints were touched"
    );
}
