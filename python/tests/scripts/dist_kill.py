"""One rank dies in the middle of a loop of allreduces; the others go on.

Usage: mpirun -np P python dist_kill.py ALGORITHM VICTIM [TIMEOUT]

Every rank runs allreduces of ALGORITHM; at iteration 10 rank VICTIM leaves with
``os._exit(3)`` (no MPI_Finalize, no Python clean-up). A survivor that gets ddl's
:class:`ddl.DistError` prints ``survivor rank R: DistError: MESSAGE`` and exits with code 2;
one that finishes its loop (it must not) prints ``survivor rank R finished``.
"""

from __future__ import annotations

import os
import sys

import torch

import ddl
import ddl.dist as dd
from _job import say

ITERATIONS = 200
DEATH = 10


def main() -> None:
    algorithm, victim = sys.argv[1], int(sys.argv[2])
    timeout = float(sys.argv[3]) if len(sys.argv) > 3 else 5.0
    dd.init(timeout=timeout)
    rank = dd.rank()
    t = torch.ones(50_000)
    try:
        for i in range(ITERATIONS):
            if rank == victim and i == DEATH:
                say(f"victim rank {rank} exits at iteration {i}")
                os._exit(3)
            dd.allreduce_(t, average=True, algorithm=algorithm)
    except ddl.DistError as e:
        say(f"survivor rank {rank}: DistError: {e}")
        os._exit(2)
    say(f"survivor rank {rank} finished")


if __name__ == "__main__":
    main()
