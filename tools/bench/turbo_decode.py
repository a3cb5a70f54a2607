"""Limit: libjpeg-turbo (simplejpeg) full decode to RGB of the JPEGs a shard directory holds,
read into RAM first; no crop, no resize. --procs processes each decode a share of the files.
Prints {"peer": "libjpeg-turbo-full-decode", "procs": P, "images": N, "seconds": S, "images_per_s": R,
"cpu_s": C, "images_per_cpu_s": N / C} (C: CPU seconds of the decoding processes, process_time).
Usage: python turbo_decode.py SOURCE [--split train] [--procs 2] [--passes 3]
SOURCE is either a ddl shard directory (the JPEGs are read straight out of the shards, per
loader/FORMAT.md: exactly the bytes ddl's loader decodes) or an ImageNet-style tree (every
SOURCE/train/**/*.JPEG: the original files the shards were packed from).
"""
import argparse
import json
import time
from multiprocessing import Pool

import simplejpeg
import glob
import os
import struct

BLOBS = []


def shard_records(path):
    """Every record's bytes of one shard, parsed from its header and index (FORMAT.md)."""
    data = open(path, "rb").read()
    assert data[:8] == b"DDLSHARD", f"{path}: not a ddl shard"
    count, index_offset, data_offset = struct.unpack_from("<QQQ", data, 16)
    out = []
    for i in range(count):
        offset, length = struct.unpack_from("<QI", data, index_offset + 32 * i)
        out.append(data[data_offset + offset:data_offset + offset + length])
    return out


def load(blobs):
    global BLOBS
    BLOBS = blobs


def decode_all(_):
    cpu = time.process_time()
    for b in BLOBS:
        simplejpeg.decode_jpeg(b, colorspace="RGB")
    return len(BLOBS), time.process_time() - cpu


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("source")
    ap.add_argument("--split", default="train")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--passes", type=int, default=3)
    args = ap.parse_args()
    if os.path.exists(os.path.join(args.source, "manifest.json")):
        paths = sorted(glob.glob(os.path.join(args.source, f"{args.split}-*.ddl")))
        blobs = [r for p in paths for r in shard_records(p)]
        kind = "shards"
    else:
        paths = sorted(glob.glob(os.path.join(args.source, args.split, "**", "*.JPEG"),
                              recursive=True))
        blobs = [open(p, "rb").read() for p in paths]
        kind = "original-files"
    shares = [blobs[i::args.procs] for i in range(args.procs)]
    pools = [Pool(1, initializer=load, initargs=(share,)) for share in shares]
    for _ in range(args.passes):
        start = time.perf_counter()
        results = [p.apply_async(decode_all, (0,)) for p in pools]
        done = [r.get() for r in results]
        s = time.perf_counter() - start
        n = sum(k for k, _ in done)
        cpu = sum(c for _, c in done)
        print(json.dumps({"peer": "libjpeg-turbo-full-decode", "procs": args.procs, "source": kind, "images": n,
                          "seconds": s, "images_per_s": n / s, "cpu_s": cpu, "images_per_cpu_s": n / cpu}),
              flush=True)
    for p in pools:
        p.close()


if __name__ == "__main__":
    main()
