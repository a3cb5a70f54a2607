"""Previews, on a machine without a GPU, the code Inductor generates for ddl-train's compiled
step on an H100/H200 (sm_90): its kernels, and the layout of every 4-D buffer it allocates or
expects from cuDNN. A GPU lease is rare; this says beforehand whether a channels-last step
stays channels-last, which Inductor options change that, and how many kernels a step launches.

    python tools/gpu/preview.py --model resnet50 --classes 1000 --batch 256 --image-size 224 \\
        --precision bf16 --channels-last [--inductor-option layout_optimization=False] [--out DIR]

Prints one JSON line: Inductor's layout-optimization decision, the kernels a step launches (by
kind), the calls to ATen (convolutions, their backward, matrix products), the 4-D buffers by
layout (nchw, nhwc, other; those with a dimension of 1 apart) and how many are not in the
step's layout (the first 20 named). DIR/wrapper.py gets the generated code.

How: the network, loss, batch and joint forward + backward graph are step.py's own (the
functions ddl-train's compile runs), traced on the meta device, whose convolutions follow CUDA's
layout rules, and handed to Inductor as fake CUDA tensors of the same strides, with cuDNN as
every convolution's backend (as on the GPU). It differs from the real compile where the real
one needs the device, in ways that do not move a layout:
- autocast has no meta device: bf16 and fp16 cast the inputs and weights of the convolutions
  and linear layers, which is what autocast does for them (everything else runs in its
  input's dtype either way);
- Inductor's joint-graph pattern rewrites and constant folding run real tensors on the device
  and are off;
- the wrapper is Inductor's Python one, not AOTInductor's C++ one (the same lowering);
- the spec's flat gradient is packed without ddl's alignment gaps.
It replaces a few torch.cuda functions and Inductor internals of torch 2.11 (the torch
`make setup` installs), and ends where Inductor would compile the kernels.
"""
import argparse
import ast
import contextlib
import json
import os
import re
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "trainer", "src", "compiled"))

import torch  # noqa: E402
import step  # noqa: E402  (trainer/src/compiled/step.py)

# An H200 as Inductor asks after it (an H100 differs in nothing Inductor's choices read).
H200 = types.SimpleNamespace(
    name="NVIDIA H200", major=9, minor=0, multi_processor_count=132,
    total_memory=140 * 2**30, max_threads_per_multi_processor=2048,
    regs_per_multiprocessor=65536, warp_size=32, L2_cache_size=50 * 2**20, gcnArchName="",
    shared_memory_per_block_optin=232448, max_threads_per_block=1024,
    shared_memory_per_multiprocessor=233472, clock_rate=1980000, uuid="preview")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a model step.py defines (torchvision names)")
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--batch", type=int, default=256, help="images per step")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="bf16")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--inductor-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of torch._inductor.config, as ddl-train takes it")
    p.add_argument("--out", help="a folder for wrapper.py, the generated code")
    a = p.parse_args()
    spec = packed_spec(a)
    program, inputs = traced_step(spec, a.precision)
    code, layout_opt = generate(program, inputs, a.inductor_option)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "wrapper.py"), "w") as f:
            f.write(code)
    print(json.dumps(dict(summary(code, a.channels_last), layout_optimization=layout_opt)))


def packed_spec(a):
    """A spec as ddl-train writes it, for the network step.py builds (gradients packed)."""
    spec = {"model": a.model, "classes": a.classes, "model_image_size": a.image_size}
    net = step.build_network(torch, spec)
    params, at = [], 0
    for name, t in net.named_parameters():
        params.append({"name": name, "shape": list(t.shape), "offset": at})
        at += t.numel()
    buffers = [{"name": n, "shape": list(b.shape)} for n, b in net.named_buffers()
               if not n.endswith("num_batches_tracked")]
    return dict(spec, batch=a.batch, image_size=a.image_size, channels_last=a.channels_last,
                precision=a.precision, label_smoothing=0.1, params=params, buffers=buffers,
                total=at)


def traced_step(spec, precision):
    """step.py's exported step (the joint graph on the network's parameters, writing the flat
    gradient), traced on the meta device; and its inputs there."""
    from torch.export.experimental import _export_forward_backward
    import torch.nn as nn
    import torch.nn.functional as F

    low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    autocast = torch.autocast
    originals = nn.Conv2d.forward, nn.Linear.forward

    def meta_autocast(device_type, **kwargs):
        return contextlib.nullcontext() if device_type == "meta" else autocast(device_type,
                                                                               **kwargs)

    def conv(self, x):
        return self._conv_forward(x.to(low), self.weight.to(low),
                                  None if self.bias is None else self.bias.to(low))

    def linear(self, x):
        return F.linear(x.to(low), self.weight.to(low),
                        None if self.bias is None else self.bias.to(low))

    torch.autocast = meta_autocast
    if low is not None:
        nn.Conv2d.forward, nn.Linear.forward = conv, linear
    try:
        meta = torch.device("meta")
        loss, inputs = step.loss_and_inputs(torch, dict(spec, precision="fp32"), meta)
        joint = _export_forward_backward(torch.export.export(loss, inputs), joint_loss_index=0)
        flat = step.FlatStep(torch, loss.net, joint, spec)
        with torch.no_grad():
            return torch.export.export(flat, inputs), inputs
    finally:
        torch.autocast = autocast
        nn.Conv2d.forward, nn.Linear.forward = originals


def generate(program, inputs, options):
    """The Python wrapper Inductor generates for the program on a fake sm_90 device, and
    whether it chose its layout optimization."""
    import torch._inductor.config as config
    from torch._inductor import codecache
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.graph import GraphLowering

    fake = pretend_h200()
    cuda, meta = torch.device("cuda", 0), torch.device("meta")

    def on_cuda(t):
        return fake.fake_tensor_converter.from_meta_and_device(fake, t, cuda)

    module = program.module()
    for m in module.modules():
        for k, v in list(m._parameters.items()):
            if v is not None:
                m._parameters[k] = torch.nn.Parameter(on_cuda(v.data), requires_grad=False)
        for k, v in list(m._buffers.items()):
            if v is not None:
                m._buffers[k] = on_cuda(v)
    for node in module.graph.nodes:
        if node.kwargs.get("device") == meta:
            node.kwargs = {**node.kwargs, "device": cuda}
    module.recompile()

    config.compile_threads = 1
    config.joint_graph_constant_folding = False
    for item in options:
        key, _, value = item.partition("=")
        setattr(config, key, ast.literal_eval(value))
    decided = []
    decide = GraphLowering.decide_layout_opt

    def remembered(gm, **kwargs):
        decided.append(decide(gm, **kwargs))
        return decided[-1]

    GraphLowering.decide_layout_opt = staticmethod(remembered)
    written = []
    load = codecache.PyCodeCache.load_by_key_path

    def keep(key, path, *args, **kwargs):
        with open(path) as f:
            code = f.read()
        if "def call(" not in code:
            return load(key, path, *args, **kwargs)
        written.append(code)
        raise Generated()

    codecache.PyCodeCache.load_by_key_path = staticmethod(keep)
    try:
        compile_fx(module, [on_cuda(t) for t in inputs])
    except Exception:  # Inductor wraps the Generated that keep() raised
        if not written:
            raise
    finally:
        codecache.PyCodeCache.load_by_key_path = load
        GraphLowering.decide_layout_opt = staticmethod(decide)
    return written[0], decided[-1]


class Generated(Exception):
    """Inductor has written the wrapper: nothing after that runs without a GPU."""


def pretend_h200():
    """Makes torch and Inductor see one H200, and returns a FakeTensorMode that makes CUDA
    tensors without touching a driver."""
    import torch._subclasses.fake_tensor as fake_tensor
    import torch.utils._triton as triton_utils
    from torch._dynamo.device_interface import CudaInterface
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    cuda = torch.cuda
    rng = torch.zeros(16, dtype=torch.uint8)
    for name, fn in {
        "is_available": lambda: True, "device_count": lambda: 1, "current_device": lambda: 0,
        "get_device_properties": lambda d=None: H200,
        "get_device_capability": lambda d=None: (9, 0),
        "get_device_name": lambda d=None: H200.name, "synchronize": lambda d=None: None,
        "_lazy_init": lambda: None, "is_bf16_supported": lambda *a, **k: True,
        "get_rng_state": lambda *a, **k: rng, "set_rng_state": lambda *a, **k: None,
    }.items():
        setattr(cuda, name, fn)
    cuda.random.get_rng_state, cuda.random.set_rng_state = cuda.get_rng_state, cuda.set_rng_state
    cuda.device.__enter__ = lambda self: None
    cuda.device.__exit__ = lambda self, *a: False
    for iface in (CudaInterface, CudaInterface.Worker):
        iface.get_device_properties = staticmethod(lambda d=None: H200)
        iface.current_device = staticmethod(lambda: 0)
    CudaInterface.device_count = staticmethod(lambda: 1)
    CudaInterface.is_bf16_supported = staticmethod(lambda *a, **k: True)
    CudaInterface.synchronize = staticmethod(lambda *a: None)
    CudaInterface.exchange_device = staticmethod(lambda d: 0)
    CudaInterface.maybe_exchange_device = staticmethod(lambda d: 0)
    backend = make_backend(GPUTarget("cuda", 90, 32))
    triton_utils.triton_backend = lambda: backend
    fake_tensor.init_gpu_context = lambda device: None
    # Without a device libtorch picks no cuDNN for bf16 and fp16 convolutions (it cannot read
    # the capability), and the fake convolution would predict another backend's layout.
    select = torch._C._select_conv_backend

    def cudnn(*args, **kwargs):
        x = kwargs.get("input", args[0] if args else None)
        if getattr(x, "fake_device", x.device).type == "cuda":
            return torch._C._ConvBackend.Cudnn
        return select(*args, **kwargs)

    torch._C._select_conv_backend = cudnn
    # The pattern passes trace their patterns with real tensors on the device.
    from torch._inductor.fx_passes import fuse_attention, misc_patterns, pad_mm
    fuse_attention._sfdp_init = lambda *a, **k: None
    misc_patterns._misc_patterns_init = lambda *a, **k: None
    pad_mm._pad_mm_init = lambda *a, **k: None
    return fake_tensor.FakeTensorMode(allow_non_fake_inputs=True)


BUFFER = re.compile(r"(buf\d+) = empty_strided_cuda\(\((\d+), (\d+), (\d+), (\d+)\), "
                    r"\((\d+), (\d+), (\d+), (\d+)\)")
CUDNN_OUT = re.compile(r"assert_size_stride\((buf\d+), \((\d+), (\d+), (\d+), (\d+)\), "
                       r"\((\d+), (\d+), (\d+), (\d+)\)")


def summary(code, channels_last):
    """What a step of the generated code launches and lays out."""
    call = code.split("def call(", 1)[1]
    want = "nhwc" if channels_last else "nchw"
    kernels, externs, layouts, off = {}, {}, {}, []
    # Inductor's kernel kinds: pointwise, reduction, persistent reduction.
    for kind in re.findall(r"triton_(poi|red|per)_fused_\w+\.run\(", call):
        kernels[kind] = kernels.get(kind, 0) + 1
    for pair in re.findall(r"extern_kernels\.(\w+)\(|torch\.ops\.aten\.(\w+)\.default\(", call):
        extern = "".join(pair)
        externs[extern] = externs.get(extern, 0) + 1
    for line in call.splitlines():
        for m in list(BUFFER.finditer(line)) + list(CUDNN_OUT.finditer(line)):
            n, c, h, w, s0, s1, s2, s3 = map(int, m.groups()[1:])
            kind = ("unit" if 1 in (c, h, w) else
                    "nchw" if (s1, s2, s3) == (h * w, w, 1) else
                    "nhwc" if (s1, s2, s3) == (1, w * c, c) else "other")
            layouts[kind] = layouts.get(kind, 0) + 1
            if kind not in ("unit", want):
                off.append(f"{m.group(1)} {[n, c, h, w]} {kind}")
    return {"kernels": sum(kernels.values()), "kernels_by_kind": kernels, "externs": externs,
            "layouts": layouts, "off_layout": off[:20], "off_layout_count": len(off)}


if __name__ == "__main__":
    main()
