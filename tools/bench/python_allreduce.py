"""ddl's Python package: `ddl.dist.allreduce_` on a float32 CPU tensor, timed as `ddl-bench
allreduce` times the Rust call (run under mpirun, one process per rank).

Per algorithm and size: one buffer allocated once, WARMUP untimed calls, then ITERS timed calls,
each after a barrier; the time of a call is the slowest rank's, the figure the median over the
calls (ddl-bench's definition). busbw = bytes / time x 2(p-1)/p.
`--path public` times `ddl.dist.allreduce_` (validation, the ddl communication thread, the
future); `--path direct` times the binding alone (`ddl._ddl.allreduce` on the tensor's
data_ptr, on the calling thread), to split the per-call overhead between the two.
Prints one JSON line per (algorithm, size) on rank 0, in ddl-bench's format plus "peer" and
"backend" (ddl.dist's: "mpi" under mpirun, "tcp" under torchrun). Algorithm `gloo` times
torch.distributed's gloo allreduce of the same tensor in the same processes (under torchrun:
the peer of the TCP backend, alternating with ddl's algorithms size by size).
Usage: mpirun -np 2 python python_allreduce.py [--algos auto,multicolor]
       torchrun --nproc_per_node 2 python_allreduce.py --algos auto,gloo
           [--sizes 4096,16777216] [--iters 20] [--warmup 5] [--path public|direct]
"""
import argparse
import json
import statistics
import time

import torch

import ddl.dist as dd
from ddl import _ddl


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--algos", default="auto,multicolor")
    ap.add_argument("--sizes", default="4096,16777216")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--path", choices=("public", "direct"), default="public")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dd.init()
    rank, p = dd.rank(), dd.size()
    sizes = [int(s) for s in args.sizes.split(",")]
    buf = torch.zeros(max(sizes) // 4, dtype=torch.float32)
    for nbytes in sizes:
        for algo in args.algos.split(","):
            t = buf[: nbytes // 4]
            t.fill_(float(rank + 1))
            if algo == "gloo":
                if not torch.distributed.is_initialized():
                    torch.distributed.init_process_group("gloo")

                def call():
                    torch.distributed.all_reduce(t)
                    t.div_(p)
            elif args.path == "public":
                def call():
                    dd.allreduce_(t, average=True, algorithm=algo)
            else:
                ptr, n = t.data_ptr(), t.numel()

                def call():
                    _ddl.allreduce(ptr, n, "float32", True, algo)
            for _ in range(args.warmup):
                call()
            times = torch.zeros(p, args.iters, dtype=torch.float64)
            for i in range(args.iters):
                dd.barrier()
                start = time.perf_counter()
                call()
                times[rank, i] = time.perf_counter() - start
            # Every rank's times to every rank (a sum of rows that are zero but one), as float32
            # (ddl's allreduce takes float types only): microsecond resolution is kept.
            gathered = (times * 1e6).float()
            dd.allreduce_(gathered, average=False, algorithm="ring")
            slowest = gathered.max(dim=0).values.double() / 1e6
            if rank == 0:
                sec = statistics.median(slowest.tolist())
                algbw = nbytes / sec / 1e9
                print(json.dumps({
                    "peer": "ddl-python-" + args.path, "backend": dd.backend(), "algo": algo, "ranks": p, "bytes": nbytes,
                    "time_us": sec * 1e6, "algbw_gbps": algbw,
                    "busbw_gbps": algbw * 2 * (p - 1) / p,
                }), flush=True)


if __name__ == "__main__":
    main()
