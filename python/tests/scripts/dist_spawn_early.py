"""``torch.multiprocessing.spawn`` of 2 processes that call ``ddl.dist.init()`` before
``init_process_group(rank=..., world_size=2)``: without a launcher ddl.dist forms a world of
one in each process while torch.distributed has two, and a ``ddl.Loader`` dealing over
ddl.dist's world would give each process the whole split. The loader refuses, naming both
worlds.

Usage: python dist_spawn_early.py PORT SHARDS (run alone, no launcher)
Prints ``dist_spawn_early ok rank=R`` per process on success.
"""

from __future__ import annotations

import os
import sys

import torch.distributed
import torch.multiprocessing

import ddl
import ddl.dist as dd
from _job import say

WORLD = 2


def worker(rank: int, port: str, shards: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dd.init(timeout=30)
    assert dd.size() == 1, dd.size()
    torch.distributed.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        ddl.Loader(shards, batch_size=4, image_size=16, workers=1)
    except ValueError as e:
        said = (f"ddl.dist's world has 1 rank(s) (this is rank 0) but torch.distributed's has "
                f"2 (this is rank {rank})")
        assert said in str(e), e
    else:
        raise AssertionError("the loader dealt over ddl.dist's world of one")
    # Positions given by hand are the caller's: no check.
    ddl.Loader(shards, batch_size=4, image_size=16, workers=1, rank=0, world_size=1).close()
    say(f"dist_spawn_early ok rank={rank}")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    torch.multiprocessing.spawn(worker, args=(sys.argv[1], sys.argv[2]), nprocs=WORLD)
