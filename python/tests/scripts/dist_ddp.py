"""Trains a tiny CNN a few steps on 2+ ranks (per-rank data, SGD with momentum) in several
ways and saves rank 0's final weights for the test to compare.

Usage: mpirun -np P python dist_ddp.py MODE OUT_DIR, with MODE

- ``torch``: torch.distributed over gloo (MASTER_ADDR / MASTER_PORT from the environment):
  ``ddp.pt`` DistributedDataParallel with its own allreduce, ``hook.pt`` DDP with
  ``ddl.dist.allreduce_hook`` (wrapped to count buckets), ``hook_direct.pt`` the same hook
  registered as users do, ``ddp_unused.pt`` DDP (find_unused_parameters) of a model with
  a parameter no rank uses and one only the last rank uses;
- ``ddl``: no torch.distributed at all: ``ddl.pt`` ``DistributedOptimizer`` +
  ``broadcast_parameters``, ``ddl_unused.pt`` the same for the model with unused parameters,
  ``local.pt`` the same start but no gradient averaging (must end elsewhere).

Every replica must end bitwise equal to rank 0's (``local`` must not). Prints
``dist_ddp ok mode=M rank=R buckets=NAME:N,...``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable, Dict

import torch
import torch.nn as nn
import torch.nn.functional as F

import ddl.dist as dd
from _job import run_job, say

STEPS = 5
BATCH = 8
#: Tiny buckets (about 1 KB) so that every model's gradients span several of them.
BUCKET_MB = 0.001


class Net(nn.Module):
    """Two convolutions and a linear head; ``unused``: adds a parameter no rank uses and one
    only the last rank uses (created without drawing from the RNG, so the other weights are
    those of the plain model)."""

    def __init__(self, seed: int, unused: bool = False, ranks: int = 1) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.conv1 = nn.Conv2d(3, 8, 3)
        self.conv2 = nn.Conv2d(8, 8, 3)
        self.fc = nn.Linear(8, 10)
        self.unused, self.ranks = unused, ranks
        if unused:
            self.never = nn.Parameter(torch.full((40,), 0.5))
            self.sometimes = nn.Parameter(torch.full((10,), 0.25))

    def forward(self, x: torch.Tensor, rank: int = 0) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = self.fc(x.mean(dim=(2, 3)))
        if self.unused and rank == self.ranks - 1:
            x = x + self.sometimes
        return x


def batches(rank: int):
    """This rank's STEPS batches: different on every rank, the same in every mode."""
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(STEPS):
        x = torch.randn(BATCH, 3, 12, 12, generator=g)
        yield x, torch.randint(0, 10, (BATCH,), generator=g)


def train(forward: Callable[[torch.Tensor, int], torch.Tensor], step: Callable[[], None],
          zero: Callable[[], None], rank: int) -> None:
    """STEPS steps of cross-entropy on this rank's batches."""
    for x, y in batches(rank):
        loss = F.cross_entropy(forward(x, rank), y)
        loss.backward()
        step()
        zero()


def sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def snapshot(model: nn.Module) -> Dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def flat(state: Dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([v.reshape(-1).float() for v in state.values()])


def run_torch(rank: int, size: int, out: Path) -> str:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", rank=rank, world_size=size)
    buckets = []
    for name, hook, unused in (("ddp", False, False), ("hook", True, False),
                               ("hook_direct", "direct", False), ("ddp_unused", False, True)):
        net = Net(seed=1000 + rank, unused=unused, ranks=size)
        model = DDP(net, bucket_cap_mb=BUCKET_MB, find_unused_parameters=unused)
        seen = set()
        if hook == "direct":
            # Registered as users do: DDP checks the hook's own annotations.
            model.register_comm_hook(None, dd.allreduce_hook)
        elif hook:
            def counting_hook(state, bucket):
                seen.add(bucket.index())
                return dd.allreduce_hook(state, bucket)
            model.register_comm_hook(None, counting_hook)
        opt = sgd(model)
        train(lambda x, r: model(x, r) if unused else model(x), opt.step, opt.zero_grad, rank)
        state = snapshot(net)
        replicas_agree(state, rank, name, lambda t: dist.broadcast(t, src=0))
        if rank == 0:
            torch.save(state, out / f"{name}.pt")
        if hook is True:
            assert len(seen) >= 2, f"DDP used {len(seen)} bucket(s); the test needs several"
            buckets.append(f"{name}:{len(seen)}")
    dist.destroy_process_group()
    return ",".join(buckets)


def run_ddl(rank: int, size: int, out: Path) -> str:
    import torch.distributed as dist

    buckets = []
    for name, unused in (("ddl", False), ("ddl_unused", True), ("local", False)):
        model = Net(seed=1000 + rank, unused=unused, ranks=size)
        dd.broadcast_parameters(model)
        if name == "local":
            opt = sgd(model)
        else:
            opt = dd.DistributedOptimizer(sgd(model), model, bucket_cap_mb=BUCKET_MB)
            assert len(opt._buckets) >= 3, f"{len(opt._buckets)} bucket(s); need several"
            buckets.append(f"{name}:{len(opt._buckets)}")
        train(lambda x, r: model(x, r) if unused else model(x), opt.step, opt.zero_grad, rank)
        state = snapshot(model)
        if name == "local":
            replicas_differ(state, rank)
        else:
            replicas_agree(state, rank, name, lambda t: dd.broadcast_(t, root=0))
        if rank == 0:
            torch.save(state, out / f"{name}.pt")
    assert not dist.is_initialized(), "ddl mode must not initialise torch.distributed"
    return ",".join(buckets)


def replicas_agree(state: Dict[str, torch.Tensor], rank: int, name: str,
                   bcast: Callable[[torch.Tensor], object]) -> None:
    mine = flat(state)
    root = mine.clone()
    bcast(root)
    assert torch.equal(mine, root), \
        f"{name}: rank {rank}'s weights differ from rank 0's by {(mine - root).abs().max():.3g}"


def replicas_differ(state: Dict[str, torch.Tensor], rank: int) -> None:
    mine = flat(state)
    root = mine.clone()
    dd.broadcast_(root, root=0)
    if rank != 0:
        assert not torch.equal(mine, root), "local: ranks trained on the same data?"


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    dd.init(timeout=60)
    rank, size = dd.rank(), dd.size()
    assert size >= 2, "run under mpirun -np 2 or more"
    if mode == "torch":
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        buckets = run_torch(rank, size, out)
    elif mode == "ddl":
        buckets = run_ddl(rank, size, out)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    dd.barrier()
    say(f"dist_ddp ok mode={mode} rank={rank} buckets={buckets}")


if __name__ == "__main__":
    run_job(main)
