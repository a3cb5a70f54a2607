"""Peer: FFCV's Loader on CPU over a .beton (RandomResizedCrop + flip + normalize, float32).

NormalizeImage stands before ToTensor: after ToTorchImage on CPU, FFCV's pipeline compiler loops
forever. The first pass includes numba compilation and is reported with "warmup": true.
Prints one JSON line per pass: {"peer": "ffcv", "images": N, "seconds": S, "images_per_s": R}.
Usage: python ffcv_load.py DATA.beton [--workers 2] [--batch 64] [--size 224] [--passes 4]
"""
import argparse
import json
import time

import numpy as np
from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
from ffcv.loader import Loader, OrderOption
from ffcv.transforms import NormalizeImage, RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage

MEAN = np.array([0.485, 0.456, 0.406]) * 255
STD = np.array([0.229, 0.224, 0.225]) * 255


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("beton")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--passes", type=int, default=4)
    args = ap.parse_args()
    loader = Loader(args.beton, batch_size=args.batch, num_workers=args.workers,
                    order=OrderOption.RANDOM, os_cache=True, drop_last=True, pipelines={
                        "image": [RandomResizedCropRGBImageDecoder((args.size, args.size)),
                                  RandomHorizontalFlip(),
                                  NormalizeImage(MEAN, STD, np.float32),
                                  ToTensor(), ToTorchImage()],
                        "label": [IntDecoder(), ToTensor(), Squeeze()],
                    })
    for p in range(args.passes):
        n, start = 0, time.perf_counter()
        for images, labels in loader:
            n += images.shape[0]
        s = time.perf_counter() - start
        print(json.dumps({"peer": "ffcv", "images": n, "seconds": s, "images_per_s": n / s,
                          "warmup": p == 0}), flush=True)


if __name__ == "__main__":
    main()
