"""Ranks that disagree on a call: every rank must raise ddl.DistError naming what each rank
passed, at once (not a timeout on some ranks while others return), and the job then goes on.

Cases (the last rank is the odd one): its first allreduce picks ``rhd`` where the others pick
``ring``; broadcast_ of 8 floats where the others have 4; all_gather_ / reduce_scatter_ with
other row counts or other element counts (0 / 6 included).

Usage: mpirun -np P python dist_disagree.py (or under torchrun)
Prints ``dist_disagree ok rank=R cases=N`` on success.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import torch

import ddl
import ddl.dist as dd
from _job import run_job, say

#: init()'s timeout: an error that waits for it is too late.
TIMEOUT = 30


def expect(what: str, needles: Sequence[str], call: Callable[[], object]) -> None:
    """``call()`` raises DistError containing every one of ``needles`` well before the
    timeout."""
    start = time.monotonic()
    try:
        call()
    except ddl.DistError as e:
        assert all(n in str(e) for n in needles), f"rank {dd.rank()}: {what}: {e}"
    else:
        raise AssertionError(f"rank {dd.rank()}: {what}: no error")
    took = time.monotonic() - start
    assert took < TIMEOUT / 3, f"rank {dd.rank()}: {what}: took {took:.1f} s"


def main() -> None:
    dd.init(timeout=TIMEOUT)
    rank, p = dd.rank(), dd.size()
    last = p - 1
    odd = rank == last
    cases = 0

    t = torch.ones(100)
    choice = "rhd" if odd else "ring"
    expect("algorithms", ["chose different algorithms", f"rank 0 \"ring\"",
                          f"rank {last} \"rhd\""],
           lambda: dd.allreduce_(t, average=False, algorithm=choice))
    cases += 1
    dd.allreduce_(t, average=False, algorithm="ring")
    assert torch.equal(t, torch.full((100,), float(p))), "allreduce after the algorithm error"

    b = torch.full((8 if odd else 4,), float(rank))
    expect("broadcast_", ["rank 0 has 16 bytes", f"rank {last} has 32 bytes"],
           lambda: dd.broadcast_(b, root=0))
    cases += 1

    for name, op in (("all_gather_", dd.all_gather_), ("reduce_scatter_", dd.reduce_scatter_)):
        odd_rows = [3] + [2] * (p - 2) + [1]
        rows = odd_rows if odd else [2] * p
        g = torch.zeros(2 * p, 3)
        expect(f"{name} counts", [f"rank 0 passed {6 * p} elements in rows {[2] * p}",
                                  f"rank {last} passed {6 * p} elements in rows {odd_rows}"],
               lambda: op(g, rows))
        e = torch.zeros((6 if odd else 0, 1))
        expect(f"{name} sizes", ["rank 0 passed 0 elements",
                                 f"rank {last} passed 6 elements"], lambda: op(e))
        cases += 2

    # The job goes on: matching calls work.
    b = torch.full((4,), float(rank))
    dd.broadcast_(b, root=last)
    assert torch.equal(b, torch.full((4,), float(last))), b
    g = torch.full((p, 2), float(rank))
    dd.all_gather_(g)
    assert torch.equal(g, torch.arange(p, dtype=torch.float32).repeat_interleave(2).view(p, 2))
    say(f"dist_disagree ok rank={rank} cases={cases}")


if __name__ == "__main__":
    run_job(main)
