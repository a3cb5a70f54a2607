"""FFCV's launch: ``torch.multiprocessing.spawn`` of 2 processes, each initialising
torch.distributed with ``init_process_group(rank=..., world_size=2)`` (no launcher variables
but MASTER_ADDR / MASTER_PORT), then ``ddl.dist.init()`` as docs/PYTORCH.md says: ddl.dist must
join torch.distributed's world (its rank, size and store), not form a world of its own.

Usage: python dist_spawn.py PORT (run alone, no launcher)
Prints ``dist_spawn ok rank=R size=S sum=X`` per process on success.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed
import torch.multiprocessing

import ddl.dist as dd
from _job import say

WORLD = 2


def worker(rank: int, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=WORLD)
    dd.init(timeout=30)
    assert (dd.rank(), dd.size()) == (rank, WORLD), (dd.rank(), dd.size())
    t = torch.full((1000,), float(rank + 1))
    dd.allreduce_(t, average=False)
    # The hook's average runs over both processes: torch.distributed agrees.
    ref = torch.full((1000,), float(rank + 1))
    torch.distributed.all_reduce(ref)
    assert torch.equal(t, ref), (t[:3], ref[:3])
    say(f"dist_spawn ok rank={dd.rank()} size={dd.size()} sum={t[0].item():g}")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    torch.multiprocessing.spawn(worker, args=(sys.argv[1],), nprocs=WORLD)
