"""What the multi-rank test scripts share: one-write output lines, the dtypes ddl.dist
reduces, and running ``main`` so that a failure on one rank ends the whole job at once instead
of leaving the other ranks waiting for that rank."""

import sys
import traceback
from typing import Callable

import torch

import ddl.dist as dd

#: The dtypes ``ddl.dist.allreduce_`` reduces.
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def algorithms() -> list:
    """The algorithms of the running backend: every one of ``ddl.dist.ALGORITHMS``, less
    ``mpi`` (MPI_Allreduce itself) over the TCP backend (torchrun)."""
    return [a for a in dd.ALGORITHMS if a != "mpi" or dd.backend() == "mpi"]


def native(instead: str) -> str:
    """``"mpi"`` where the backend has MPI_Allreduce, else ``instead``."""
    return "mpi" if dd.backend() == "mpi" else instead


def say(line: str) -> None:
    """Writes ``line`` to stdout in one write, so mpirun does not interleave it with other
    ranks' lines."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def run_job(main: Callable[[], None]) -> None:
    """Runs ``main``; on any failure prints the traceback and aborts every rank (MPI_Abort)."""
    try:
        main()
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        if dd.is_initialized():
            dd.abort(1)
        raise


class RecordedIds:
    """The global ids of the records a ``ddl.Loader`` serves, batch by batch, in ``ids``:
    installed in place of the loader's Rust core, it passes every call on and copies the ids
    the core hands out with each batch (those a test compares across ranks)."""

    def __init__(self, loader: "object") -> None:
        import numpy as np

        self._np = np
        self._core = loader._core  # type: ignore[attr-defined]
        self.ids: list = []
        loader._core = self  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._core, name)

    def next(self, ticket: int) -> object:
        item = self._core.next(ticket)
        if item is not None:
            self.ids.extend(self._np.asarray(item[2]).tolist())
        return item
