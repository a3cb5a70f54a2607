"""``ddl.dist.init()`` under torchrun: the TCP backend, with the launcher's positions, and a
``ddl.Loader`` made before ``init()`` at the same rank as one made after it.

Usage: torchrun --nproc_per_node P dist_torchrun.py SHARDS
Prints ``dist_torchrun ok rank=R size=P local=L/N backend=tcp`` on success; failures are
assertions (non-zero exit).
"""

from __future__ import annotations

import os
import sys

import torch

import ddl
import ddl.dist as dd
from _job import run_job, say


def position(loader: ddl.Loader) -> tuple:
    p = loader.placement
    return p.rank, p.world_size, p.local_rank, p.local_size, p.node, p.nodes


def main() -> None:
    shards = sys.argv[1]
    env = {k: int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    before = ddl.Loader(shards, split="train", batch_size=4, image_size=32, workers=1)
    dd.init(timeout=30)
    after = ddl.Loader(shards, split="train", batch_size=4, image_size=32, workers=1)
    assert dd.backend() == "tcp", dd.backend()
    mine = (dd.rank(), dd.size(), dd.local_rank(), dd.local_size(), dd.node(), dd.nodes())
    assert mine == (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"],
                    env["LOCAL_WORLD_SIZE"], 0, 1), (mine, env)
    assert position(before) == position(after) == mine, (position(before), position(after))
    assert before.placement.source == "torchrun" and after.placement.source == "ddl.dist"
    try:
        dd.allreduce_(torch.ones(3), algorithm="mpi")
    except ValueError as e:
        assert "MPI" in str(e), e
    else:
        raise AssertionError("algorithm mpi ran over the TCP backend")
    t = torch.full((5,), float(dd.rank() + 1))
    dd.allreduce_(t, average=False)
    assert torch.equal(t, torch.full((5,), float(sum(range(1, dd.size() + 1))))), t
    dd.barrier()
    say(f"dist_torchrun ok rank={dd.rank()} size={dd.size()} "
        f"local={dd.local_rank()}/{dd.local_size()} backend={dd.backend()}")


if __name__ == "__main__":
    run_job(main)
