#!/usr/bin/env python3
"""torch.distributed (gloo, CPU float32) allreduce: the peer of `ddl-bench allreduce`.

Same sizes, statistic and output as ddl-bench and tools/bench/mpi_allreduce.c: for each
size, warmup calls, a barrier, then N back-to-back timed calls of an in-place sum; time = the
mean of the N calls on the slowest rank, N = clamp(iters x 64 MiB / bytes, iters, 10000).
Prints one JSON line per size: algo, ranks, bytes, time_us, algbw_gbps, busbw_gbps, correct
(integer-valued data, compared exactly with the sequential sum).

    .venv/bin/python tools/bench/gloo_allreduce.py --ranks 2 --min-bytes 4096 --max-bytes 67108864
"""
import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def fill(n, rank, salt):
    i = torch.arange(n, dtype=torch.int64)
    return ((i * 7919 + rank * 104729 + salt * 31) % 2001 - 1000).to(torch.float32)


def worker(rank, args, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    p = args.ranks
    sizes = []
    s = max(args.min_bytes // 4, 1) * 4
    while s <= args.max_bytes:
        sizes.append(s)
        s *= args.step_factor
    for salt, nbytes in enumerate(sizes):
        n = nbytes // 4
        buf = fill(n, rank, salt)
        dist.all_reduce(buf)
        expected = sum(fill(n, r, salt) for r in range(p))
        ok = torch.tensor([0.0 if torch.equal(buf, expected) else 1.0])
        dist.all_reduce(ok)
        data = torch.zeros(n, dtype=torch.float32)
        for _ in range(args.warmup):
            dist.all_reduce(data)
        calls = min(max(args.iters * (64 << 20) // nbytes, args.iters), max(args.iters, 10000))
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            dist.all_reduce(data)
        t = torch.tensor([(time.perf_counter() - t0) / calls], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if rank == 0:
            med = t.item()
            algbw = nbytes / med / 1e9
            print(json.dumps({
                "algo": "gloo",
                "ranks": p,
                "bytes": nbytes,
                "calls": calls,
                "time_us": med * 1e6,
                "algbw_gbps": algbw,
                "busbw_gbps": algbw * 2 * (p - 1) / p,
                "correct": ok.item() == 0.0,
            }), flush=True)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--min-bytes", type=int, default=4096)
    ap.add_argument("--max-bytes", type=int, default=64 << 20)
    ap.add_argument("--step-factor", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    mp.spawn(worker, args=(args, free_port()), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
