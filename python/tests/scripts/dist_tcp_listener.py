"""``ddl.dist.init()`` under torchrun with MASTER_ADDR 127.0.0.1: each rank's listener is bound
on loopback's 127.0.0.1 (another address of this machine finds no listener at its port),
strangers at rank 0's listener during start-up (a port scanner's request, a silent
connection, the unauthenticated greeting that used to pass for rank 1) are dropped while the
job starts, and the listener is closed once the ranks are connected.

Usage: torchrun --nproc_per_node 2 --master_addr 127.0.0.1 dist_tcp_listener.py
Prints ``dist_tcp_listener ok rank=R host=H`` on success; failures are assertions.
"""

from __future__ import annotations

import datetime
import os
import socket

import torch

import ddl.dist as dd
from _job import run_job, say


def strangers_at_rank0(size: int) -> list:
    """Connections to rank 0's listener, made before this rank connects to it."""
    store = dd._store(30.0, 1, size, os.environ)
    store.set("world_size/1", str(size))  # what rank 0's init checks before it listens
    store.wait(["addr/0"], datetime.timedelta(seconds=30))
    host, port = store.get("addr/0").decode().rsplit(":", 1)
    # Bound on loopback's 127.0.0.1 itself, not on every interface: another address of this
    # machine (any of 127.0.0.0/8 on Linux) finds no listener at that port.
    try:
        socket.create_connection(("127.0.0.2", int(port)), timeout=10).close()
    except ConnectionRefusedError:
        pass
    else:
        raise AssertionError(f"rank 0's listener, published as {host}:{port}, is bound beyond "
                             "127.0.0.1: it accepts at 127.0.0.2")
    conns = [socket.create_connection((host, int(port)), timeout=10) for _ in range(3)]
    conns[0].sendall(b"GET / HTTP/1.1\r\nHost: ddl\r\n\r\n")
    conns[1].sendall(b"ddl-tcp1" + (1).to_bytes(8, "little") + size.to_bytes(8, "little"))
    return conns  # conns[2] stays silent


def main() -> None:
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    held = strangers_at_rank0(size) if rank == 1 else []
    dd.init(timeout=30)
    host, port = dd._rendezvous.get(f"addr/{rank}").decode().rsplit(":", 1)
    assert host == "127.0.0.1", (host, port)
    t = torch.full((5,), float(rank + 1))
    dd.allreduce_(t, average=False)
    assert torch.equal(t, torch.full((5,), float(size * (size + 1) // 2))), t
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except ConnectionRefusedError:
        pass
    else:
        raise AssertionError(f"rank {rank}'s listener at {host}:{port} still accepts")
    dd.barrier()
    for c in held:
        c.close()
    say(f"dist_tcp_listener ok rank={rank} host={host}")


if __name__ == "__main__":
    run_job(main)
