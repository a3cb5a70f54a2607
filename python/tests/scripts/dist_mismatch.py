"""Ranks that pass different tensors to ddl.dist.allreduce_: every algorithm must raise
ddl.DistError on every rank, naming the odd rank's element count or dtype, before any tensor
changes; the job then goes on (a call with matching tensors sums).

Usage: mpirun -np P python dist_mismatch.py
Prints ``dist_mismatch ok rank=R cases=N`` on success.
"""

from __future__ import annotations

import torch

import ddl
import ddl.dist as dd
from _job import algorithms, run_job, say


def main() -> None:
    dd.init(timeout=30)
    rank, p = dd.rank(), dd.size()
    last = p - 1
    odd = rank == last
    # (this rank's tensor, what every rank's error must say about the last rank)
    cases = [
        (torch.ones(1000 if odd else 10), f"rank {last} passed 1000 f32"),
        (torch.ones(300_000 if odd else 1000), f"rank {last} passed 300000 f32"),
        (torch.ones(300, dtype=torch.float16 if odd else torch.float32),
         f"rank {last} passed 300 f16"),
        (torch.ones(7 if odd else 0), f"rank {last} passed 7 f32"),
    ]
    checked = 0
    for algorithm in algorithms():
        for tensor, needle in cases:
            keep = tensor.clone()
            case = f"rank {rank}: {algorithm}, {needle}"
            try:
                dd.allreduce_(tensor, average=False, algorithm=algorithm)
            except ddl.DistError as e:
                assert needle in str(e), f"{case}: {e}"
            else:
                raise AssertionError(f"{case}: no error")
            assert torch.equal(tensor, keep), f"{case}: the tensor changed"
            checked += 1
        ones = torch.ones(100)
        dd.allreduce_(ones, average=False, algorithm=algorithm)
        assert torch.equal(ones, torch.full((100,), float(p))), f"{algorithm}: after the errors"
    say(f"dist_mismatch ok rank={rank} cases={checked}")


if __name__ == "__main__":
    run_job(main)
