"""The compiled step's package alone, from Python: run as ddl-train runs it, and on a GPU
replayed from a CUDA graph (static input slots, captured on a side stream), to measure whether
CUDA graphs pay over the compiled step (issue 43, item 4) and what ddl-train adds to the
package's own time.

    python3 compiled_graphs.py CACHE_ENTRY [--steps 50] [--warmup 10] [--profile N]

CACHE_ENTRY is a folder of ddl-train's compile cache (step.pt2 and step.json). Its constants are
bound to tensors made here (parameters random, running variances ones, the flat gradient
zeros); the inputs are a random batch of the shape the package takes. Prints one JSON line:
package_ms (median over --steps plain runs, each timed with CUDA events), graph_ms (the same
replayed from a CUDA graph), graph_speedup (package_ms / graph_ms), and the loss of the last
plain run and of the last replay (the same inputs and weights: loss_agrees says they do).
The plain figures are printed first (a line of their own), before the graph is captured. A CPU
package (its step.json's device) is only timed plain, with the host clock.
--profile N: also the N CUDA kernels that take the most time in a plain run of the package and
in an eager torchvision step of the same model, batch and arithmetic (torch.profiler), one JSON
line each, to see where the compiled step spends its time.
"""
import argparse
import faulthandler
import json
import os
import statistics
import time

import torch

DTYPES = {"torch.float32": torch.float32, "torch.bfloat16": torch.bfloat16,
          "torch.float16": torch.float16, "torch.int64": torch.int64}


def tensor_of(spec, device, kind, classes):
    """A tensor laid out as SPEC says: labels below CLASSES, running variances ones, the
    flat gradient zeros, the loss scale one, anything else small random values."""
    shape, strides = spec["shape"], spec["strides"]
    dtype = DTYPES[spec["dtype"]]
    t = torch.empty_strided(shape, strides, dtype=dtype, device=device)
    if kind == "labels":
        t.copy_(torch.randint(0, classes, shape))
    elif kind == "var":
        t.fill_(1.0)
    elif kind in ("zeros", "scale"):
        t.fill_(1.0 if kind == "scale" else 0.0)
    else:
        t.copy_(torch.randn(shape) * (0.05 if len(shape) > 1 else 1.0))
    return t


def timed(fn, steps, device):
    """The median milliseconds of STEPS calls of FN (CUDA events on a GPU)."""
    if device.type == "cpu":
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def top_kernels(fn, n):
    """The N kernels of FN's run with the most CUDA time: name, calls, total ms."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = [(e.key, e.count, e.device_time_total / 1e3) for e in prof.key_averages()]
    rows.sort(key=lambda r: -r[2])
    total = sum(r[2] for r in rows)
    return [{"total_ms": total}] + [{"kernel": k[:120], "calls": c, "ms": t} for k, c, t in rows[:n]]


def eager_step(classes, images, labels):
    """An eager torchvision ResNet-50 step (the GPU bundle's compiled model) of CLASSES
    classes, in bf16 autocast, channels-last as the images are."""
    import torchvision

    model = torchvision.models.resnet50(num_classes=classes).cuda()
    model = model.to(memory_format=torch.channels_last)

    def step():
        model.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(images).float(), labels)
        loss.backward()
        return loss

    return step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("entry")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--profile", type=int, default=0)
    a = ap.parse_args()
    faulthandler.enable()
    with open(os.path.join(a.entry, "spec.json")) as f:
        device = torch.device(json.load(f)["device"])
    torch.backends.cudnn.benchmark = True
    with open(os.path.join(a.entry, "step.json")) as f:
        described = json.load(f)
    index = (device.index or 0) if device.type == "cuda" else -1
    # libtorch's loader, single-threaded, as ddl-train runs it: no wait for the previous run
    # before each run, and none of aoti_load_package's probes of the CPU's vector instructions.
    loader = torch._C._aoti.AOTIModelPackageLoader(os.path.join(a.entry, "step.pt2"), "model",
                                                   True, 1, index)
    classes = next(c["shape"][0] for c in described["constants"] if c["name"] == "fc.bias")
    constants = {}
    for c in described["constants"]:
        kind = "zeros" if c["fqn"] == "flat_grad" else (
            "var" if c["name"].endswith("running_var") else "zeros"
            if c["name"].endswith("running_mean") else "param")
        constants[c["fqn"]] = tensor_of(c, device, kind, classes)
    loader.load_constants(constants, False, True, True)
    images, labels, scale = (tensor_of(s, device, k, classes) for s, k in
                             zip(described["inputs"], ["param", "labels", "scale"]))
    inputs = [images, labels, scale]

    def plain():
        return loader.run(inputs)[0]

    for _ in range(a.warmup):
        plain()
    package_ms = timed(plain, a.steps, device)
    loss_plain = float(plain())
    print(json.dumps({"package_ms": package_ms, "images": images.shape[0],
                      "package_images_per_s": images.shape[0] / package_ms * 1e3}), flush=True)
    if device.type == "cpu":
        return
    if a.profile:
        print(json.dumps({"profile": "package", "top": top_kernels(plain, a.profile)}), flush=True)
        eager = eager_step(classes, images, labels)
        print(json.dumps({"profile": "eager", "top": top_kernels(eager, a.profile)}), flush=True)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            plain()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss_static = plain()
    graph.replay()
    torch.cuda.synchronize()
    graph_ms = timed(graph.replay, a.steps, device)
    print(json.dumps({
        "package_ms": package_ms, "graph_ms": graph_ms, "graph_speedup": package_ms / graph_ms,
        "images": images.shape[0], "package_images_per_s": images.shape[0] / package_ms * 1e3,
        "loss_plain": loss_plain, "loss_graph": float(loss_static),
        "loss_agrees": abs(loss_plain - float(loss_static)) <= 1e-3 * max(1.0, abs(loss_plain)),
    }), flush=True)


if __name__ == "__main__":
    main()
