"""``ddl.dist.init(cost_model=...)``: ``auto`` follows a calibrated model's measured curves.

Usage: mpirun -np 2 python dist_cost_model.py MODEL MISSING

MODEL is a model file whose measured curves (layout 1 x 2) make ``ring`` the fastest at 4 and
64 KiB, ``mpi`` at 1 MiB and ``rhd`` at 16 MiB; MISSING names no file. ``init`` with MISSING
must raise ValueError naming it and leave ddl uninitialised; with MODEL, :func:`ddl.dist.resolve`
must give those picks, and ``auto`` at 1 MiB (``mpi``) must sum exactly. Prints
``dist_cost_model ok rank=R picks=...``.
"""

from __future__ import annotations

import sys

import torch

import ddl.dist as dd
from _job import run_job, say

EXPECTED = {4 << 10: "ring", 64 << 10: "ring", 1 << 20: "mpi", 16 << 20: "rhd"}


def main() -> None:
    model, missing = sys.argv[1], sys.argv[2]
    try:
        dd.init(timeout=30, cost_model=missing)
    except ValueError as e:
        assert missing in str(e), f"the error does not name the file: {e}"
    else:
        raise AssertionError(f"init(cost_model={missing!r}) did not raise")
    assert not dd.is_initialized(), "a failed init left ddl initialised"
    dd.init(timeout=30, cost_model=model)
    picks = {n: dd.resolve(n) for n in EXPECTED}
    assert picks == EXPECTED, f"auto picked {picks}, the model's fastest are {EXPECTED}"
    assert dd.resolve(1 << 20, "multicolor") == "multicolor:4:1048576"
    t = torch.arange((1 << 20) // 4, dtype=torch.float32) + dd.rank()
    want = 2 * torch.arange((1 << 20) // 4, dtype=torch.float32) + 1
    dd.allreduce_(t, average=False, algorithm="auto")
    assert torch.equal(t, want), "auto (mpi) at 1 MiB: wrong sum"
    say(f"dist_cost_model ok rank={dd.rank()} picks={sorted(picks.items())}")


if __name__ == "__main__":
    run_job(main)
