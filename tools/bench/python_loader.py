"""ddl's Python package: `ddl.Loader` timed the way `loader_bench` times the Rust pipeline.

Opens the train split of SHARDS (populate=True, as loader_bench opens it), then counts the
images of the batches it yields (RandomResizedCrop + flip + normalize, float32 NCHW torch
tensors, dropped at once) over SECONDS of wall time, epoch after epoch, the clock started before
the first batch is asked for (loader_bench starts its clock before `Pipeline::start`).
CPU time is getrusage(RUSAGE_SELF) over the same interval (all threads: the Rust decode
workers and the Python consumer).
Prints one JSON line: {"peer": "ddl-python", "images", "seconds", "images_per_s",
"cpu_s", "images_per_cpu_s", "wait_fraction"}.
Usage: python python_loader.py SHARDS [--seconds 15] [--workers 2] [--batch 64] [--size 224]
"""
import argparse
import json
import resource
import time

import torch

import ddl


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shards")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--layout", default="NCHW")
    args = ap.parse_args()
    torch.set_num_threads(1)
    loader = ddl.Loader(args.shards, split="train", batch_size=args.batch,
                        image_size=args.size, workers=args.workers, seed=1, rank=0,
                        world_size=1, dtype=args.dtype, layout=args.layout, populate=True)
    images, epoch = 0, 0
    cpu0 = cpu_seconds()
    start = time.perf_counter()
    deadline = start + args.seconds
    done = False
    while not done:
        loader.set_epoch(epoch)
        for x, _y in loader:
            images += x.shape[0]
            del x, _y
            if time.perf_counter() >= deadline:
                done = True
                break
        epoch += 1
    seconds = time.perf_counter() - start
    cpu = cpu_seconds() - cpu0
    st = loader.stats()
    print(json.dumps({"peer": "ddl-python", "images": images, "seconds": seconds,
                      "images_per_s": images / seconds, "cpu_s": cpu,
                      "images_per_cpu_s": images / cpu, "cpu_ms_per_image": 1e3 * cpu / images,
                      "wait_fraction": st["wait_fraction"], "workers": args.workers}),
          flush=True)


if __name__ == "__main__":
    main()
