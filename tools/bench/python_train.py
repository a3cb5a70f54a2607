"""A PyTorch data-parallel training loop, fed and reduced by ddl or by the usual PyTorch pieces,
one process per rank under mpirun (a torchvision --arch, resnet18 by default, SGD with momentum,
cross-entropy, one intra-op thread per rank), on the CPU or on one GPU per rank.

--loader ddl          ddl.Loader over SHARDS (train split, RandomResizedCrop SIZE + flip),
                      --workers decode threads per rank; --dtype float32 (NCHW, normalised by
                      the loader) or uint8 (NHWC, normalised on the device, as
                      examples/pytorch/train.py does); with --device cuda the loader copies the
                      batches to the GPU itself (ddl.Loader(device=...))
--loader torchvision  ImageFolder(TREE/train) with RandomResizedCrop(SIZE), RandomHorizontalFlip,
                      ToTensor, Normalize; DistributedSampler; DataLoader(--workers processes,
                      persistent, drop_last; pin_memory with --device cuda, batches copied with
                      non_blocking=True)
--loader fixed        one batch made once on the device and used at every step (no loader)
--comm ddl            ddl.dist: broadcast_parameters + DistributedOptimizer (no torch.distributed;
                      --comm-order fifo|priority, --bucket-mb)
--comm ddl-ddp        DistributedDataParallel (gloo process group for its bookkeeping) with
                      ddl.dist.allreduce_hook as its communication hook
--comm gloo           DistributedDataParallel over torch.distributed gloo (MASTER_ADDR=127.0.0.1)
--comm none           no gradient averaging (each rank trains alone: the compute and loader only)
--device cuda         the GPU of the rank's local rank, channels_last (and --amp: bf16 autocast);
                      the GPU is synchronised at the end of every step, so that data_s is time
                      the GPU had nothing to do
--compile             torch.compile the model (default mode; compiled in the warmup steps)
--feed-batches N      before training, WARMUP then N timed batches that are only read on the
                      device (normalised and summed): the loader alone (feed_images_per_s)

Runs WARMUP steps, then times STEPS steps. Every rank prints one JSON line: images and seconds
of its timed steps, and the time it spent waiting for batches (data_s, data_wait_frac), in
forward + backward (fwd_bwd_s: for DDP that includes its overlapped reductions) and inside
optimizer.step (step_s: for --comm ddl that includes waiting for the last reductions).
Total images/s of the job = sum of images / slowest rank's seconds (tools/bench/python.sh).
Usage: mpirun -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29511 python python_train.py
           --loader ddl --data bench-out/shards-80 --comm ddl [--steps 25] [--warmup 5]
           [--batch 32] [--size 64] [--workers 2] [--algorithm auto] [--device cuda --amp]
"""
import argparse
import json
import os
import time

import torch
import torch.nn.functional as F
import torchvision

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def env_rank():
    return (int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")),
            int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))


def batches(args, rank, size, num_classes, device):
    """An endless stream of (images, labels) on `device`, epoch after epoch."""
    if args.loader == "fixed":
        g = torch.Generator().manual_seed(rank)
        x = torch.randn(args.batch, 3, args.size, args.size, generator=g).to(device)
        y = torch.randint(0, num_classes, (args.batch,), generator=g).to(device)
        while True:
            yield x, y
    elif args.loader == "ddl":
        import ddl
        loader = ddl.Loader(args.data, split="train", batch_size=args.batch,
                            image_size=args.size, workers=args.workers, seed=0, device=device,
                            dtype=args.dtype, layout="NHWC" if args.dtype == "uint8" else "NCHW")
        epoch = 0
        while True:
            loader.set_epoch(epoch)
            yield from loader
            epoch += 1
    else:
        from torchvision import datasets, transforms
        tf = transforms.Compose([
            transforms.RandomResizedCrop(args.size),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(MEAN, STD),
        ])
        ds = datasets.ImageFolder(os.path.join(args.data, "train"), tf)
        sampler = torch.utils.data.distributed.DistributedSampler(
            ds, num_replicas=size, rank=rank, shuffle=True, seed=0, drop_last=True)
        dl = torch.utils.data.DataLoader(ds, batch_size=args.batch, sampler=sampler,
                                         num_workers=args.workers, drop_last=True,
                                         persistent_workers=True,
                                         pin_memory=device.type == "cuda")
        epoch = 0
        while True:
            sampler.set_epoch(epoch)
            for x, y in dl:
                yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            epoch += 1


def model_input(args, device):
    """The function that turns a batch's images into the model's normalised float32 NCHW."""
    fmt = torch.channels_last if device.type == "cuda" else torch.contiguous_format
    if args.loader != "ddl" or args.dtype == "float32":
        return lambda x: x.contiguous(memory_format=fmt)
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255
    return lambda x: ((x.permute(0, 3, 1, 2).float() - mean) / std).contiguous(memory_format=fmt)


def feed(it, prepare, args, sync):
    """images/s of the loader alone: WARMUP, then --feed-batches batches read on the device."""
    total, images, start = None, 0, time.perf_counter()
    for i in range(args.warmup + args.feed_batches):
        if i == args.warmup:
            sync()
            images, start = 0, time.perf_counter()
        x, _y = next(it)
        s = prepare(x).sum()
        total = s if total is None else total + s
        sync()
        images += x.shape[0]
    return {"feed_images_per_s": images / (time.perf_counter() - start),
            "feed_finite": bool(torch.isfinite(total))}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loader", choices=("ddl", "torchvision", "fixed"), required=True)
    ap.add_argument("--comm", choices=("ddl", "ddl-ddp", "gloo", "none"), required=True)
    ap.add_argument("--data", default="")
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--algorithm", default="auto")
    ap.add_argument("--comm-order", choices=("fifo", "priority"), default="fifo")
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--arch", default="resnet18")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--dtype", choices=("float32", "uint8"), default="float32")
    ap.add_argument("--amp", action="store_true")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--feed-batches", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rank, size = env_rank()
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    if args.comm in ("ddl", "ddl-ddp"):
        import ddl.dist as dd
        dd.init()
        rank, size = dd.rank(), dd.size()
    if args.comm in ("gloo", "ddl-ddp"):
        import torch.distributed as tdist
        tdist.init_process_group("gloo", rank=rank, world_size=size)

    torch.manual_seed(0)
    model = torchvision.models.get_model(args.arch, num_classes=args.classes).to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    sgd = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-5)
    opt = sgd
    if args.comm == "ddl":
        dd.broadcast_parameters(model)
        opt = dd.DistributedOptimizer(sgd, model, algorithm=args.algorithm,
                                      bucket_cap_mb=args.bucket_mb, comm_order=args.comm_order)
    elif args.comm in ("gloo", "ddl-ddp"):
        model = torch.nn.parallel.DistributedDataParallel(model)
        if args.comm == "ddl-ddp":
            model.register_comm_hook(args.algorithm, dd.allreduce_hook)
    model.train()
    forward = torch.compile(model) if args.compile else model

    it = batches(args, rank, size, args.classes, device)
    prepare = model_input(args, device)
    fed = feed(it, prepare, args, sync) if args.feed_batches else {}
    data_s = step_s = fb_s = 0.0
    images = 0
    start = None
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            sync()
            start = time.perf_counter()
            data_s = step_s = fb_s = 0.0
            images = 0
        t0 = time.perf_counter()
        x, y = next(it)
        t1 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp):
            loss = F.cross_entropy(forward(prepare(x)), y)
        opt.zero_grad()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        sync()
        t3 = time.perf_counter()
        data_s += t1 - t0
        step_s += t3 - t2
        fb_s += t2 - t1
        images += x.shape[0]
        del x, y
    seconds = time.perf_counter() - start
    print(json.dumps({
        "peer": f"{args.loader}+{args.comm}", "loader": args.loader, "comm": args.comm,
        "rank": rank, "ranks": size, "workers": args.workers, "batch": args.batch,
        "size": args.size, "steps": args.steps, "images": images, "seconds": seconds,
        "images_per_s": images / seconds, "data_s": data_s, "fwd_bwd_s": fb_s, "step_s": step_s,
        "data_wait_frac": data_s / seconds, "loss": loss.item(), "device": str(device),
        "arch": args.arch, "dtype": args.dtype, "compiled": args.compile, **fed,
    }), flush=True)
    if args.comm in ("gloo", "ddl-ddp"):
        tdist.destroy_process_group()


if __name__ == "__main__":
    main()
