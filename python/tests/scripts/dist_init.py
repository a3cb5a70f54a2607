"""``ddl.dist.init()`` three ways. Usage: python dist_init.py MODE, where MODE is

- ``alone``: run without mpirun: a one-rank job whose reductions are the identity;
- ``mpirun``: run under mpirun: ranks agree with the launcher's, sums are exact;
- ``mpi4py``: run under mpirun with mpi4py imported (and MPI initialised) first: ddl joins it,
  ranks and sums agree with mpi4py's COMM_WORLD, and the interpreter exits cleanly.

In ``alone`` and ``mpirun`` mode mpi4py is imported without initialising MPI, to check that
``import ddl`` does not start MPI and ``init()`` does. Prints
``dist_init ok mode=M rank=R size=P`` on success; failures are assertions (non-zero exit).
"""

from __future__ import annotations

import os
import sys

MODE = sys.argv[1]
assert MODE in ("alone", "mpirun", "mpi4py"), f"unknown mode {MODE!r}"

if MODE == "mpi4py":
    from mpi4py import MPI  # initialises MPI (MPI_THREAD_MULTIPLE)

    assert MPI.Is_initialized(), "mpi4py did not initialise MPI"
else:
    import mpi4py

    mpi4py.rc.initialize = False
    from mpi4py import MPI

import torch  # noqa: E402

import ddl  # noqa: E402
import ddl.dist as dd  # noqa: E402
from _job import DTYPES, run_job, say  # noqa: E402

ALGORITHMS = dd.ALGORITHMS


def launcher_world() -> tuple:
    """(rank, size) as mpirun announced them; (0, 1) when run alone."""
    return (int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")),
            int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))


def values(rank: int, n: int) -> torch.Tensor:
    """Small integers, distinct per rank: every sum is exact in each dtype."""
    return ((torch.arange(n) * 7 + rank * 5) % 23 - 11).to(torch.float32)


def check_sums(rank: int, size: int) -> None:
    for algorithm in ALGORITHMS:
        for dtype in DTYPES:
            for average in (False, True):
                t = values(rank, 513).to(dtype)
                dd.allreduce_(t, average=average, algorithm=algorithm)
                want = sum(values(r, 513) for r in range(size))
                if average:
                    want = want / size
                assert torch.equal(t, want.to(dtype)), \
                    f"rank {rank}: allreduce_ {algorithm} {dtype} average={average}: wrong sum"


def main() -> None:
    if MODE != "mpi4py":
        assert not MPI.Is_initialized(), "import ddl / ddl.dist initialised MPI"
        assert not dd.is_initialized(), "ddl.dist claims to be initialised before init()"
    dd.init()
    dd.init()  # a second call returns at once
    assert MPI.Is_initialized(), "ddl.dist.init() did not initialise MPI"
    assert dd.is_initialized()
    rank, size = dd.rank(), dd.size()
    want_rank, want_size = launcher_world()
    assert (rank, size) == (want_rank, want_size), \
        f"ddl says rank {rank} of {size}, the launcher {want_rank} of {want_size}"
    assert 0 <= dd.local_rank() < dd.local_size() <= size
    assert 0 <= dd.node() < dd.nodes() <= size
    if MODE == "alone":
        assert (dd.local_rank(), dd.local_size(), dd.node(), dd.nodes()) == (0, 1, 0, 1)
    check_sums(rank, size)
    if MODE == "mpi4py":
        comm = MPI.COMM_WORLD
        assert (comm.Get_rank(), comm.Get_size()) == (rank, size), \
            f"mpi4py says rank {comm.Get_rank()} of {comm.Get_size()}, ddl {rank} of {size}"
        # Interleave both libraries' traffic: ddl works on its own duplicate communicator.
        for algorithm in ALGORITHMS:
            mine = values(rank, 1000)
            theirs = torch.from_numpy(comm.allreduce(mine.numpy()))
            fut = dd.allreduce_async_(mine, average=False, algorithm=algorithm)
            comm.Barrier()
            fut.wait()
            assert torch.equal(mine, theirs), \
                f"rank {rank}: {algorithm} sum differs from mpi4py's allreduce"
        token = comm.bcast(f"token-{rank}", root=size - 1)
        assert token == f"token-{size - 1}"
    dd.barrier()
    say(f"dist_init ok mode={MODE} rank={rank} size={size}")


if __name__ == "__main__":
    run_job(main)
