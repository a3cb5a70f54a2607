"""Peer: a plain Pillow loop doing what ddl-pack does to each image (decode, RGB, resize the
shorter side to at most MAX with a good filter, re-encode JPEG q90), over a process pool.
Prints {"peer": "pillow-pack", "images": N, "seconds": S, "images_per_s": R, "bytes": B}.
Usage: python pillow_pack.py ROOT [--max-short-side 256] [--workers 2]
"""
import argparse
import io
import json
import os
import time
from multiprocessing import Pool

from PIL import Image

MAX = 256


def convert(path):
    with Image.open(path) as im:
        im = im.convert("RGB")
        w, h = im.size
        short = min(w, h)
        if MAX and short > MAX:
            im = im.resize((round(w * MAX / short), round(h * MAX / short)), Image.LANCZOS)
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=90)
        return len(buf.getvalue())


def init(max_short):
    global MAX
    MAX = max_short


def cpu_seconds():
    """CPU seconds of this process, its threads and its finished children (the pool workers)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--max-short-side", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(f"{args.root}/train") for f in fs)
    start, cpu0 = time.perf_counter(), cpu_seconds()
    with Pool(args.workers, initializer=init, initargs=(args.max_short_side,)) as pool:
        total = sum(pool.imap(convert, paths, chunksize=16))
    s, cpu = time.perf_counter() - start, cpu_seconds() - cpu0
    print(json.dumps({"peer": "pillow-pack", "images": len(paths), "seconds": s,
                      "images_per_s": len(paths) / s, "cpu_s": cpu, "bytes": total}), flush=True)


if __name__ == "__main__":
    main()
