//! Models in and out through the binaries, as a user runs them: `mpirun -np 2 ddl-train
//! --export`, `ddl-export` of the run's checkpoint, `ddl-predict` on a folder and on single
//! images (JSON and text), and a bad `--init-from` file stopping the job before its first step
//! with the key named.

use std::path::Path;

use ddl_tests::{command, mpirun_train, printed, run, run_ok, scratch, synth_and_pack, SynthSpec};
use ddl_trainer::weights::file;
use ddl_trainer::weights::meta::ModelMeta;
use serde_json::Value;

fn wnids(shards: &Path) -> Vec<String> {
    ddl_loader::manifest::Manifest::load(shards)
        .unwrap()
        .classes
        .into_iter()
        .map(|c| c.wnid)
        .collect()
}

#[test]
fn export_predict_and_a_bad_init_under_mpirun() {
    let tmp = scratch("models-e2e");
    let dir = tmp.path();
    let shards = synth_and_pack(
        dir,
        &SynthSpec {
            classes: 4,
            per_class: 16,
            val_per_class: 3,
            seed: 3,
            shards: 2,
            max_short_side: 64,
        },
    );
    let model = dir.join("model.safetensors");
    let out = run_ok(
        mpirun_train(2, &shards)
            .args(["--image-size", "32", "--batch", "4", "--devices", "cpu:1"])
            .args(["--epochs", "1", "--warmup-epochs", "0"])
            .arg("--checkpoint-dir")
            .arg(dir.join("ck"))
            .arg("--export")
            .arg(&model),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("export: "), "{}", printed(&out));
    let (dict, map) = file::read(&model).unwrap();
    let meta = ModelMeta::from_map(&map, &model).unwrap().unwrap();
    assert_eq!(meta.classes, wnids(&shards));
    assert!(
        meta.val_top1.is_some(),
        "the run's last evaluation is in the file"
    );

    // ddl-export of the run's checkpoint directory: the same model.
    let again = dir.join("again.safetensors");
    run_ok(
        command("ddl-export")
            .arg(dir.join("ck"))
            .arg("-o")
            .arg(&again),
    );
    let (dict2, map2) = file::read(&again).unwrap();
    assert_eq!(dict2, dict);
    assert_eq!(map2, map);
    // A pickle name is refused before anything is written.
    let out = run(command("ddl-export")
        .arg(dir.join("ck"))
        .arg("-o")
        .arg(dir.join("model.pt")));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("torch.save"));

    // ddl-predict on the val folder: one line per image, the top 3 of the model's classes.
    let val = dir.join("imagenet/val");
    let out = run_ok(
        command("ddl-predict")
            .arg("--model")
            .arg(&model)
            .arg(&val)
            .args(["--json", "--top", "3", "--device", "cpu"]),
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 12, "{}", printed(&out));
    for l in &lines {
        let top = l["top"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{l}");
        let p: Vec<f64> = top
            .iter()
            .map(|t| t["probability"].as_f64().unwrap())
            .collect();
        assert!(p.windows(2).all(|w| w[0] >= w[1]) && p.iter().sum::<f64>() <= 1.0 + 1e-5);
        for t in top {
            let label = t["label"].as_u64().unwrap() as usize;
            assert_eq!(t["class"], meta.classes[label], "{l}");
        }
    }
    assert!(lines[0]["image"]
        .as_str()
        .unwrap()
        .ends_with("ILSVRC2012_val_00000001.JPEG"));

    // Its reader gone (`ddl-predict ... | head`), it ends quietly: no panic, no error line.
    let out = command("ddl-predict")
        .arg("--model")
        .arg(&model)
        .arg(&val)
        .args(["--device", "cpu"])
        .stdout(ddl_testkit::closed_pipe())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked") && !err.contains("error"), "{err}");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(libc::SIGPIPE),
        "{err}"
    );

    // Its output a full disk: one line and status 1, as ddl-export's.
    let out = command("ddl-predict")
        .arg("--model")
        .arg(&model)
        .arg(&val)
        .args(["--device", "cpu"])
        .stdout(ddl_testkit::full_disk())
        .output()
        .unwrap();
    ddl_testkit::assert_ended_on_full_disk("ddl-predict", &out);
    let out = command("ddl-export")
        .arg(dir.join("ck"))
        .arg("-o")
        .arg(dir.join("third.safetensors"))
        .stdout(ddl_testkit::full_disk())
        .output()
        .unwrap();
    ddl_testkit::assert_ended_on_full_disk("ddl-export", &out);

    // Text, with one unreadable image among good ones: the others are printed, the bad one
    // is named, the exit status says something failed.
    let one = val.join("ILSVRC2012_val_00000002.JPEG");
    let missing = dir.join("missing.JPEG");
    let out = run(command("ddl-predict")
        .arg("--model")
        .arg(&model)
        .arg(&one)
        .arg(&missing)
        .args(["--device", "cpu"]));
    assert!(!out.status.success(), "{}", printed(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with(&format!("{}\n  1. n", one.display())),
        "{text}"
    );
    assert_eq!(text.lines().count(), 5, "{text}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.JPEG"));

    // A file missing a key: the job stops before its first step, naming the key.
    let (mut bad, _) = file::read(&model).unwrap();
    bad.tensors.remove("layer2.1.bn2.running_var");
    let bad_path = dir.join("bad.safetensors");
    file::write(&bad_path, &bad, &map).unwrap();
    let out = run(mpirun_train(2, &shards)
        .args(["--image-size", "32", "--batch", "4", "--devices", "cpu:1"])
        .args(["--epochs", "1"])
        .arg("--init-from")
        .arg(&bad_path));
    assert!(!out.status.success(), "{}", printed(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("tensor layer2.1.bn2.running_var missing"),
        "{}",
        printed(&out)
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("train loss"),
        "{}",
        printed(&out)
    );
}
