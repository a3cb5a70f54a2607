"""Peer: torchvision ImageFolder + DataLoader, the loader most PyTorch users run.

Times full passes over ROOT/train with the standard training transform
(RandomResizedCrop(SIZE), RandomHorizontalFlip, ToTensor, Normalize) and prints one JSON line
per pass: {"peer": "torchvision", "images": N, "seconds": S, "images_per_s": R}.
Usage: python torchvision_loader.py ROOT [--workers 2] [--batch 64] [--size 224] [--passes 3]
"""
import argparse
import json
import time

import torch
from torchvision import datasets, transforms

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--passes", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    tf = transforms.Compose([
        transforms.RandomResizedCrop(args.size),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(MEAN, STD),
    ])
    ds = datasets.ImageFolder(f"{args.root}/train", tf)
    dl = torch.utils.data.DataLoader(ds, batch_size=args.batch, shuffle=True, drop_last=True,
                                     num_workers=args.workers, persistent_workers=True)
    for _ in range(args.passes):
        n, start = 0, time.perf_counter()
        for images, labels in dl:
            n += images.shape[0]
        s = time.perf_counter() - start
        print(json.dumps({"peer": "torchvision", "images": n, "seconds": s, "images_per_s": n / s}),
              flush=True)


if __name__ == "__main__":
    main()
