"""The checks of tools/gpu/run.sh that need torch (issue 34, part B). Each prints one JSON line.

  env [--device cuda|cpu]        Python, torch, CUDA, cuDNN and torchvision versions; the GPU's
                                 name, memory, multiprocessors and driver (nvidia-smi)
  export MODEL TENSORS [--device D]
                                 MODEL (a ddl-train --export file) loads strictly into its
                                 torchvision class on D; its logits on the inputs that
                                 `ddl-predict --save-tensors TENSORS` saved are compared with
                                 ddl-predict's: max_abs_diff (float32), on a GPU also with
                                 TF32 convolutions (torch's default), top-1 agreement
"""
import argparse
import json
import os
import subprocess
import sys

import torch
import torchvision


def nvidia_smi():
    """name, driver_version and memory.total of GPU 0 as nvidia-smi reports them, or {}."""
    fields = ("name", "driver_version", "memory.total")
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    values = [v.strip() for v in out.splitlines()[0].split(",")] if out.strip() else []
    return dict(zip(("gpu", "driver", "gpu_memory"), values))


def env(args):
    info = {
        "python": sys.version.split()[0], "torch": torch.__version__,
        "torch_cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
        "torchvision": torchvision.__version__, "cpus": os.cpu_count(),
        "cuda_available": torch.cuda.is_available(),
    }
    if args.device == "cuda" and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(nvidia_smi())  # its "gpu" is the same name as torch's
        info.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1),
                    multiprocessors=p.multi_processor_count, capability=f"{p.major}.{p.minor}")
    print(json.dumps(info))


def export(args):
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(args.model, "pt") as f:
        meta = f.metadata()
    classes = json.loads(meta["classes"])
    device = torch.device(args.device)
    model = torchvision.models.get_model(meta["model"], num_classes=len(classes))
    model.load_state_dict(load_file(args.model), strict=True)
    model.to(device).eval()
    saved = load_file(args.tensors)
    theirs = saved["logits"].float()

    def diff(tf32):
        torch.backends.cudnn.allow_tf32 = tf32
        with torch.no_grad():
            ours = model(saved["input"].to(device)).float().cpu()
        return ours, (ours - theirs).abs().max().item()

    # Like for like: ddl-predict computes with libtorch's defaults, TF32 convolutions on an
    # Ampere or later GPU, as torch's are. Strict float32 arithmetic on this side too, so that
    # the share of TF32 in the difference shows.
    torch.backends.cuda.matmul.allow_tf32 = False
    ours, max_abs_diff = diff(torch.backends.cudnn.allow_tf32)
    strict_diff = diff(False)[1] if device.type == "cuda" else max_abs_diff
    print(json.dumps({
        "model": meta["model"], "images": int(theirs.shape[0]), "strict_load": True,
        "max_abs_diff": max_abs_diff, "max_abs_diff_strict_fp32": strict_diff,
        "max_abs_logit": theirs.abs().max().item(),
        "top1_agree": (ours.argmax(1) == theirs.argmax(1)).float().mean().item(),
        "val_top1": json.loads(meta["val_top1"]) if "val_top1" in meta else None,
        "val_top5": json.loads(meta["val_top5"]) if "val_top5" in meta else None,
    }))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="command", required=True)
    e = sub.add_parser("env")
    e.add_argument("--device", default="cuda")
    x = sub.add_parser("export")
    x.add_argument("model")
    x.add_argument("tensors")
    x.add_argument("--device", default="cuda")
    args = ap.parse_args()
    {"env": env, "export": export}[args.command](args)


if __name__ == "__main__":
    main()
