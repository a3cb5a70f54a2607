"""Two misuses of a ``ddl.Loader`` that exchanges records between nodes (``exchange=0.5``, one
rank per node), each refused with an error that says what happened, where one used to hang:

1. rank 0 forks while another of its threads waits in the loader, at the first epoch's start,
   for node 1's records (holding the loader's state): the child's loader raises RuntimeError at
   its first use instead of blocking forever. Node 1 starts its epoch only once rank 0 has
   seen that (a key in torchrun's store); both then run the epoch.
2. the ranks start different epochs: each raises ValueError naming every rank's epoch (it used
   to wait for the other rank until the timeout, then blame it).

Usage: loader_misuse.py SHARDS (under torchrun, one rank per node)
Prints ``loader_misuse ok rank=R``.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading

import torch.distributed as td

import ddl
import ddl.dist as dd
from _job import run_job, say

#: Forks rank 0 may make before its thread holds the loader's state (it takes it at once).
FORKS = 2000
#: Longest a forked child may take to exit (it needs milliseconds): a hang guard.
HANG = 60
#: The key in torchrun's store by which rank 0 lets node 1 start its epoch.
FORKED = "ddl-test/forked"


def forked_child_refuses(loader: ddl.Loader) -> bool:
    """Forks; whether the child found the loader's state locked (its RuntimeError saying so).
    A child that finds it free uses it and exits 0; one that hangs fails the job."""
    pid = os.fork()
    if pid == 0:
        try:
            loader.stats()
        except RuntimeError as e:
            os._exit(3 if "forked while another thread" in str(e) else 4)
        os._exit(0)
    done = os.pidfd_open(pid)
    ended, _, _ = select.select([done], [], [], HANG)
    os.close(done)
    if not ended:
        os.kill(pid, signal.SIGKILL)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    assert ended, f"the forked child still waited on the loader after {HANG} s"
    assert code in (0, 3), f"the forked child exited with {code}"
    return code == 3


def main() -> None:
    dd.init(timeout=60)
    rank = dd.rank()
    store = td.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                        is_master=False)
    loader = ddl.Loader(sys.argv[1], batch_size=8, image_size=16, workers=1, seed=3,
                        exchange=0.5)
    steps = len(loader)
    if rank == 0:
        served: list = []
        first = threading.Thread(target=lambda: served.extend(y for _, y in loader))
        first.start()
        try:
            assert any(forked_child_refuses(loader) for _ in range(FORKS)), \
                f"no child of {FORKS} found the loader's state locked"
        except BaseException:
            store.set(FORKED, "failed")  # node 1 stops too
            raise
        store.set(FORKED, "ok")
        first.join()
        assert len(served) == steps, (len(served), steps)
    else:
        store.wait([FORKED])
        if store.get(FORKED) != b"ok":
            raise SystemExit("rank 0 failed before its epoch")
        assert len([y for _, y in loader]) == steps
    loader.set_epoch(2 if rank == 0 else 1)
    try:
        next(iter(loader))
    except ValueError as e:
        assert "epoch 2 on rank(s) [0], epoch 1 on rank(s) [1]" in str(e), e
    else:
        raise AssertionError("ranks starting different epochs were not refused")
    say(f"loader_misuse ok rank={rank}")


if __name__ == "__main__":
    run_job(main)
