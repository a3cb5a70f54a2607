"""Plain PyTorch training loop: the peer of ddl-train's GPU benchmark (issues 6 and 34).

torchvision ResNet, SGD (momentum 0.9, weight decay 1e-4), cross-entropy, the given batch,
precision (autocast bf16/fp16 with a GradScaler for fp16) and memory format, on batches that
already sit on the device (so the loop measures the model alone, the best case for the peer).
Eager by default; `--compile` runs the model under torch.compile (`--compile-mode`: default,
reduce-overhead or max-autotune-no-cudagraphs), and `--compile-optimizer` the optimizer step
too (torch.compile of `opt.step`, PyTorch's recipe for a compiled optimizer); compilation
happens in the warmup steps and is excluded from the figure (reported as warmup_s). Prints one
JSON line: peer, model, batch, precision, channels_last, images_per_s (median over the timed
steps), step_ms and warmup_s.
"""
import argparse
import json
import statistics
import time

import torch
import torchvision

p = argparse.ArgumentParser()
p.add_argument("--model", default="resnet50")
p.add_argument("--batch", type=int, default=256)
p.add_argument("--image-size", type=int, default=224)
p.add_argument("--classes", type=int, default=1000)
p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="bf16")
p.add_argument("--channels-last", action="store_true")
p.add_argument("--steps", type=int, default=100)
p.add_argument("--warmup", type=int, default=20)
p.add_argument("--device", default="cuda")
p.add_argument("--compile", action="store_true", help="torch.compile the model")
p.add_argument("--compile-mode", default="default",
               choices=["default", "reduce-overhead", "max-autotune-no-cudagraphs"])
p.add_argument("--compile-optimizer", action="store_true", help="torch.compile opt.step too")
a = p.parse_args()
if a.compile and a.warmup < 1:
    p.error("--compile needs --warmup >= 1 (the first step compiles)")
if (a.compile_mode != "default" or a.compile_optimizer) and not a.compile:
    p.error("--compile-mode and --compile-optimizer need --compile")

dev = torch.device(a.device)
torch.backends.cudnn.benchmark = True
fmt = torch.channels_last if a.channels_last else torch.contiguous_format
model = getattr(torchvision.models, a.model)(num_classes=a.classes).to(dev, memory_format=fmt)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
forward = torch.compile(model, mode=a.compile_mode) if a.compile else model
opt_step = torch.compile(opt.step) if a.compile_optimizer else opt.step
if a.compile_optimizer and a.precision == "fp16":
    p.error("--compile-optimizer runs without a GradScaler: use bf16 or fp32")
scaler = torch.amp.GradScaler(enabled=a.precision == "fp16")
dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[a.precision]
x = torch.randn(a.batch, 3, a.image_size, a.image_size, device=dev).to(memory_format=fmt)
y = torch.randint(0, a.classes, (a.batch,), device=dev)
loss_fn = torch.nn.CrossEntropyLoss()


def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize()


times = []
start = time.perf_counter()
for step in range(a.warmup + a.steps):
    if step == a.warmup:
        warmup_s = time.perf_counter() - start
    sync()
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    with torch.autocast(dev.type, dtype=dtype, enabled=dtype is not None):
        loss = loss_fn(forward(x), y)
    if a.compile_optimizer:
        loss.backward()
        opt_step()
    else:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    sync()
    if step >= a.warmup:
        times.append(time.perf_counter() - t0)
step_s = statistics.median(times)
peer = "pytorch-eager"
if a.compile:
    peer = "pytorch-compile" + ("" if a.compile_mode == "default" else "-" + a.compile_mode)
    peer += "-opt" if a.compile_optimizer else ""
print(json.dumps({
    "peer": peer, "model": a.model,
    "batch": a.batch, "precision": a.precision, "channels_last": a.channels_last,
    "images_per_s": a.batch / step_s, "step_ms": step_s * 1e3, "steps": a.steps,
    "warmup_s": warmup_s,
}))
