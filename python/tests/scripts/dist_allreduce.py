"""Checks ddl.dist's collectives under mpirun: allreduce_ (every algorithm, dtype and a range of
sizes, sum and mean, contiguous and not), allreduce_async_, broadcast_ from the first and the
last rank, and that every rank holds bitwise the same results.

Usage: mpirun -np P python dist_allreduce.py (or torchrun --nproc_per_node P: the TCP
backend, every algorithm but ``mpi``; or as a part of dist_suite.py)
Prints ``dist_allreduce ok rank=R size=P checks=N digest=HEX`` on success; any wrong value
fails an assertion naming the case (non-zero exit).
"""

from __future__ import annotations

import zlib

import torch

import ddl.dist as dd
from _job import DTYPES, algorithms, native, run_job, say

#: The element counts each algorithm reduces: one, odd, and past the chunk sizes.
SIZES = (1, 7, 1001, 300_001)


def values(rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank ``rank``'s input: quarters in [-5, 5], distinct per rank and position; sums of up
    to 8 ranks need at most 8 significant bits, so they are exact even in bfloat16."""
    i = torch.arange(n, dtype=torch.int64)
    k = (i * 37 + rank * 11 + rank * rank) % 41 - 20
    return (k.to(torch.float32) / 4).to(dtype)


def expected(p: int, n: int, dtype: torch.dtype, average: bool) -> torch.Tensor:
    """The exact sum over all ``p`` ranks (and the mean, divided in float32 and rounded once)."""
    total = sum(values(r, n, torch.float64) for r in range(p))
    exact = total.to(torch.float32)
    assert torch.equal(exact.to(torch.float64), total), "test data: sum not exact in float32"
    if average:
        exact = exact / p
    return exact.to(dtype)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (so -0.0 != 0.0 and NaN == NaN of the same payload)."""
    view = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
    return a.dtype == b.dtype and torch.equal(a.contiguous().view(view[a.dtype]),
                                              b.contiguous().view(view[b.dtype]))


def digest(crc: int, t: torch.Tensor) -> int:
    """Folds the bytes of ``t`` into a running CRC-32."""
    return zlib.crc32(t.contiguous().view(torch.uint8).numpy().tobytes(), crc)


def check_allreduce(rank: int, p: int, sizes: list) -> tuple:
    checks, crc = 0, 0
    for algorithm in algorithms():
        for dtype in DTYPES:
            for n in sizes:
                for average in (False, True):
                    t = values(rank, n, dtype)
                    out = dd.allreduce_(t, average=average, algorithm=algorithm)
                    want = expected(p, n, dtype, average)
                    case = f"allreduce_ {algorithm} {dtype} n={n} average={average}"
                    assert out is t, f"{case}: did not return its argument"
                    if not same_bits(t, want):
                        bad = (t.float() != want.float()).nonzero()[:5].flatten().tolist()
                        raise AssertionError(
                            f"rank {rank}: {case}: wrong at {bad}: "
                            f"got {t[bad].tolist()}, want {want[bad].tolist()}")
                    crc = digest(crc, t)
                    checks += 1
    return checks, crc


def check_noncontiguous(rank: int, p: int) -> tuple:
    """A strided column slice and a transposed block: reduced in place, the gaps untouched."""
    checks, crc = 0, 0
    for algorithm in ("auto", "ring", native("rhd")):
        for dtype in DTYPES:
            base = values(rank, 6 * 35, dtype).reshape(6, 35)
            keep = base.clone()
            strided = base[:, 1::3]
            assert not strided.is_contiguous()
            dd.allreduce_(strided, average=False, algorithm=algorithm)
            want = expected(p, 6 * 35, dtype, False).reshape(6, 35)[:, 1::3]
            case = f"non-contiguous allreduce_ {algorithm} {dtype}"
            assert same_bits(strided, want), f"rank {rank}: {case}: wrong values"
            untouched = torch.ones(35, dtype=torch.bool)
            untouched[1::3] = False
            assert same_bits(base[:, untouched], keep[:, untouched]), \
                f"rank {rank}: {case}: wrote outside the view"
            crc = digest(crc, strided)
            transposed = values(rank, 12 * 5, dtype).reshape(12, 5).t()
            dd.allreduce_(transposed, average=True, algorithm=algorithm)
            want = expected(p, 12 * 5, dtype, True).reshape(12, 5).t()
            assert same_bits(transposed, want), f"rank {rank}: transposed {case}: wrong values"
            crc = digest(crc, transposed)
            checks += 2
    # A non-contiguous leaf that requires grad (a parameter): reduced in place all the same.
    param = torch.nn.Parameter(values(rank, 35 * 6, torch.float32).reshape(35, 6).t())
    assert not param.is_contiguous() and param.requires_grad
    dd.allreduce_(param, average=False)
    want = expected(p, 35 * 6, torch.float32, False).reshape(35, 6).t()
    assert same_bits(param.detach(), want), f"rank {rank}: non-contiguous parameter: wrong"
    crc = digest(crc, param.detach())
    return checks + 1, crc


def check_async(rank: int, p: int) -> tuple:
    """Several reductions in flight at once; each future completes with its own tensor."""
    n = 1001
    ts = [values(rank, n, torch.float32) * (j + 1) for j in range(4)]
    futs = [dd.allreduce_async_(t, average=False, algorithm=a)
            for t, a in zip(ts, ("auto", "ring", "rhd", "multicolor"))]
    assert all(isinstance(f, torch.futures.Future) for f in futs), "not torch futures"
    # A barrier queued behind reductions still in flight (MPI_Allreduce among them).
    ts.append(values(rank, n, torch.float32) * 5)
    futs.append(dd.allreduce_async_(ts[-1], average=False, algorithm=native("rhd")))
    dd.barrier()
    crc = 0
    for j, (t, f) in enumerate(zip(ts, futs)):
        out = f.wait()
        assert out is t, f"allreduce_async_ #{j}: the future did not complete with its tensor"
        want = expected(p, n, torch.float32, False) * (j + 1)
        assert same_bits(t, want), f"rank {rank}: allreduce_async_ #{j}: wrong values"
        crc = digest(crc, t)
    return len(ts), crc


def check_broadcast(rank: int, p: int) -> tuple:
    checks, crc = 0, 0
    for root in (0, p - 1):
        for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.uint8):
            mine = (torch.arange(777) * (rank + 3) + rank).to(dtype)
            root_values = (torch.arange(777) * (root + 3) + root).to(dtype)
            out = dd.broadcast_(mine, root=root)
            assert out is mine, "broadcast_ did not return its argument"
            assert torch.equal(mine, root_values), \
                f"rank {rank}: broadcast_ {dtype} from root {root}: got another rank's values"
            crc = digest(crc, mine)
            checks += 1
        strided = (torch.arange(60, dtype=torch.float32) + 100 * rank).reshape(6, 10)[:, ::2]
        dd.broadcast_(strided, root=root)
        want = (torch.arange(60, dtype=torch.float32) + 100 * root).reshape(6, 10)[:, ::2]
        assert torch.equal(strided, want), \
            f"rank {rank}: non-contiguous broadcast_ from root {root}: wrong values"
        param = torch.nn.Parameter(torch.full((3, 4), float(rank)).t())
        dd.broadcast_(param, root=root)
        assert torch.equal(param.detach(), torch.full((4, 3), float(root))), \
            f"rank {rank}: broadcast_ of a parameter from root {root}: wrong values"
        checks += 2
    return checks, crc


def main() -> None:
    dd.init(timeout=30)
    rank, p = dd.rank(), dd.size()
    assert 0 <= rank < p, f"rank {rank} of {p}"
    checks, crc = 0, 0
    for part in (check_allreduce(rank, p, SIZES), check_noncontiguous(rank, p),
                 check_async(rank, p), check_broadcast(rank, p)):
        checks += part[0]
        crc = zlib.crc32(part[1].to_bytes(4, "little"), crc)
    # Every rank must hold the same bits: compare this rank's digest with rank 0's.
    mine = torch.tensor([crc, checks], dtype=torch.int64)
    root = mine.clone()
    dd.broadcast_(root, root=0)
    assert torch.equal(mine, root), \
        f"rank {rank}: results differ from rank 0's (digest {crc:08x} vs {int(root[0]):08x})"
    dd.barrier()
    say(f"dist_allreduce ok rank={rank} size={p} checks={checks} digest={crc:08x}")


if __name__ == "__main__":
    run_job(main)
