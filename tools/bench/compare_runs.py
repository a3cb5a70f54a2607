"""Compares two ddl-train runs: their --dump-weights files and --metrics losses.

    python3 tools/bench/compare_runs.py A.f32 B.f32 A.jsonl B.jsonl

prints one line: over all weights, max |a - b| / max |b|; the same over the head (fc.*); the
worst tensor by its own scale; over the steps, the largest relative difference of the loss;
and the steps and the val top-1 / top-5 of each run's last epoch (B is the reference)."""

import json
import sys

import numpy as np


def weights(path):
    raw = np.fromfile(path, dtype="<f4")
    index = json.load(open(path + ".json"))["tensors"]
    ends = [t["offset"] for t in index[1:]] + [raw.size]
    return {t["name"]: raw[t["offset"]:end].astype(np.float64) for t, end in zip(index, ends)}


def metrics(path):
    lines = [json.loads(line) for line in open(path)]
    return ([r["loss"] for r in lines if r["type"] == "step"],
            [r for r in lines if r["type"] == "epoch"])


a, b = weights(sys.argv[1]), weights(sys.argv[2])
assert list(a) == list(b), "different tensors"
diff = {k: np.abs(a[k] - b[k]).max() for k in a}
scale = {k: np.abs(b[k]).max() for k in b}
head = [k for k in a if k.startswith("fc.")]
worst = max(a, key=lambda k: diff[k] / max(scale[k], 1e-30))
(la, ea), (lb, eb) = metrics(sys.argv[3]), metrics(sys.argv[4])
assert len(la) == len(lb), "different step counts"
loss = max(abs(x - y) / abs(y) for x, y in zip(la, lb))
top = lambda e: f"{e[-1]['val_top1']:.4f}/{e[-1]['val_top5']:.4f}" if e else "-"
print(f"weights {max(diff.values()) / max(scale.values()):.2e}  "
      f"head {max(diff[k] for k in head) / max(scale[k] for k in head):.2e}  "
      f"worst tensor {diff[worst] / scale[worst]:.2e} ({worst}, scale {scale[worst]:.1e})  "
      f"loss {loss:.2e} over {len(la)} steps  val top-1/top-5 {top(ea)} vs {top(eb)}")
