"""The checks of several scripts in one job: importing torch is most of a short job's CPU,
so the errors after which the job goes on by design (dist_disagree, dist_mismatch), the
collectives (dist_allreduce) and the sharded head (nn_sharded) share one launch per world
size and launcher (figures: BENCHMARKS.md). dist_disagree comes first: the ranks compare their
algorithms at the first allreduce only.

Usage: mpirun -np P python dist_suite.py (or torchrun --nproc_per_node P dist_suite.py)
Prints each script's own ``... ok`` line, in that order; the first failure ends the job.
"""

from __future__ import annotations

import dist_allreduce
import dist_disagree
import dist_mismatch
import nn_sharded
from _job import run_job


def main() -> None:
    for script in (dist_disagree, dist_allreduce, dist_mismatch, nn_sharded):
        script.main()


if __name__ == "__main__":
    run_job(main)
