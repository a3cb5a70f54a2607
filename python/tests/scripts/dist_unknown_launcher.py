"""An MPI launcher ddl does not know (Open MPI's per-rank variables hidden) and
torch.distributed initialised as a world of 1 rank in each process: ddl.dist.init() forms
MPI's world of every rank, which disagrees with torch.distributed's, and must raise
ddl.DistError naming both sizes (not train with one world while DDP runs another).

Usage: mpirun -np P python dist_unknown_launcher.py DIR
Prints ``dist_unknown_launcher ok rank=R`` per rank on success.
"""

from __future__ import annotations

import os
import sys

for name in [k for k in os.environ if k.startswith("OMPI_COMM_WORLD_")]:
    del os.environ[name]

import torch.distributed  # noqa: E402

import ddl  # noqa: E402
import ddl.dist as dd  # noqa: E402
from _job import say  # noqa: E402


def main() -> None:
    store = os.path.join(sys.argv[1], f"store-{os.getpid()}")
    torch.distributed.init_process_group("gloo", rank=0, world_size=1,
                                         init_method=f"file://{store}")
    try:
        dd.init(timeout=30)
    except ddl.DistError as e:
        assert "torch.distributed has 1 ranks" in str(e), e
        assert f"ddl.dist formed a world of {dd.size()} ranks" in str(e), e
        say(f"dist_unknown_launcher ok rank={dd.rank()}")
    else:
        raise AssertionError(f"init() formed {dd.size()} ranks beside torch.distributed's 1")


if __name__ == "__main__":
    main()
