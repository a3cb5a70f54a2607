"""What every multi-rank test script shares: run ``main`` and, if it fails on one rank, end
the whole job at once instead of leaving the other ranks waiting for that rank."""

import sys
import traceback
from typing import Callable

import ddl.dist as dd


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
