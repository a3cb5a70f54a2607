//! The compiled step (`compile`) on the CPU: its gradients against eager's and a float64
//! reference, the check that refuses a package with a parameter folded into its code, the
//! cache (a hit compiles nothing, a damaged entry is compiled again, a folder ddl did not write
//! is left alone; each reason an entry is refused: `compiled/entry.rs`), training runs that match eager's and resume bitwise, and the flags
//! it refuses.

use std::fs;
use std::path::{Path, PathBuf};

use ddl_trainer::compiled::{self, CompileSettings, StepPackage, StepSpec};
use ddl_trainer::config::{Overlap, Precision};
use ddl_trainer::model::{self, ModelKind};
use ddl_trainer::table::Layout;
use tch::{nn, Device, Kind, Reduction, Tensor};

use crate::common;

/// The compile cache the tests share: one compile per key for the whole test binary (and kept
/// between local runs of it; CI starts with none).
pub fn shared_cache() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("compile-cache")
}

fn settings(cache: &Path, fold_small_constants: bool) -> CompileSettings {
    CompileSettings {
        cache: cache.to_path_buf(),
        image_sizes: vec![],
        verbose: false,
        fold_small_constants,
        inductor_options: vec![],
        cuda_graphs: false,
        python: None,
    }
}

/// A model of `kind`, always drawn from the same seed, in a CPU variable store of `floats`.
fn seeded(kind: ModelKind, classes: i64, size: u32, floats: Kind) -> (nn::VarStore, model::Model) {
    let mut vs = nn::VarStore::new(Device::Cpu);
    let net = model::build_seeded(3, kind, &vs.root(), classes, size);
    if floats != Kind::Float {
        vs.set_kind(floats);
    }
    (vs, net)
}

/// The step of `kind` compiled (or found in `cache`) and bound to `vs`'s variables and a flat
/// gradient buffer of `layout`, which it returns beside the package.
fn bound(
    kind: ModelKind,
    classes: i64,
    (size, batch): (u32, usize),
    vs: &nn::VarStore,
    cache: &Path,
    fold_small_constants: bool,
) -> ddl_trainer::Result<(StepPackage, Tensor, Layout)> {
    let layout = Layout::new(vs, usize::MAX);
    let spec = StepSpec {
        model: kind,
        classes,
        batch,
        image_size: size,
        model_image_size: size,
        precision: Precision::Fp32,
        channels_last: false,
        label_smoothing: 0.0,
        layout: &layout,
        device: Device::Cpu,
        fold_small_constants,
        inductor_options: &[],
        refuse_first_packages: 0,
    };
    let entry = compiled::prepare(&spec, &settings(cache, fold_small_constants), &mut |_| {})?;
    let mut package = StepPackage::load(&entry.package(), entry.described.clone(), Device::Cpu)?;
    let vars = vs.variables();
    let named: Vec<(String, Tensor)> = layout
        .params
        .iter()
        .map(|p| p.name.clone())
        .chain(layout.buffers.iter().map(|(n, _)| n.clone()))
        .map(|n| {
            let t = vars[&n].shallow_clone();
            (n, t)
        })
        .collect();
    let flat = Tensor::zeros([layout.total as i64], (Kind::Float, Device::Cpu));
    package.bind(&named, &flat)?;
    Ok((package, flat, layout))
}

/// The loss of one eager step of `net` on (`x`, `y`) and every parameter's gradient, by name.
fn eager_step(
    vs: &nn::VarStore,
    net: &model::Model,
    x: &Tensor,
    y: &Tensor,
) -> (f64, Vec<(String, Tensor)>) {
    let loss =
        net.forward_t(x, true)
            .cross_entropy_loss::<Tensor>(y, None, Reduction::Mean, -100, 0.0);
    loss.backward();
    let vars = vs.variables();
    let grads = vars
        .iter()
        .filter(|(_, v)| v.requires_grad())
        .map(|(n, v)| (n.clone(), v.grad().to_kind(Kind::Double)))
        .collect();
    (loss.double_value(&[]), grads)
}

#[test]
fn the_compiled_gradient_is_as_close_to_float64_as_eager() {
    // The training runs' step below (one compile for both).
    let (classes, size, batch) = (4, 32, 8);
    let kind = ModelKind::ResnetSmall;
    let (vs, net) = seeded(kind, classes, size, Kind::Float);
    let (vs64, net64) = seeded(kind, classes, size, Kind::Double);
    let (mut package, flat, layout) =
        bound(kind, classes, (size, batch), &vs, &shared_cache(), false).unwrap();
    tch::manual_seed(11);
    let x = Tensor::randn(
        [batch as i64, 3, size as i64, size as i64],
        (Kind::Float, Device::Cpu),
    );
    let y = Tensor::randint(classes, [batch as i64], (Kind::Int64, Device::Cpu));

    let compiled_loss = package.run(&x, &y, 1.0).unwrap().double_value(&[]);
    let (eager_loss, eager) = eager_step(&vs, &net, &x, &y);
    let (_, reference) = eager_step(&vs64, &net64, &x.to_kind(Kind::Double), &y);
    assert!(
        ((compiled_loss - eager_loss) / eager_loss).abs() < 1e-5,
        "loss {compiled_loss} compiled, {eager_loss} eager"
    );
    // Within 3x eager's float32 error, per tensor and over the whole gradient, give or take
    // float32's noise floor for sums of a few thousand terms in another order (1e-4 of a
    // tensor's gradient, 1e-5 of the whole), which eager's own order can happen to undercut.
    let reference: std::collections::HashMap<_, _> = reference.into_iter().collect();
    let norm = |t: &Tensor| t.norm().double_value(&[]);
    let (mut compiled_sq, mut eager_sq, mut total_sq) = (0.0, 0.0, 0.0);
    for (name, g32) in &eager {
        let info = layout.params.iter().find(|p| &p.name == name).unwrap();
        let gc = flat
            .narrow(0, info.offset as i64, info.numel as i64)
            .view(info.shape.as_slice())
            .to_kind(Kind::Double);
        let g64 = &reference[name];
        let (compiled_err, eager_err) = (norm(&(&gc - g64)), norm(&(g32 - g64)));
        compiled_sq += compiled_err * compiled_err;
        eager_sq += eager_err * eager_err;
        total_sq += norm(g64).powi(2);
        assert!(
            compiled_err <= 3.0 * eager_err + 1e-4 * norm(g64),
            "{name}: compiled {compiled_err:.3e} from float64, eager float32 {eager_err:.3e} \
             (|g| {:.3e})",
            norm(g64)
        );
    }
    let (compiled_err, eager_err) = (f64::sqrt(compiled_sq), f64::sqrt(eager_sq));
    let total = f64::sqrt(total_sq);
    assert!(
        compiled_err <= 3.0 * eager_err + 1e-5 * total,
        "the whole gradient: compiled {compiled_err:.3e} from float64, eager {eager_err:.3e} \
         (|g| {total:.3e})"
    );
}

#[test]
fn a_parameter_folded_into_the_code_is_refused_by_name() {
    // convnet_nobn with 3 classes: fc.bias is a 1-D parameter of 3 elements, which Inductor
    // folds into the generated code unless told to keep every constant a tensor. (The step of
    // `convnet_spec`, which the other tests share.)
    let (classes, size, batch) = (3, 16, 2);
    let kind = ModelKind::ConvnetNobn;
    let (vs, _) = seeded(kind, classes, size, Kind::Float);
    let cache = shared_cache();
    // Refused by the compile's check, before anything is cached (and by the binding, for a
    // package from elsewhere).
    let err = bound(kind, classes, (size, batch), &vs, &cache, true)
        .err()
        .expect("a package that folded fc.bias was bound");
    let message = err.to_string();
    assert!(
        message.contains("fc.bias") && message.contains("folded"),
        "{message}"
    );
    // As ddl compiles it, every constant stays a tensor: the same model binds, and an update
    // of fc.bias changes what the step computes.
    let (mut package, _, _) = bound(kind, classes, (size, batch), &vs, &cache, false).unwrap();
    let x = Tensor::randn(
        [batch as i64, 3, size as i64, size as i64],
        (Kind::Float, Device::Cpu),
    );
    let y = Tensor::zeros([batch as i64], (Kind::Int64, Device::Cpu));
    let before = package.run(&x, &y, 1.0).unwrap().double_value(&[]);
    tch::no_grad(|| {
        let _ = vs.variables()["fc.bias"].shallow_clone().fill_(5.0);
    });
    let after = package.run(&x, &y, 1.0).unwrap().double_value(&[]);
    assert!((before - after).abs() > 1e-3, "loss {before} then {after}");
}

/// The step of a small convnet laid out as `layout`.
fn convnet_spec(layout: &Layout) -> StepSpec<'_> {
    StepSpec {
        model: ModelKind::ConvnetNobn,
        classes: 3,
        batch: 2,
        image_size: 16,
        model_image_size: 16,
        precision: Precision::Fp32,
        channels_last: false,
        label_smoothing: 0.0,
        layout,
        device: Device::Cpu,
        fold_small_constants: false,
        inductor_options: &[],
        refuse_first_packages: 0,
    }
}

/// The convnet's step in the shared cache, compiled there by the first test that asks.
fn shared_convnet_entry(vs: &nn::VarStore) -> compiled::Entry {
    let layout = Layout::new(vs, usize::MAX);
    compiled::prepare(
        &convnet_spec(&layout),
        &settings(&shared_cache(), false),
        &mut |_| {},
    )
    .unwrap()
}

/// A copy of the shared cache's convnet step in `cache` (an entry is a folder that may move):
/// its folder there.
fn copy_of_shared_convnet_entry(cache: &Path) -> PathBuf {
    let (vs, _) = seeded(ModelKind::ConvnetNobn, 3, 16, Kind::Float);
    let shared = shared_convnet_entry(&vs);
    let entry = cache.join(shared.dir.file_name().unwrap());
    fs::create_dir_all(&entry).unwrap();
    for file in fs::read_dir(&shared.dir).unwrap() {
        let file = file.unwrap();
        fs::copy(file.path(), entry.join(file.file_name())).unwrap();
    }
    entry
}

/// Prepares the convnet's step in `cache` and returns the progress lines the cache printed.
fn cache_lines(cache: &Path, vs: &nn::VarStore) -> Vec<String> {
    let layout = Layout::new(vs, usize::MAX);
    let mut lines = Vec::new();
    compiled::prepare(&convnet_spec(&layout), &settings(cache, false), &mut |l| {
        lines.push(l.to_string())
    })
    .unwrap();
    lines
}

#[test]
fn the_cache_compiles_a_key_once_and_rebuilds_what_it_cannot_use() {
    let tmp = ddl_testkit::scratch("compile-cache");
    let cache = tmp.path().join("cache");
    let (vs, _) = seeded(ModelKind::ConvnetNobn, 3, 16, Kind::Float);
    // The shared cache's entry (compiled there once for every test) copied into a cache of
    // this test's own.
    let layout = Layout::new(&vs, usize::MAX);
    let entry = copy_of_shared_convnet_entry(&cache);
    let package = entry.join("step.pt2");
    let stamp = fs::metadata(&package).unwrap().modified().unwrap();

    // A hit compiles nothing: the same package, no temporary folder left.
    let hit = cache_lines(&cache, &vs);
    assert!(hit.iter().any(|l| l.contains("from the cache")), "{hit:?}");
    assert!(!hit.iter().any(|l| l.contains("compiled in")), "{hit:?}");
    assert_eq!(fs::metadata(&package).unwrap().modified().unwrap(), stamp);
    let entries: Vec<PathBuf> = fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(entries, std::slice::from_ref(&entry));

    // A damaged package is detected and compiled again.
    let mut bytes = fs::read(&package).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    fs::write(&package, &bytes).unwrap();
    let rebuilt = cache_lines(&cache, &vs);
    assert!(
        rebuilt
            .iter()
            .any(|l| l.contains("damaged") && l.contains("compiling it again")),
        "{rebuilt:?}"
    );
    assert!(
        rebuilt.iter().any(|l| l.contains("compiled in")),
        "{rebuilt:?}"
    );

    // A folder holding a file ddl does not write there is never removed.
    fs::write(entry.join("entry.json"), "{}").unwrap();
    fs::write(entry.join("notes.txt"), "mine").unwrap();
    let err = compiled::prepare(
        &convnet_spec(&layout),
        &settings(&cache, false),
        &mut |_| {},
    )
    .expect_err("an entry holding a file of the user's was replaced");
    assert!(err.to_string().contains("notes.txt"), "{err}");
    assert_eq!(fs::read_to_string(entry.join("notes.txt")).unwrap(), "mine");
}

/// A stand-in for the compile's Python (`CompileSettings::python`) in `dir`: it writes into
/// the compile's folder (its third argument) a "package" that is none and a description whose
/// check against eager passed, and exits 0, as a compile script gone wrong without noticing.
fn lying_python(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("lying-python");
    let described = r#"{"torch_version": "x", "constants": [], "inputs": [], "compile_seconds": 0, "check": {"grad_rel": 0, "loss_rel": 0}}"#;
    let script = format!(
        "#!/bin/sh\nprintf 'not a package' > \"$3/step.pt2\"\nprintf '%s' '{described}' > \"$3/step.json\"\n"
    );
    fs::write(&path, script).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// Prepares the convnet's step in `cache` with `settings` changed by `edit`: the result and
/// the progress lines.
fn prepare_convnet(
    cache: &Path,
    edit: impl FnOnce(&mut CompileSettings),
) -> (ddl_trainer::Result<compiled::Entry>, Vec<String>) {
    let (vs, _) = seeded(ModelKind::ConvnetNobn, 3, 16, Kind::Float);
    let layout = Layout::new(&vs, usize::MAX);
    let mut s = settings(cache, false);
    edit(&mut s);
    let mut lines = Vec::new();
    let result = compiled::prepare(&convnet_spec(&layout), &s, &mut |l| {
        lines.push(l.to_string())
    });
    (result, lines)
}

/// Rewrites the checksum `entry.json` of `entry` records for `file` to the file's: as if it
/// had been sealed that way.
fn reseal(entry: &Path, field: &str, file: &str) {
    let path = entry.join("entry.json");
    let mut sealed: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    let bytes = fs::read(entry.join(file)).unwrap();
    sealed[field] = serde_json::json!({"bytes": bytes.len(), "crc32c": crc32c::crc32c(&bytes)});
    fs::write(&path, serde_json::to_vec(&sealed).unwrap()).unwrap();
}

#[test]
fn only_a_package_that_loads_is_cached_and_one_that_does_not_is_compiled_again() {
    let tmp = ddl_testkit::scratch("compile-loads");
    let liar = lying_python(tmp.path());
    let lying = |s: &mut CompileSettings| s.python = Some(liar.clone());

    // A compile that exits 0 after writing a package that does not load: refused, and nothing
    // is sealed (the compile's folder is kept beside the entry's place, as a failure's).
    let cache = tmp.path().join("fresh");
    let (result, _) = prepare_convnet(&cache, lying);
    let err = result
        .expect_err("a package that does not load was cached")
        .to_string();
    assert!(
        err.contains("does not load") && err.contains("nothing was cached"),
        "{err}"
    );
    let entries: Vec<String> = fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".lock"))
        .collect();
    assert!(
        entries.len() == 1 && entries[0].ends_with(".failed"),
        "{entries:?}"
    );

    // A cached entry whose package does not load (sealed so, by an older ddl) is compiled
    // again; and so is one whose step.json was edited.
    for (file, why) in [
        ("step.pt2", "does not load"),
        ("step.json", "step.json is damaged"),
    ] {
        let cache = tmp.path().join(format!("sealed-{file}"));
        let entry = copy_of_shared_convnet_entry(&cache);
        if file == "step.pt2" {
            fs::write(entry.join(file), b"not a package").unwrap();
            reseal(&entry, "package", file);
        } else {
            let mut text = fs::read(entry.join(file)).unwrap();
            text.push(b' '); // still JSON, and what it says unchanged
            fs::write(entry.join(file), text).unwrap();
        }
        let (_, lines) = prepare_convnet(&cache, lying);
        assert!(
            lines
                .iter()
                .any(|l| l.contains(why) && l.contains("compiling it again")),
            "{file}: {lines:?}"
        );
        assert!(
            lines.iter().any(|l| l.contains("with Inductor into")),
            "{lines:?}"
        );
    }
}

/// Makes a folder immutable (`chattr +i`: nothing can be created in it, by root either) until
/// dropped; None where the file system does not support it.
struct Immutable(PathBuf);

impl Immutable {
    fn make(dir: &Path) -> Option<Immutable> {
        let ok = std::process::Command::new("chattr")
            .arg("+i")
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Immutable(dir.to_path_buf()))
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = std::process::Command::new("chattr")
            .arg("-i")
            .arg(&self.0)
            .status();
    }
}

#[test]
fn a_cache_that_cannot_be_written_serves_its_entries_or_names_the_flag() {
    let tmp = ddl_testkit::scratch("compile-read-only");
    let (full, empty) = (tmp.path().join("full"), tmp.path().join("empty"));
    copy_of_shared_convnet_entry(&full);
    fs::create_dir_all(&empty).unwrap();
    let (Some(_full), Some(_empty)) = (Immutable::make(&full), Immutable::make(&empty)) else {
        eprintln!(
            "skipped: chattr +i is not supported under {}",
            tmp.path().display()
        );
        return;
    };
    let (entry, lines) = prepare_convnet(&full, |_| {});
    entry.expect("a valid entry of a cache that cannot be written");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("from the cache") && l.contains("cannot write")),
        "{lines:?}"
    );
    let (result, _) = prepare_convnet(&empty, |_| {});
    let err = result
        .expect_err("compiled into a cache that cannot be written")
        .to_string();
    assert!(
        err.contains("--compile-cache") && err.contains("cannot be written"),
        "{err}"
    );
}

/// A CPU run of `model` on `data` for the compiled-step tests: fp32, one replica.
fn run_config(data: &Path, model: &str, compile: bool) -> ddl_trainer::TrainConfig {
    let mut cfg = common::config(data, model, 8, "cpu:1");
    cfg.epochs = 2;
    cfg.base_lr = 0.05;
    cfg.compile = compile;
    cfg.compile_cache = Some(shared_cache());
    cfg
}

/// How far `compiled`'s update from `init` is from `eager`'s: |compiled - eager| / |eager -
/// init| over every weight (a wrong or misplaced gradient gives about 1).
fn update_rel_diff(init: &[f32], eager: &[f32], compiled: &[f32]) -> f64 {
    let (mut diff, mut update) = (0f64, 0f64);
    for ((&i, &e), &c) in init.iter().zip(eager).zip(compiled) {
        diff += (f64::from(c) - f64::from(e)).powi(2);
        update += (f64::from(e) - f64::from(i)).powi(2);
    }
    (diff / update).sqrt()
}

fn dumped(path: &Path) -> Vec<f32> {
    fs::read(path)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Where a run of the compiled-step tests trains: ranks (threads of this process) and each
/// rank's devices.
#[derive(Clone, Copy)]
struct Job {
    ranks: usize,
    devices: &'static str,
}

/// One rank of one CPU replica.
const ALONE: Job = Job {
    ranks: 1,
    devices: "cpu:1",
};

/// Trains `model` on `data` for `steps` steps eager and compiled from the same initial
/// weights (dumped into `dir`, the compiled run checkpointed there every 5 steps) as `job`
/// says (several replicas: checked to stay equal, `check_replicas`), and returns how far the
/// compiled update is from eager's.
fn compiled_against_eager(dir: &Path, data: &Path, model: &str, steps: u64, job: Job) -> f64 {
    let dump = |name: &str| dir.join(format!("{model}-{name}.f32"));
    let config = |compile: bool, steps: u64, name: &str| {
        let mut cfg = run_config(data, model, compile);
        cfg.devices = job.devices.parse().unwrap();
        cfg.check_replicas = job.ranks > 1 || job.devices != ALONE.devices;
        cfg.max_steps = Some(steps);
        cfg.dump_weights = Some(dump(name));
        cfg
    };
    common::run_all(&config(false, 0, "init"), job.ranks);
    common::run_all(&config(false, steps, "eager"), job.ranks);
    let mut compiled = config(true, steps, "compiled");
    compiled.checkpoint_dir = Some(dir.join(format!("ck-{model}")));
    compiled.checkpoint_every = 5;
    compiled.keep_checkpoints = 10;
    let summaries = common::run_all(&compiled, job.ranks);
    assert_eq!(summaries[0].global_steps, steps);
    assert!(
        summaries
            .iter()
            .all(|s| s.param_checksum == summaries[0].param_checksum),
        "the ranks' weights differ"
    );
    update_rel_diff(
        &dumped(&dump("init")),
        &dumped(&dump("eager")),
        &dumped(&dump("compiled")),
    )
}

/// Trains `model` for `steps` steps eager and compiled ([`compiled_against_eager`]) on 4
/// classes x 24 = 96 records (batch 8: 12 steps an epoch) in a new scratch folder, and fails
/// unless the compiled update is within 3% of eager's. Returns the folder and the data in it.
fn compiled_follows_eager(model: &str, steps: u64) -> (ddl_testkit::TempDir, PathBuf) {
    let tmp = ddl_testkit::scratch(&format!("compiled-train-{model}"));
    let data = tmp.path().join("data");
    common::make_dataset(&data, 4, 24, 0, 2, 0, 40);
    let rel = compiled_against_eager(tmp.path(), &data, model, steps, ALONE);
    assert!(
        rel < 0.03,
        "{model}: the compiled update is {rel:.3e} from eager's"
    );
    (tmp, data)
}

// One test per model, so that the two compiles and runs go side by side.
#[test]
fn compiled_resnet_small_follows_eager_and_resumes_bitwise() {
    let (tmp, data) = compiled_follows_eager("resnet_small", 24);

    // Resumed from step 15 in a directory of its own: bitwise the uninterrupted compiled run.
    let resumed_dir = tmp.path().join("ck-resume");
    fs::create_dir_all(&resumed_dir).unwrap();
    let ckpt = format!("ckpt-{:012}.ddlck", 15);
    fs::copy(
        tmp.path().join("ck-resnet_small").join(&ckpt),
        resumed_dir.join(&ckpt),
    )
    .unwrap();
    let mut resumed = run_config(&data, "resnet_small", true);
    resumed.max_steps = Some(24);
    resumed.checkpoint_dir = Some(resumed_dir);
    resumed.resume = true;
    resumed.dump_weights = Some(tmp.path().join("resumed.f32"));
    assert_eq!(common::run_ranks(&resumed, 1).steps_run, 9);
    assert!(
        dumped(&tmp.path().join("resumed.f32"))
            == dumped(&tmp.path().join("resnet_small-compiled.f32")),
        "the resumed compiled run differs from the uninterrupted one"
    );
}

#[test]
fn compiled_resnet18_follows_eager() {
    compiled_follows_eager("resnet18", 12);
}

#[test]
fn two_ranks_of_replicas_keep_equal_weights_that_follow_eager_under_compile() {
    // 64 records over 2 ranks x 2 replicas of 8: 2 steps an epoch. Every replica of both ranks
    // keeps the same weights, and they moved as eager's do from the same start (equal weights
    // alone hold for a step that never updates them too).
    let tmp = ddl_testkit::scratch("compiled-ranks");
    let data = tmp.path().join("data");
    common::make_dataset(&data, 4, 16, 0, 2, 0, 40);
    let job = Job {
        ranks: 2,
        devices: "cpu:2",
    };
    let rel = compiled_against_eager(tmp.path(), &data, "resnet_small", 2, job);
    // The parameters alone too: in 2 steps the BatchNorm statistics, which every forward pass
    // moves, are most of the update.
    let params = |name: &str| parameters(&tmp.path().join(format!("resnet_small-{name}.f32")));
    let moved = update_rel_diff(&params("init"), &params("eager"), &params("compiled"));
    assert!(
        rel < 0.03 && moved > 0.0 && moved < 0.03,
        "the compiled update is {rel:.3e} from eager's, {moved:.3e} in the parameters"
    );
}

/// The parameters in the `dump_weights` file `path`, without the BatchNorm statistics.
fn parameters(path: &Path) -> Vec<f32> {
    ddl_testkit::read_dump(path)
        .into_iter()
        .filter(|(name, _)| !name.contains("running_") && !name.contains("num_batches"))
        .flat_map(|(_, values)| values)
        .collect()
}

#[test]
fn compile_refuses_what_needs_the_model_apart_naming_both_flags() {
    let tmp = ddl_testkit::scratch("compiled-refusals");
    let data = tmp.path().join("data");
    common::make_dataset(&data, 4, 8, 0, 1, 0, 40);
    let refusal = |cfg: &ddl_trainer::TrainConfig| {
        let err = common::try_all(cfg, 1).remove(0).expect_err("refused");
        err.to_string()
    };
    let refused = |edit: &dyn Fn(&mut ddl_trainer::TrainConfig), other: &str| {
        let mut cfg = run_config(&data, "resnet_small", true);
        edit(&mut cfg);
        let message = refusal(&cfg);
        assert!(
            message.contains("--compile") && message.contains(other),
            "{message}"
        );
    };
    refused(&|c| c.head_parallel = true, "--head-parallel");
    refused(&|c| c.overlap = Some(Overlap::Backward), "--overlap");
    refused(
        &|c| c.on_bad_record = ddl_loader::pipeline::OnBadRecord::Skip,
        "--on-bad-record",
    );
    // CUDA graphs: only of a compiled step, only on a GPU (refused before any compile).
    refused(
        &|c| {
            c.compile = false;
            c.cuda_graphs = true
        },
        "--cuda-graphs",
    );
    let mut cfg = run_config(&data, "resnet_small", true);
    cfg.cuda_graphs = true;
    cfg.compile_cache = Some(tmp.path().join("untouched-cache"));
    let message = refusal(&cfg);
    assert!(
        message.contains("--cuda-graphs") && message.contains("--devices"),
        "{message}"
    );
    assert!(!tmp.path().join("untouched-cache").exists());
    // Inductor's options: KEY=VALUE, KEY one of torch._inductor.config's (the compile script
    // checks before it compiles anything).
    for (option, said) in [
        ("layout_optimization", "expected KEY=VALUE"),
        (
            "no_such_option=1",
            "torch._inductor.config has no option no_such_option",
        ),
    ] {
        let mut cfg = run_config(&data, "resnet_small", true);
        cfg.inductor_options = vec![option.into()];
        cfg.compile_cache = Some(tmp.path().join("cache"));
        let message = refusal(&cfg);
        assert!(
            message.contains("--inductor-option") && message.contains(said),
            "{message}"
        );
    }
}

#[test]
fn progressive_resizing_compiles_a_step_per_size_before_the_first() {
    // The convnet of `convnet_spec` (3 classes, batch 2) from 16 px, then 24 px from epoch 1:
    // its cache starts with the shared 16 px step, so the run compiles the 24 px one alone.
    let tmp = ddl_testkit::scratch("compiled-sizes");
    let data = tmp.path().join("data");
    common::make_dataset(&data, 3, 8, 0, 2, 0, 32);
    let cache = tmp.path().join("cache");
    let first = copy_of_shared_convnet_entry(&cache);
    let run = |compile: bool, dump: &str| {
        let mut cfg = run_config(&data, "convnet_nobn", compile);
        cfg.batch = 2;
        cfg.image_size = 16;
        cfg.image_size_schedule = "1:24".parse().unwrap();
        cfg.compile_cache = Some(cache.clone());
        cfg.dump_weights = Some(tmp.path().join(dump));
        cfg
    };
    let mut init = run(false, "init.f32");
    init.max_steps = Some(0);
    common::run_ranks(&init, 1);
    common::run_ranks(&run(false, "eager.f32"), 1);
    common::run_ranks(&run(true, "compiled.f32"), 1);
    let mut entries: Vec<PathBuf> = fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    entries.sort();
    let sizes: Vec<&str> = entries
        .iter()
        .map(|p| {
            let name = p.file_name().unwrap().to_str().unwrap();
            name.split('-').find(|p| p.ends_with("px")).unwrap()
        })
        .collect();
    assert_eq!(sizes, ["16px", "24px"], "one step per train size");
    assert!(
        entries.contains(&first),
        "the 16 px step was not the shared one"
    );
    let rel = update_rel_diff(
        &dumped(&tmp.path().join("init.f32")),
        &dumped(&tmp.path().join("eager.f32")),
        &dumped(&tmp.path().join("compiled.f32")),
    );
    assert!(rel < 0.03, "the compiled update is {rel:.3e} from eager's");
}

#[test]
fn a_package_refused_by_its_check_is_compiled_again_without_layout_optimization() {
    // The first attempt refused (uncompiled) as if its package disagreed with eager: the
    // compile tries Inductor without its layout optimization, keeps that package, and says so.
    let (vs, _) = seeded(ModelKind::ConvnetNobn, 3, 16, Kind::Float);
    let layout = Layout::new(&vs, usize::MAX);
    let tmp = ddl_testkit::scratch("compiled-fallback");
    let spec = StepSpec {
        refuse_first_packages: 1,
        ..convnet_spec(&layout)
    };
    let mut lines = Vec::new();
    let entry = compiled::prepare(&spec, &settings(tmp.path(), false), &mut |l| {
        lines.push(l.to_string())
    })
    .unwrap();
    let described: serde_json::Value =
        serde_json::from_slice(&fs::read(entry.dir.join("step.json")).unwrap()).unwrap();
    assert_eq!(
        described["inductor_configs"]["layout_optimization"],
        serde_json::json!(false)
    );
    assert!(described["check"]["grad_rel"].as_f64().unwrap() < 1e-3);
    assert_eq!(
        entry.described.refused.len(),
        1,
        "{:?}",
        entry.described.refused
    );
    assert!(entry.described.refused[0].starts_with("with Inductor's defaults: refused"));
    assert!(
        lines
            .iter()
            .any(|l| l.contains("Inductor's defaults") && l.contains("compiled again")),
        "{lines:?}"
    );
}

#[test]
fn a_package_that_disagrees_with_eager_fails_its_check() {
    // The check every compile ends with, run on a cached package against a spec whose loss
    // differs (label smoothing 0.6 instead of the package's 0): it must fail, naming the
    // tensors furthest off.
    let (vs, _) = seeded(ModelKind::ConvnetNobn, 3, 16, Kind::Float);
    let entry = shared_convnet_entry(&vs);
    let described: serde_json::Value =
        serde_json::from_slice(&fs::read(entry.dir.join("step.json")).unwrap()).unwrap();
    let agreed = described["check"]["grad_rel"].as_f64().unwrap();
    assert!(agreed < 1e-3, "the package's own check: {agreed}");
    let tmp = ddl_testkit::scratch("compiled-check");
    let mut spec: serde_json::Value =
        serde_json::from_slice(&fs::read(entry.dir.join("spec.json")).unwrap()).unwrap();
    spec["label_smoothing"] = serde_json::json!(0.6);
    let tampered = tmp.path().join("spec.json");
    fs::write(&tampered, spec.to_string()).unwrap();
    let venv = std::env::var_os("VIRTUAL_ENV").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv"),
        PathBuf::from,
    );
    let out = std::process::Command::new(venv.join("bin/python"))
        .arg(entry.dir.join("step.py"))
        .arg(&tampered)
        .arg(&entry.dir)
        .arg("--check")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("disagrees with eager") && err.contains("furthest off"),
        "{err}"
    );
}
