"""The launcher-binding warning of ``ddl.Loader``. Usage: python dist_binding.py SHARDS.

Initialises ``ddl.dist``, builds two loaders of 2 decode workers each over SHARDS and prints
``dist_binding ok rank=R warnings=K cpus=C`` followed by each warning's text on a line of its
own (``warning: ...``): K is how many ``RuntimeWarning`` s the two loaders raised together
(at most one per process, on local rank 0), C how many CPUs this rank may run on.
"""

from __future__ import annotations

import os
import sys
import warnings

import ddl
import ddl.dist as dd
from _job import run_job, say


def main() -> None:
    dd.init()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for split in ("train", "val"):
            ddl.Loader(sys.argv[1], split=split, batch_size=4, image_size=32, workers=2)
    raised = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    lines = [f"dist_binding ok rank={dd.rank()} warnings={len(raised)} "
             f"cpus={len(os.sched_getaffinity(0))}"]
    say("\n".join(lines + [f"warning: {w}" for w in raised]))


if __name__ == "__main__":
    run_job(main)
