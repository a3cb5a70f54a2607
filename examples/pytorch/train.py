r"""Train a torchvision classifier on ImageNet, data-parallel: ddl.Loader feeds each rank its
batches from RAM-resident shards, ddl.dist averages the gradients over MPI (Horovod style, no
torch.distributed needed).

Try it on CPU with a small synthetic ImageNet (10 classes of real JPEGs), 2 ranks, in minutes:

    make build
    target/release/ddl-synth demo-out/imagenet --classes 10 --per-class 160 --val-per-class 30
    target/release/ddl-pack demo-out/imagenet -o demo-out/shards --shards 4 --max-short-side 96
    mpirun -np 2 .venv/bin/python examples/pytorch/train.py --data demo-out/shards \
        --arch resnet18 --image-size 64 --batch-size 32 --epochs 3 --warmup-epochs 0.5 \
        --lr 0.2 --workers 1 --checkpoint demo-out/ckpt.pt

(val top-1 about 95% after the third epoch, 1.5 minutes on 2 cores).

ImageNet on 8 nodes of 4 GPUs, one rank per GPU (global batch 2048, peak lr 0.8), checkpointed
every epoch:

    ddl-pack imagenet/ -o shards/ --shards 1024 --nodes 8
    mpirun -np 32 -npernode 4 python examples/pytorch/train.py --data shards/ --device cuda \
        --arch resnet50 --batch-size 64 --epochs 90 --checkpoint ckpt.pt

Add ``--resume ckpt.pt`` to continue a stopped run exactly where its checkpoint was written
(mid-epoch after ``--max-steps``). ``--head-parallel`` splits the classifier (``fc``) by class
over the ranks (ddl.nn.ShardedLinearCrossEntropy; the backbone stays data-parallel), as
``ddl-train --head-parallel`` does, e.g. for ImageNet-22k's 21,841 classes; each rank then
checkpoints to ``ckpt.pt.rankN`` (its slice of the head). As root, Open MPI's mpirun needs ``--allow-run-as-root``;
more ranks than cores need ``--oversubscribe``.

``--compile`` trains the model under ``torch.compile`` (evaluation stays eager): Inductor's
fused kernels, fed by the same loader and reduced by the same allreduce.

``--gpu-augment`` shows augmentation of your own on the training device: the loader hands over
uint8 batches (crop and flip done), and ``torchvision.transforms.v2`` jitters their colours and
normalises them there, on the whole batch at once (on the GPU with ``--device cuda``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from typing import Any, Callable, Dict, Tuple

import torch
import torch.nn.functional as F
import torchvision

import ddl
import ddl.dist as dd
import ddl.nn


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data", required=True, help="directory written by ddl-pack")
    p.add_argument("--arch", default="resnet50", help="a torchvision.models classifier name")
    p.add_argument("--epochs", type=int, default=90)
    p.add_argument("--batch-size", type=int, default=64, help="images per step of each rank")
    p.add_argument("--lr", type=float, default=0.1,
                   help="learning rate per 256 images (peak = lr x global batch / 256)")
    p.add_argument("--warmup-epochs", type=float, default=5.0,
                   help="linear warmup from 0, then cosine decay to 0")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=1e-4)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--workers", type=int, default=8, help="decode threads of each rank")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: the GPU of index local rank")
    p.add_argument("--amp", action="store_true", help="bfloat16 autocast")
    p.add_argument("--compile", action="store_true",
                   help="train the model under torch.compile (its first steps compile it)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads of each rank")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", help="write a checkpoint here after every epoch (rank 0)")
    p.add_argument("--resume", help="continue from this checkpoint")
    p.add_argument("--max-steps", type=int, default=0,
                   help="stop once this many steps (counted from the start of training) are "
                   "done, with a checkpoint; 0: no limit")
    p.add_argument("--log-every", type=int, default=100, help="steps between progress lines")
    p.add_argument("--allreduce", default="auto",
                   help="ddl's allreduce algorithm for the gradients (auto: tuned on the first "
                   "steps; a fixed one makes runs on 3+ ranks bitwise repeatable)")
    p.add_argument("--head-parallel", action="store_true",
                   help="split the classifier (fc) by class over the ranks; every rank "
                   "checkpoints to CHECKPOINT.rankN")
    p.add_argument("--gpu-augment", action="store_true",
                   help="uint8 batches from the loader, colour jitter and normalisation with "
                   "torchvision.transforms.v2 on the training device, batch by batch")
    return p.parse_args()


def learning_rate(step: int, steps_per_epoch: int, peak: float,
                  args: argparse.Namespace) -> float:
    """Linear warmup over ``--warmup-epochs``, then cosine decay to 0 at the last step."""
    warmup = int(args.warmup_epochs * steps_per_epoch)
    if step < warmup:
        return peak * (step + 1) / warmup
    total = args.epochs * steps_per_epoch
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.5 * peak * (1.0 + math.cos(math.pi * progress))


class Normalize:
    """uint8 NHWC batches (as the loader copies them to the GPU) to normalised float32 NCHW
    (a channels_last view: no copy beyond the conversion)."""

    def __init__(self, device: torch.device) -> None:
        self.mean = torch.tensor(ddl.IMAGENET_MEAN, device=device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(ddl.IMAGENET_STD, device=device).view(1, 3, 1, 1) * 255

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return (images.permute(0, 3, 1, 2).float() - self.mean) / self.std


class BatchAugment:
    """``--gpu-augment``: torchvision.transforms.v2 on a whole uint8 NHWC batch where it lies
    (the GPU with ``--device cuda``): a colour jitter drawn once per batch, then the conversion
    to normalised float32 NCHW. Evaluation gets the conversion alone."""

    def __init__(self, train: bool) -> None:
        from torchvision.transforms import v2

        steps = [v2.ColorJitter(brightness=0.2, contrast=0.2, saturation=0.2)] if train else []
        self.transform = v2.Compose([*steps, v2.ToDtype(torch.float32, scale=True),
                                     v2.Normalize(ddl.IMAGENET_MEAN, ddl.IMAGENET_STD)])

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return self.transform(images.permute(0, 3, 1, 2))


def average_buffers(model: torch.nn.Module) -> None:
    """Averages BatchNorm's running statistics over the ranks (each rank saw other images),
    so every rank evaluates, and rank 0 saves, the same model."""
    for b in model.buffers():
        if b.dtype in (torch.float32, torch.float16, torch.bfloat16):
            dd.allreduce_(b, average=True)


class Classifier:
    """The loss and predictions of the model's classifier: its own ``fc`` (data-parallel), or
    ``--head-parallel``'s head split over the ranks, which the model's features go to."""

    def __init__(self, model: torch.nn.Module, classes: int, device: torch.device,
                 split: bool) -> None:
        self.head: "ddl.nn.ShardedLinearCrossEntropy | None" = None
        if split:
            fc = getattr(model, "fc", None)
            if not isinstance(fc, torch.nn.Linear):
                raise SystemExit("--head-parallel: the model has no linear `fc` classifier")
            self.head = ddl.nn.ShardedLinearCrossEntropy(fc.in_features, classes,
                                                         device=device)
            model.fc = torch.nn.Identity()

    def parameters(self) -> list:
        """The head's slice (updated without averaging: its gradient is whole already)."""
        return list(self.head.parameters()) if self.head is not None else []

    def loss(self, out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.head is not None:
            return self.head(out, labels)
        return F.cross_entropy(out, labels)

    def counts(self, out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Top-1 hits, top-5 hits and the loss summed over the batch."""
        if self.head is not None:
            rank = self.head.target_rank(out, labels)
            loss = self.head(out, labels) * len(labels)
            return torch.stack([(rank < 1).sum(), (rank < 5).sum(), loss]).float()
        logits = out.float()
        top = logits.topk(min(5, logits.shape[1]), dim=1).indices
        hit = top == labels[:, None]
        return torch.stack([hit[:, 0].sum(), hit.any(dim=1).sum(),
                            F.cross_entropy(logits, labels, reduction="sum")]).float()

    def state_dict(self) -> Dict[str, Any]:
        return self.head.state_dict() if self.head is not None else {}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if self.head is not None:
            self.head.load_state_dict(state)


def checkpoint_path(path: str, args: argparse.Namespace) -> str:
    """Where this rank checkpoints: PATH, or PATH.rankN under --head-parallel."""
    return f"{path}.rank{dd.rank()}" if args.head_parallel else path


def save_checkpoint(path: str, model: torch.nn.Module, classifier: Classifier,
                    optimizer: dd.DistributedOptimizer, epoch: int, loader: ddl.Loader,
                    args: argparse.Namespace) -> None:
    """Writes to a temporary file, then renames it: a crash never leaves half a file."""
    state = {"model": model.state_dict(), "head": classifier.state_dict(),
             "optimizer": optimizer.state_dict(), "epoch": epoch,
             "loader": loader.state_dict(), "args": vars(args)}
    tmp = f"{path}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def train_epoch(model: torch.nn.Module, classifier: Classifier, loader: ddl.Loader,
                optimizer: dd.DistributedOptimizer, epoch: int, peak_lr: float,
                args: argparse.Namespace,
                prepare: Callable[[torch.Tensor], torch.Tensor]) -> Tuple[float, int, float]:
    """One epoch (the rest of it after a mid-epoch resume); returns this rank's mean loss, the
    steps run and the seconds taken. Stops early at ``--max-steps``."""
    model.train()
    steps = len(loader)
    first = loader.state_dict()["step"]
    loss_sum = torch.zeros((), device=next(model.parameters()).device)
    done = 0
    start = time.perf_counter()
    for step, (images, labels) in enumerate(loader, first):
        global_step = epoch * steps + step
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(global_step, steps, peak_lr, args)
        with torch.autocast(images.device.type, dtype=torch.bfloat16, enabled=args.amp):
            logits = model(prepare(images))
            if isinstance(logits, tuple):  # GoogLeNet, Inception v3: (logits, auxiliary logits)
                logits = logits[0]
            loss = classifier.loss(logits, labels)
        loss.backward()  # gradients are averaged over the ranks while backward runs
        optimizer.step()
        optimizer.zero_grad()
        loss_sum += loss.detach()
        done += 1
        if args.log_every and (step + 1) % args.log_every == 0 and dd.rank() == 0:
            print(f"epoch {epoch + 1} step {step + 1}/{steps}: loss {loss.item():.4f} "
                  f"lr {optimizer.param_groups[0]['lr']:.4f}", flush=True)
        if args.max_steps and global_step + 1 >= args.max_steps:
            break
    return loss_sum.item() / max(done, 1), done, time.perf_counter() - start


@torch.no_grad()
def evaluate(model: torch.nn.Module, classifier: Classifier, loader: ddl.Loader,
             prepare: Callable[[torch.Tensor], torch.Tensor],
             args: argparse.Namespace) -> Dict[str, float]:
    """Top-1 and top-5 accuracy over the whole val split (each rank scores its share of the
    records, then the counts are summed over the ranks). Under --head-parallel every rank
    scores its classes for every rank's images: the ranks take turns until all are done."""
    model.eval()
    device = next(model.parameters()).device
    counts = torch.zeros(4, dtype=torch.float32, device=device)  # top1, top5, images, loss
    batches = iter(loader)
    while True:
        batch = next(batches, None)
        if classifier.head is not None:
            more = torch.tensor([float(batch is not None)])
            if dd.allreduce_(more, average=False).item() == 0:
                break
            if batch is None:  # this rank is done, the others are not: take part, empty
                empty = torch.zeros(0, classifier.head.in_features, device=device)
                classifier.counts(empty, torch.zeros(0, dtype=torch.long, device=device))
                continue
        elif batch is None:
            break
        images, labels = batch
        with torch.autocast(images.device.type, dtype=torch.bfloat16, enabled=args.amp):
            out = model(prepare(images)).float()
        c = classifier.counts(out, labels)
        counts[0] += c[0]
        counts[1] += c[1]
        counts[2] += len(labels)
        counts[3] += c[2]
    dd.allreduce_(counts, average=False)
    top1, top5, n, loss = counts.tolist()
    return {"val_top1": top1 / max(n, 1), "val_top5": top5 / max(n, 1),
            "val_loss": loss / max(n, 1), "val_images": int(n)}


def main() -> None:
    args = parse_args()
    dd.init()  # under mpirun / srun, torchrun (TCP, no MPI), or alone as one rank
    rank, world = dd.rank(), dd.size()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    if args.device == "cuda":
        device = torch.device(f"cuda:{dd.local_rank()}")
        torch.cuda.set_device(device)
        # Raw pixels to the GPU (4x fewer bytes than float32), normalised there.
        loader_kw: Dict[str, Any] = {"device": device, "dtype": "uint8", "layout": "NHWC"}
        prepare: Callable[[torch.Tensor], torch.Tensor] = Normalize(device)
    else:
        device = torch.device("cpu")
        loader_kw = {"dtype": "float32", "layout": "NCHW"}
        prepare = torch.nn.Identity()  # the loader's float32 NCHW is normalised already
    evaluate_prepare = prepare
    if args.gpu_augment:
        loader_kw.update(dtype="uint8", layout="NHWC")
        prepare, evaluate_prepare = BatchAugment(train=True), BatchAugment(train=False)
    train_loader = ddl.Loader(args.data, split="train", batch_size=args.batch_size,
                              image_size=args.image_size, workers=args.workers, seed=args.seed,
                              **loader_kw)
    val_loader = ddl.Loader(args.data, split="val", batch_size=args.batch_size,
                            image_size=args.image_size, workers=args.workers, **loader_kw)

    model = torchvision.models.get_model(args.arch, weights=None,
                                         num_classes=train_loader.num_classes).to(device)
    classifier = Classifier(model, train_loader.num_classes, device, args.head_parallel)
    if args.device == "cuda":
        model = model.to(memory_format=torch.channels_last)
    peak_lr = args.lr * args.batch_size * world / 256
    # The backbone's gradients are averaged over the ranks; a split head's slice is not.
    optimizer = dd.DistributedOptimizer(
        torch.optim.SGD(list(model.parameters()) + classifier.parameters(), lr=peak_lr,
                        momentum=args.momentum, weight_decay=args.weight_decay), model,
        algorithm=args.allreduce)

    if rank == 0:
        print(f"{args.arch}: {train_loader.num_classes} classes, {world} ranks x "
              f"{args.batch_size} images, {len(train_loader)} steps per epoch, "
              f"peak lr {peak_lr:.4g}, {args.device}", flush=True)

    start_epoch = 0
    if args.resume:
        ckpt = torch.load(checkpoint_path(args.resume, args), map_location=device)
        model.load_state_dict(ckpt["model"])
        classifier.load_state_dict(ckpt["head"])
        optimizer.load_state_dict(ckpt["optimizer"])
        train_loader.load_state_dict(ckpt["loader"])  # mid-epoch: the batches not yet seen
        start_epoch = ckpt["epoch"]
        if rank == 0:
            state = ckpt["loader"]
            step = state["step"] if state["epoch"] == start_epoch else 0
            print(f"resumed from {args.resume}: epoch {start_epoch + 1}, "
                  f"step {step}/{len(train_loader)}", flush=True)
    dd.broadcast_parameters(model)  # every rank starts from rank 0's weights

    trained = torch.compile(model) if args.compile else model
    result: Dict[str, Any] = {}
    for epoch in range(start_epoch, args.epochs):
        train_loader.set_epoch(epoch)
        first = train_loader.state_dict()["step"]  # > 0 when resumed mid-epoch
        if args.max_steps and epoch * len(train_loader) + first >= args.max_steps:
            break
        loss, steps, seconds = train_epoch(trained, classifier, train_loader, optimizer, epoch,
                                           peak_lr, args, prepare)
        loss = dd.allreduce_(torch.tensor([loss]), average=True).item()
        images = steps * args.batch_size * world
        result = {"epoch": epoch + 1, "train_loss": loss, "train_images": images,
                  "images_per_s": images / seconds}
        average_buffers(model)
        stopped = first + steps < len(train_loader)  # --max-steps ended the epoch early
        if not stopped:
            result.update(evaluate(model, classifier, val_loader, evaluate_prepare, args))
        if (rank == 0 or args.head_parallel) and args.checkpoint:
            # Stopped mid-epoch: resume in this epoch, at the loader's next batch.
            save_checkpoint(checkpoint_path(args.checkpoint, args), model, classifier,
                            optimizer, epoch if stopped else epoch + 1, train_loader, args)
        if rank == 0 and stopped:
            print(f"stopped in epoch {epoch + 1} after step {first + steps}/{len(train_loader)} "
                  f"(--max-steps {args.max_steps})", flush=True)
        elif rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}: train loss {loss:.4f} ({steps} steps, "
                  f"{images} images, {result['images_per_s']:.0f} img/s), val top-1 "
                  f"{100 * result['val_top1']:.2f}% top-5 {100 * result['val_top5']:.2f}% "
                  f"({result['val_images']} images)", flush=True)
        if args.max_steps and epoch * len(train_loader) + first + steps >= args.max_steps:
            break
    if rank == 0:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
