"""Compiles ddl-train's training step ahead of time with AOTInductor (issue 43).

ddl-train writes a spec (the network, its flat layout, the batch and arithmetic) and runs
this script with the Python whose torch is the libtorch it runs on. The script builds the same
network in PyTorch (torchvision's ResNets under the names ddl uses, ddl's small models here),
exports the joint forward + backward graph of one step (cross-entropy with label smoothing,
scaled by a loss scale given at run time), and compiles it into OUT/step.pt2, a package that
`torch::inductor::AOTIModelPackageLoader` runs from C++. The package

- reads every parameter and BatchNorm buffer as a constant that the caller binds to its own
  tensors (user-managed: nothing is copied, so ddl's optimizer updates are what it computes
  with; no constant is folded into the code, whatever its size);
- updates the running statistics in place, in those tensors;
- writes the gradient of every parameter into `flat_grad`, a constant bound to ddl's flat
  gradient buffer, at the parameter's offset (channels-last weights in NHWC order), the
  alignment gaps zero;
- takes (images, labels, loss_scale) and returns the unscaled loss.

Before it is kept, the package runs one step on a random batch beside the eager PyTorch step
of the same weights (on the device it is for) and must agree with it: the loss, and the whole
gradient within what the arithmetic allows (AOTInductor checks no strides at run time, so a
layout it mispredicted would otherwise go unnoticed). A check that cannot run (torch's loader
crashing on the package) fails the compile: ddl-train keeps only a package that passed it,
and that its own loader then loads. A package that disagrees is compiled again
without Inductor's layout optimization (FALLBACKS; unless the run named options of its own),
and the compile fails, naming the gradients furthest off, only when that one disagrees too.

For a CUDA device the script also compiles graph.cpp (beside it) into OUT/graph.so, the CUDA
graph capture and replay of the package that `--cuda-graphs` loads, against the same torch and
CUDA headers as the package's own wrapper (beside the Inductor compile, in a process of its
own). A failure there does not fail the compile: step.json says why, and only a run that asks
for CUDA graphs fails, with that reason.

OUT/step.json describes the package: every constant (its name in ddl, its name in the package,
shape, strides, dtype), the inputs, the Inductor options it was compiled with, the check, the
packages refused before it and why, the CUDA graph library (on a GPU) and the seconds the
compile took.

    python3 step.py SPEC.json OUT_DIR

Every process the script starts (the check, the graph library's compiler) is killed by the
kernel when the script ends, however it ends, as ddl-train has the kernel kill the script when
ddl-train ends: a ddl-train killed mid-compile leaves no compile running.

The spec's `inductor_options` (ddl-train's --inductor-option, KEY=VALUE with VALUE a Python
literal: layout_optimization=False) set options of torch._inductor.config for this compile.
"""
import argparse
import ctypes
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings


def fail(message):
    print(f"ddl compile: {message}", file=sys.stderr)
    sys.exit(2)


#: prctl(2) of this process's C library, looked up before any fork.
_prctl = ctypes.CDLL(None, use_errno=True).prctl
_PR_SET_PDEATHSIG = 1


def spawn(command, **popen):
    """``subprocess.Popen(command, **popen)`` of a process the kernel kills (SIGKILL) when this
    one ends, however it ends; it exits at once if this one has already ended."""
    parent = os.getpid()

    def die_with_parent():  # in the child, between fork and exec: two system calls
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return subprocess.Popen(command, preexec_fn=die_with_parent, **popen)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("spec", help="the spec ddl-train wrote (JSON)")
    p.add_argument("out", help="an existing, empty folder for step.pt2 and step.json")
    p.add_argument("--check", action="store_true",
                   help="only check the package already in OUT against eager (a JSON line)")
    a = p.parse_args()
    with open(a.spec) as f:
        spec = json.load(f)
    try:
        import torch
    except ImportError as e:
        fail(f"{sys.executable} cannot import torch ({e}); the compile needs torch "
             f"{spec['torch_version']}, the libtorch ddl-train runs on")
    if torch.__version__ != spec["torch_version"]:
        fail(f"{sys.executable} has torch {torch.__version__}, but ddl-train runs on libtorch "
             f"{spec['torch_version']}: compile with that torch (set DDL_PYTHON to its python)")
    if not (shutil.which("g++") or shutil.which("c++") or os.environ.get("CXX")):
        fail("AOTInductor needs a C++ compiler and none was found (g++, c++ or $CXX): "
             "install g++ (Debian: apt-get install g++)")
    device = torch.device(spec["device"])
    if device.type == "cuda" and not torch.cuda.is_available():
        fail(f"{sys.executable}'s torch sees no CUDA device, but the step is for {device}")
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    if a.check:
        print(json.dumps(check_package(torch, spec, device, a.out)))
        return
    import ast
    import torch._inductor.config as inductor_config

    extra = {}
    for item in spec.get("inductor_options", []):
        key, _, value = item.partition("=")
        try:
            extra[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            fail(f"--inductor-option {item}: {value!r} is not a Python literal")
        if not hasattr(inductor_config, key.split(".")[0]):
            fail(f"--inductor-option {item}: torch._inductor.config has no option {key}")
    remember_isa_probes()
    start = time.perf_counter()
    graph_build = start_graph_library(torch, a.out) if device.type == "cuda" else None
    refused = []
    for options in [extra] if extra else FALLBACKS:
        try:
            # The tests of the fallback refuse the first attempts without spending a compile on
            # them: what follows a refusal is the same whichever check made it.
            if len(refused) < spec.get("refuse_first_packages", 0):
                raise Disagrees("refused uncompiled (refuse_first_packages, for tests)")
            described = compile_step(torch, spec, device, a.out, options)
            described["check"] = checked(a.spec, a.out)
            break
        except Disagrees as e:
            said = ", ".join(f"{k}={v}" for k, v in options.items()) or "Inductor's defaults"
            refused.append(f"with {said}: {e}")
            print(f"ddl compile: the package {refused[-1]}", file=sys.stderr)
    else:
        fail("every package compiled disagrees with eager: " + "; ".join(refused))
    described["refused"] = refused
    if graph_build is not None:
        described["graph_library"] = finish_graph_library(graph_build, a.out)
    described["compile_seconds"] = time.perf_counter() - start
    with open(os.path.join(a.out, "step.json"), "w") as f:
        json.dump(described, f)


def remember_isa_probes():
    """Inductor picks the vector instructions of its CPU code by compiling a probe for each set
    the CPU announces and loading it in a new Python that imports torch, in every process that
    compiles: on a small step, about half the compile (BENCHMARKS.md). A probe's verdict depends
    only on the CPU's flags, the compiler and torch, so one that passed is remembered under all
    three in Inductor's cache folder (beside the probes' own binaries) and not run again; one
    that failed runs again each time. Under a torch without these internals, nothing changes."""
    try:
        from torch._inductor import cpu_vec_isa
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        probe = cpu_vec_isa.VecISA.check_build
        fingerprint = cpu_vec_isa._get_isa_dry_compile_fingerprint
        with open("/proc/cpuinfo") as f:
            cpu = next(line for line in f if line.startswith("flags"))
    except (ImportError, AttributeError, OSError, StopIteration):
        return
    memo = os.path.join(cache_dir(), "ddl-isa-probes.json")

    def check_build(isa, code):
        key = hashlib.sha256("\0".join([cpu, fingerprint(isa._arch_flags), code])
                             .encode()).hexdigest()
        try:
            with open(memo) as f:
                passed = set(json.load(f))
        except (OSError, ValueError, TypeError):
            passed = set()
        if key in passed:
            return True
        if not probe(isa, code):
            return False
        part = f"{memo}.{os.getpid()}"
        try:  # a cache folder it cannot write only means probing again next time
            os.makedirs(os.path.dirname(memo), exist_ok=True)
            with open(part, "w") as f:
                json.dump(sorted(passed | {key}), f)
            os.replace(part, memo)
        except OSError:
            pass
        return True

    cpu_vec_isa.VecISA.check_build = check_build


# What is compiled, in turn, while the package disagrees with eager (when the run named no
# options of its own): Inductor's defaults, then without its layout optimization, which picks
# the convolutions' layouts itself and is where its predictions of cuDNN's output strides have
# gone wrong (pytorch/pytorch#171622, #184027).
FALLBACKS = [{}, {"layout_optimization": False}]


#: The exit status of a check that found constants folded into the package's code.
FOLDED = 3


class Disagrees(Exception):
    """The package disagrees with eager PyTorch (or its check refused it): why."""


def build_network(torch, spec):
    """The network ddl-train trains, with its names: torchvision's ResNets, or ddl's small
    models defined here as in trainer/src/model.rs."""
    import torch.nn as nn

    name, classes = spec["model"], spec["classes"]
    if name.startswith("resnet") and name != "resnet_small":
        import torchvision

        return getattr(torchvision.models, name)(num_classes=classes)
    if name == "resnet_small":
        from torchvision.models.resnet import BasicBlock

        size = spec["model_image_size"]
        stride, pool = (1, False) if size <= 48 else (2, False) if size <= 96 else (2, True)

        class SmallResNet(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv1 = nn.Conv2d(3, 16, 3, stride, 1, bias=False)
                self.bn1 = nn.BatchNorm2d(16)
                self.pool = pool
                c_in = 16
                for i, width in enumerate([16, 32, 64]):
                    blocks = []
                    for b in range(2):
                        s = 2 if i > 0 and b == 0 else 1
                        down = None
                        if s != 1 or c_in != width:
                            down = nn.Sequential(nn.Conv2d(c_in, width, 1, s, bias=False),
                                                 nn.BatchNorm2d(width))
                        blocks.append(BasicBlock(c_in, width, s, down))
                        c_in = width
                    self.add_module(f"layer{i + 1}", nn.Sequential(*blocks))
                self.fc = nn.Linear(c_in, classes)

            def forward(self, x):
                x = torch.relu(self.bn1(self.conv1(x)))
                if self.pool:
                    x = torch.nn.functional.max_pool2d(x, 3, 2, 1)
                x = self.layer3(self.layer2(self.layer1(x)))
                return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))

        return SmallResNet()
    if name == "convnet_nobn":

        class ConvNet(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv1 = nn.Conv2d(3, 16, 3, 2, 1)
                self.conv2 = nn.Conv2d(16, 32, 3, 2, 1)
                self.fc = nn.Linear(32, classes)

            def forward(self, x):
                x = torch.relu(self.conv2(torch.relu(self.conv1(x))))
                return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))

        return ConvNet()
    fail(f"no Python definition of the model {name!r}")


def loss_and_inputs(torch, spec, device):
    """The network of `spec` on `device` (its weights drawn from seed 0) inside the step's loss
    module, and a random batch (the same draws for the same spec): the compile traces them and
    its check runs them again."""
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    net = build_network(torch, spec)
    for m in net.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            # ddl's BatchNorm has no step counter (momentum is fixed at 0.1).
            m.num_batches_tracked = None
    fmt = torch.channels_last if spec["channels_last"] else torch.contiguous_format
    net = net.to(device, memory_format=fmt).train()
    check_names(net, spec)
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[spec["precision"]]
    smoothing = spec["label_smoothing"]

    class Loss(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, images, labels, loss_scale):
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                logits = self.net(images)
            loss = F.cross_entropy(logits.float(), labels, label_smoothing=smoothing)
            return loss * loss_scale, loss.detach()

    n, size = spec["batch"], spec["image_size"]
    images = torch.randn(n, 3, size, size, device=device).to(memory_format=fmt)
    labels = torch.randint(0, spec["classes"], (n,), device=device)
    loss_scale = torch.ones((), device=device)
    return Loss(), (images, labels, loss_scale)


def compile_step(torch, spec, device, out, extra_configs):
    from torch.export.experimental import _export_forward_backward

    loss, inputs = loss_and_inputs(torch, spec, device)
    joint = _export_forward_backward(torch.export.export(loss, inputs), joint_loss_index=0)
    step = FlatStep(torch, loss.net, joint, spec)
    with torch.no_grad():
        program = torch.export.export(step, inputs)
    configs = {
        "always_keep_tensor_constants": not spec.get("inline_small_constants", False),
        "aot_inductor.package_constants_in_so": False,
        **extra_configs,
    }
    package = os.path.join(out, "step.pt2")
    if os.path.exists(package):  # an earlier attempt's, refused by the check
        os.remove(package)
    torch._inductor.aoti_compile_and_package(
        program, package_path=package, inductor_configs=configs)
    state = dict(step.named_parameters())
    state.update(step.named_buffers())
    constants = []
    for fqn, t in sorted(state.items()):
        name = "" if fqn == "flat_grad" else fqn.removeprefix("net.")
        constants.append({"name": name, "fqn": fqn, "shape": list(t.shape),
                          "strides": list(t.stride()), "dtype": str(t.dtype)})
    return {
        "torch_version": torch.__version__,
        "inductor_configs": configs,
        "constants": constants,
        "inputs": [{"name": k, "shape": list(t.shape), "strides": list(t.stride()),
                    "dtype": str(t.dtype)}
                   for k, t in zip(["images", "labels", "loss_scale"], inputs)],
    }


def start_graph_library(torch, out):
    """Starts compiling graph.cpp (beside this script) into OUT/graph.so: a shared library whose
    undefined symbols are libtorch_cuda's and the CUDA runtime's, resolved by the process that
    opens it (ddl-train, which runs on this torch). Returns the running compiler, or why it
    could not start."""
    from torch.utils import cpp_extension

    here = os.path.dirname(os.path.abspath(__file__))
    try:
        includes = cpp_extension.include_paths("cuda")
    except OSError as e:
        return f"CUDA's headers were not found ({e})"
    cxx = os.environ.get("CXX") or shutil.which("g++") or "c++"
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    command = [cxx, "-shared", "-fPIC", "-O2", "-std=c++17", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
               "-DUSE_CUDA", *(f"-I{p}" for p in includes + [here]),
               os.path.join(here, "graph.cpp"), "-o", os.path.join(out, "graph.so")]
    try:
        return spawn(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except OSError as e:
        return f"{cxx} could not start ({e})"


def finish_graph_library(build, out):
    """What step.json says of graph.so: its file name, or why there is none."""
    if isinstance(build, str):
        return {"error": build}
    output, _ = build.communicate()
    if build.returncode != 0:
        tail = " | ".join(output.strip().splitlines()[-4:])
        return {"error": f"compiling graph.cpp failed (exit {build.returncode}): {tail}"}
    return {"file": "graph.so"}


def checked(spec_path, out):
    """The check of the package in `out`, run in a process of its own (a crash of torch's Python
    loader must not pass for a verdict): its figures. Raises Disagrees when the package
    disagrees with eager, and fails the compile when the check could not run."""
    run = spawn([sys.executable, __file__, spec_path, out, "--check"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = run.communicate()
    if run.returncode == 0:
        return json.loads(stdout.strip().splitlines()[-1])
    ours = [l.removeprefix("ddl compile: ") for l in stderr.splitlines()
            if l.startswith("ddl compile: ")]
    if run.returncode == 2 and ours:
        raise Disagrees(ours[-1])
    if run.returncode == FOLDED and ours:
        fail(ours[-1])
    fail(f"the check of the package against eager PyTorch exited with {run.returncode} before a "
         "verdict, so the package is not kept: " + " | ".join(stderr.strip().splitlines()[-3:]))


# How far the compiled step may be from eager's, over the whole gradient (relative L2) and in
# the loss: float32 sums in another order (and TF32 convolutions on a GPU) stay far below the
# first; bf16 and fp16 round every activation, ~0.2 at ResNet initialisation. A gradient read
# in the wrong layout is off by about 1.
TOLERANCE = {"fp32": (0.05, 1e-4), "bf16": (0.5, 2e-2), "fp16": (0.5, 2e-2)}


def check_package(torch, spec, device, out):
    """Runs the package in `out` and the eager step from the same weights on the same batch as
    the compile traced; fails unless they agree within TOLERANCE. Returns the figures."""
    loss_module, inputs = loss_and_inputs(torch, spec, device)
    net = loss_module.net
    constants = {"net." + k: v.detach().clone()
                 for k, v in list(net.named_parameters()) + list(net.named_buffers())}
    constants["flat_grad"] = torch.zeros(spec["total"], device=device)
    index = (device.index or 0) if device.type == "cuda" else -1
    loader = load_package(torch, os.path.join(out, "step.pt2"), index)
    listed = set(loader.get_constant_fqns())
    folded = sorted(k.removeprefix("net.") for k in constants if k not in listed)
    if folded:  # no other options would help: the compile fails outright
        print(f"ddl compile: the compiled step does not read {', '.join(folded)} as a tensor "
              "(folded into its code as a constant, so ddl's updates to it would be ignored); "
              "it cannot train this model", file=sys.stderr)
        sys.exit(FOLDED)
    loader.load_constants(constants, False, True, True)
    compiled_loss = float(loader.run(list(inputs))[0])
    flat = constants["flat_grad"]
    scaled, loss = loss_module(*inputs)
    scaled.backward()
    eager = {k: p.grad.detach() for k, p in net.named_parameters()}

    worst, diff_sq, norm_sq = [], 0.0, 0.0
    for p in spec["params"]:
        g = eager[p["name"]]
        if spec["channels_last"] and g.dim() == 4:
            g = g.permute(0, 2, 3, 1)
        g = g.reshape(-1).double()
        c = flat[p["offset"]:p["offset"] + g.numel()].double()
        d, n = float((c - g).norm()), float(g.norm())
        diff_sq, norm_sq = diff_sq + d * d, norm_sq + n * n
        worst.append((d / n if n else d, p["name"]))
    worst.sort(reverse=True)
    grad_rel = (diff_sq / norm_sq) ** 0.5 if norm_sq else 0.0
    loss_rel = abs(compiled_loss - float(loss)) / max(abs(float(loss)), 1e-12)
    figures = {"grad_rel": grad_rel, "loss_rel": loss_rel,
               "worst": [{"name": n, "rel": r} for r, n in worst[:5]]}
    grad_tol, loss_tol = TOLERANCE[spec["precision"]]
    if not (grad_rel <= grad_tol and loss_rel <= loss_tol):
        fail(f"the compiled step disagrees with eager PyTorch on {device} (whole gradient "
             f"{grad_rel:.3g} off, allowed {grad_tol}; loss {loss_rel:.3g}, allowed {loss_tol}); "
             f"furthest off: {', '.join(f'{n} {r:.3g}' for r, n in worst[:5])}")
    return figures


def load_package(torch, path, device_index):
    """libtorch's loader of the package, run single-threaded as ddl-train runs it (package.cpp).
    Not `torch._inductor.aoti_load_package`: before it loads, that one probes which vector
    instruction sets this CPU and compiler support, each with a compile and a new Python that
    imports torch, only to warn if they differ from the compile's (BENCHMARKS.md)."""
    return torch._C._aoti.AOTIModelPackageLoader(path, "model", True, 1, device_index)


def check_names(net, spec):
    """Fails unless the network's parameters and buffers are exactly ddl's (names, shapes)."""
    ours = {n: list(p.shape) for n, p in net.named_parameters()}
    ours.update({n: list(b.shape) for n, b in net.named_buffers()})
    theirs = {p["name"]: p["shape"] for p in spec["params"]}
    theirs.update({b["name"]: b["shape"] for b in spec["buffers"]})
    if ours != theirs:
        diff = sorted(set(map(str, ours.items())) ^ set(map(str, theirs.items())))
        fail(f"the Python {spec['model']} differs from ddl's: {diff[:6]}")


def FlatStep(torch, net, joint, spec):
    """A module that runs the joint graph on the network's own parameters and buffers, applies
    its running-statistics updates in place and writes the gradients into `flat_grad`."""
    import torch.nn as nn

    signature = joint.graph_signature
    order = [s.target for s in signature.input_specs if s.target is not None]
    kinds = [(s.kind.name, s.target) for s in signature.output_specs]
    params = {p["name"]: p for p in spec["params"]}

    class Step(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net
            self.graph = joint.graph_module
            self.register_buffer(
                "flat_grad", torch.zeros(spec["total"], device=next(net.parameters()).device))

        def forward(self, images, labels, loss_scale):
            state = dict(self.named_parameters())
            state.update(self.named_buffers())
            outs = self.graph(*[state[n] for n in order], images, labels, loss_scale)
            grads, loss = {}, None
            for (kind, target), value in zip(kinds, outs):
                if kind == "BUFFER_MUTATION":
                    state[target].copy_(value)
                elif kind == "GRADIENT_TO_PARAMETER":
                    grads[target.removeprefix("net.")] = value
                elif kind == "USER_OUTPUT":
                    loss = value
            pieces, at = [], 0
            for name, info in sorted(params.items(), key=lambda kv: kv[1]["offset"]):
                if info["offset"] > at:
                    pieces.append(torch.zeros(info["offset"] - at, device=images.device))
                g = grads[name]
                if spec["channels_last"] and g.dim() == 4:
                    g = g.permute(0, 2, 3, 1)
                pieces.append(g.reshape(-1).float())
                at = info["offset"] + g.numel()
            if spec["total"] > at:
                pieces.append(torch.zeros(spec["total"] - at, device=images.device))
            self.flat_grad.copy_(torch.cat(pieces))
            return (loss,)

    return Step()


if __name__ == "__main__":
    main()
