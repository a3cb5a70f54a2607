"""Peer: FFCV's DatasetWriter on ROOT/train (RGBImageField jpg, quality 90).

max_resolution caps the longest side; --max-res 340 stores about what a shorter side of 256
stores. Prints {"peer": "ffcv-writer", "images": N, "seconds": S, "images_per_s": R, "bytes": B}.
Usage: python ffcv_write.py ROOT OUT.beton [--max-res 340] [--workers 2]
"""
import argparse
import json
import os
import time

from ffcv.fields import IntField, RGBImageField
from ffcv.writer import DatasetWriter
from torchvision.datasets import ImageFolder


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("out")
    ap.add_argument("--max-res", type=int, default=340)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    ds = ImageFolder(f"{args.root}/train")
    writer = DatasetWriter(args.out, {
        "image": RGBImageField(write_mode="jpg", max_resolution=args.max_res, jpeg_quality=90),
        "label": IntField(),
    }, num_workers=args.workers)
    start = time.perf_counter()
    writer.from_indexed_dataset(ds)
    s = time.perf_counter() - start
    print(json.dumps({"peer": "ffcv-writer", "images": len(ds), "seconds": s,
                      "images_per_s": len(ds) / s, "bytes": os.path.getsize(args.out)}), flush=True)


if __name__ == "__main__":
    main()
