//! Models (torchvision names and sizes), weight-decay exclusion, and the SGD update.

use ddl_trainer::model::{self, ModelKind, PassMode, StagedPass};
use ddl_trainer::optim::{Sgd, SgdConfig};
use ddl_trainer::table::{Layout, ALIGN};
use tch::{nn, Device, Kind, Reduction, Tensor};

fn layout(kind: ModelKind, classes: i64, size: u32) -> Layout {
    let vs = nn::VarStore::new(Device::Cpu);
    let m = model::build(kind, &vs.root(), classes, size);
    let x = Tensor::zeros(
        [2, 3, i64::from(size), i64::from(size)],
        (Kind::Float, Device::Cpu),
    );
    let y = tch::no_grad(|| m.forward_t(&x, false));
    assert_eq!(y.size(), vec![2, classes]);
    Layout::new(&vs, 25 << 20)
}

#[test]
fn torchvision_parameter_counts_and_names() {
    // Parameter counts of torchvision's models with 1000 classes.
    for (kind, count) in [
        (ModelKind::Resnet18, 11_689_512usize),
        (ModelKind::Resnet50, 25_557_032),
    ] {
        let l = layout(kind, 1000, 64);
        assert_eq!(l.parameters(), count, "{kind}");
        let names: Vec<&str> = l.params.iter().map(|p| p.name.as_str()).collect();
        for n in [
            "conv1.weight",
            "bn1.weight",
            "bn1.bias",
            "layer1.0.conv1.weight",
            "layer2.0.downsample.0.weight",
            "layer2.0.downsample.1.weight",
            "layer4.1.bn2.bias",
            "fc.weight",
            "fc.bias",
        ] {
            assert!(names.contains(&n), "{kind}: {n} missing");
        }
        assert_eq!(
            names[0], "conv1.weight",
            "{kind}: creation order starts at the stem"
        );
        assert!(l
            .buffers
            .iter()
            .any(|(n, _)| n == "layer1.0.bn1.running_var"));
        // Buckets cover the flat buffer in reverse parameter order: fc first.
        assert_eq!(l.buckets[0].params[0], l.params.len() - 1);
        assert_eq!(l.buckets.iter().map(|b| b.len).sum::<usize>(), l.total);
        assert!(l.buckets.len() > 1);
    }
    for kind in [
        ModelKind::Resnet34,
        ModelKind::Resnet101,
        ModelKind::Resnet152,
    ] {
        let l = layout(kind, 10, 64);
        assert!(
            l.params.iter().any(|p| p.name == "layer3.5.conv2.weight"),
            "{kind}"
        );
    }
}

#[test]
fn small_models_run_at_every_size() {
    for size in [32, 64, 128, 224] {
        layout(ModelKind::ResnetSmall, 10, size);
    }
    let l = layout(ModelKind::ConvnetNobn, 10, 64);
    assert!(
        l.buffers.is_empty(),
        "convnet_nobn has no BatchNorm buffers"
    );
}

#[test]
fn weight_decay_skips_batchnorm_and_bias() {
    let l = layout(ModelKind::ResnetSmall, 10, 64);
    for p in &l.params {
        let is_bn =
            p.name.contains(".bn") || p.name.starts_with("bn") || p.name.contains("downsample.1");
        let is_bias = p.name.ends_with(".bias");
        assert_eq!(p.decay, !(is_bn || is_bias), "{}", p.name);
    }
    assert!(l.params.iter().any(|p| p.decay));
    assert!(l.params.iter().any(|p| !p.decay));
}

#[test]
fn buckets_put_decayed_parameters_first_at_aligned_offsets() {
    // 21,841 classes: the head's bias would leave every later parameter misaligned.
    let l = layout(ModelKind::Resnet18, 21_841, 64);
    for b in &l.buckets {
        let decayed: Vec<bool> = b.params.iter().map(|&i| l.params[i].decay).collect();
        assert!(decayed.windows(2).all(|w| w[0] >= w[1]), "{decayed:?}");
        let end_of_decayed = b
            .params
            .iter()
            .filter(|&&i| l.params[i].decay)
            .map(|&i| l.params[i].offset + l.params[i].numel)
            .max()
            .unwrap_or(b.start);
        assert!(b.decayed >= end_of_decayed - b.start && b.decayed <= b.len);
        for &i in &b.params {
            let p = &l.params[i];
            assert_eq!(p.offset % ALIGN, 0, "{}", p.name);
            assert!(p.offset >= b.start && p.offset + p.numel <= b.start + b.len);
            assert_eq!(p.offset >= b.start + b.decayed, !p.decay, "{}", p.name);
        }
    }
    assert_eq!(l.total % ALIGN, 0);
}

#[test]
fn sgd_matches_pytorch_semantics() {
    let cfg = SgdConfig {
        momentum: 0.9,
        nesterov: false,
        weight_decay: 0.1,
    };
    let mut sgd = Sgd::new(cfg, Device::Cpu).unwrap();
    sgd.set_lr(0.5).unwrap();
    // One bucket: a 2x2 weight (decayed, first) and a bias of 2 (not decayed).
    let mut p = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 1.0, -1.0]);
    let mut m = Tensor::zeros([6], (Kind::Float, Device::Cpu));
    let grad = |g: &[f32]| Tensor::from_slice(g);
    // Zero gradient: the decayed weight shrinks by lr * wd, the bias does not move.
    sgd.update(&mut p, &mut grad(&[0.0; 6]), &mut m, 4).unwrap();
    let v: Vec<f32> = Vec::try_from(&p).unwrap();
    assert_eq!(v[4..], [1.0, -1.0]);
    for (x, x0) in v[..4].iter().zip([1.0f32, 2.0, 3.0, 4.0]) {
        assert!((x - x0 * 0.95).abs() < 1e-6);
    }
    // Momentum on the bias (no decay, so the bucket's decayed part is empty here): the
    // first step with gradient g gives buf = g, p -= lr * g; the second buf = 0.9 g + g.
    let mut b = Tensor::from_slice(&[1.0f32, -1.0]);
    let mut mb = Tensor::zeros([2], (Kind::Float, Device::Cpu));
    sgd.update(&mut b, &mut grad(&[1.0, 1.0]), &mut mb, 0)
        .unwrap();
    sgd.update(&mut b, &mut grad(&[1.0, 1.0]), &mut mb, 0)
        .unwrap();
    let b3: Vec<f32> = Vec::try_from(&b).unwrap();
    assert!((b3[0] - (1.0 - 0.5 - 0.5 * 1.9)).abs() < 1e-6, "{b3:?}");
    // Nesterov: p -= lr * (g + 0.9 * buf).
    let mut nest = Sgd::new(
        SgdConfig {
            momentum: 0.9,
            nesterov: true,
            weight_decay: 0.0,
        },
        Device::Cpu,
    )
    .unwrap();
    nest.set_lr(1.0).unwrap();
    let mut p = Tensor::from_slice(&[0.0f32]);
    let mut m = Tensor::zeros([1], (Kind::Float, Device::Cpu));
    nest.update(&mut p, &mut grad(&[1.0]), &mut m, 1).unwrap();
    let v: Vec<f32> = Vec::try_from(&p).unwrap();
    assert!((v[0] + 1.9).abs() < 1e-6, "{v:?}");
}

/// Gradients of every parameter of `net` after a cross-entropy backward on `x`, in one piece
/// or stage by stage, and the number of stages the pass had.
fn gradients(
    vs: &nn::VarStore,
    net: &model::Model,
    x: &Tensor,
    staged: bool,
) -> (usize, Vec<Vec<f32>>) {
    for mut t in vs.trainable_variables() {
        t.zero_grad();
    }
    let labels = Tensor::from_slice(&[1i64, 7]);
    let mode = PassMode {
        train: true,
        staged,
        classify: true,
    };
    let mut pass = StagedPass::run(net.as_ref(), x, mode, &mut |_| Ok(())).unwrap();
    pass.output()
        .cross_entropy_loss::<Tensor>(&labels, None, Reduction::Mean, -100, 0.0)
        .backward();
    let stages = pass.stages();
    for s in (0..stages - 1).rev() {
        pass.backward_stage(s).unwrap();
    }
    let grads = vs
        .trainable_variables()
        .iter()
        .map(|t| Vec::<f32>::try_from(&t.grad().view([-1])).unwrap())
        .collect();
    (stages, grads)
}

#[test]
fn staged_backward_is_bitwise_one_backward() {
    tch::set_num_threads(1);
    for (kind, size, stages) in [
        (ModelKind::ConvnetNobn, 32, 3),
        (ModelKind::ResnetSmall, 32, 8),
        (ModelKind::Resnet18, 64, 10),
        (ModelKind::Resnet50, 64, 18),
    ] {
        let vs = nn::VarStore::new(Device::Cpu);
        let net = model::build(kind, &vs.root(), 10, size as u32);
        // Every BatchNorm gamma at 0.5 (the last one of each block starts at 0, which would
        // stop the gradient of the layers before it).
        tch::no_grad(|| {
            for (name, mut t) in vs.variables() {
                if name.contains("bn") && name.ends_with(".weight") {
                    let _ = t.fill_(0.5);
                }
            }
        });
        let x = Tensor::randn([2, 3, size, size], (Kind::Float, Device::Cpu));
        let (one, whole) = gradients(&vs, &net, &x, false);
        let (n, staged) = gradients(&vs, &net, &x, true);
        assert_eq!((one, n), (1, stages), "{kind}");
        assert!(
            whole.iter().all(|g| g.iter().any(|x| *x != 0.0)),
            "{kind}: a parameter got no gradient"
        );
        assert!(whole == staged, "{kind}: staged gradients differ");
    }
}

#[test]
fn staged_buckets_follow_stage_boundaries() {
    let vs = nn::VarStore::new(Device::Cpu);
    let net = model::build(ModelKind::Resnet18, &vs.root(), 1000, 64);
    let layout = Layout::staged(&vs, 8 << 20, &|n| net.stage_of(n));
    // Every bucket holds parameters of its own stage only; stages are handed over last first.
    for b in &layout.buckets {
        for &i in &b.params {
            assert_eq!(net.stage_of(&layout.params[i].name), b.stage);
        }
        assert!(b.len * 4 <= 8 << 20 || b.params.len() == 1);
    }
    assert!(layout.buckets.windows(2).all(|w| w[0].stage >= w[1].stage));
    let stages: std::collections::BTreeSet<usize> =
        layout.buckets.iter().map(|b| b.stage).collect();
    assert_eq!(stages.len(), net.stages());
    assert_eq!(layout.buckets[0].stage, net.stages() - 1, "fc first");
    assert_eq!(net.stage_of("conv1.weight"), 0);
    assert_eq!(net.stage_of("layer1.0.conv1.weight"), 1);
    assert_eq!(net.stage_of("layer4.1.bn2.bias"), 8);
    assert_eq!(net.stage_of("layer2.0.downsample.1.weight"), 3);
    assert_eq!(layout.parameters(), 11_689_512);
}

/// Per variable of `vs`, in name order: the sum of its absolute values.
fn weights_sum(vs: &nn::VarStore) -> Vec<(String, f64)> {
    let mut v: Vec<(String, f64)> = vs
        .variables()
        .into_iter()
        .map(|(n, t)| (n, t.abs().sum(Kind::Double).double_value(&[])))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// A seeded model has the weights of its seed even while another thread builds models (the
/// table's replicas, an export's layout): torch's generator is one per process.
#[test]
fn seeded_weights_do_not_depend_on_other_threads() {
    let seeded = || {
        let vs = nn::VarStore::new(Device::Cpu);
        let _m = model::build_seeded(3, ModelKind::ResnetSmall, &vs.root(), 10, 32);
        weights_sum(&vs)
    };
    let want = seeded();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let builder = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = ddl_trainer::variables::Variables::of_model(ModelKind::ResnetSmall, 10, 32);
            }
        })
    };
    let got: Vec<_> = (0..20).map(|_| seeded()).collect();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    builder.join().unwrap();
    for (i, g) in got.iter().enumerate() {
        assert!(g == &want, "build {i}: other weights than the seed's");
    }
}
