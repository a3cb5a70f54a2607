#!/usr/bin/env python3
"""The allreduce tables of BENCHMARKS.md from the JSON lines of tools/bench/mpi_allreduce.c
("mpi-c"), `ddl-bench allreduce --json` and tools/bench/gloo_allreduce.py.

    tools/bench/allreduce_table.py bench-out/allreduce-{c,ddl,gloo}.jsonl

Per rank count, one row per size: the median time (us) of every algorithm over the runs, then
three ratios taken per run and reported as the median over the runs (run k is the k-th line of
a (ranks, size, algorithm) in the files; the script runs the C loop right before ddl-bench,
and ddl-bench times the algorithms size by size, next to each other), the fastest ddl
algorithm being the one with the lowest median:
  best/C     the C loop's time over the fastest ddl algorithm's (> 1: ddl is faster),
  auto/best  auto's time over the fastest algorithm's (<= 1.05: auto picked well),
and, per run, what `auto` kept against the fastest algorithm of that run ("kept/best":
`shm=shm` where it kept the run's fastest, `mpi!=shm` where not),
  mpi/C      the C loop's time over ddl's `mpi` (~1: ddl's baseline is not handicapped),
and two of the medians:
  best/gloo  gloo's time over the fastest ddl algorithm's,
  bw         one in-place pass over the buffer (buf[i] *= s) on every rank at once over the
             fastest algorithm's time: the fraction of the memory-bandwidth bound it reaches,
  shm/pass   shm's time over that pass (the C loop's `pass_us`), medians: how many passes
             over the buffer shm costs.
A `*` marks a result that was not bitwise equal to the exact sum / MPI_Allreduce.
"""
import json
import statistics
import sys
from collections import defaultdict

HIERARCHICAL = ["hierarchical:rhd", "hierarchical:mpi", "hierarchical:ring"]
ORDER = ["mpi-c", "ring", "rhd", "multicolor", "multiring", "shm"] + HIERARCHICAL + \
    ["mpi", "auto", "gloo"]
DDL = ["ring", "rhd", "multicolor", "multiring", "shm"] + HIERARCHICAL + ["mpi"]


def family(name):
    """An algorithm's column: its name without parameters, but for the hierarchical
    algorithm with what runs between the nodes (`hierarchical:rhd`)."""
    parts = name.split(":")
    return ":".join(parts[:2]) if parts[0] == "hierarchical" else parts[0]


def size(b):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift} {unit}"
    return f"{b} B"


def paired_ratio(xs, ys):
    """The median over the runs of x / y, run k of x against run k of y ("-" if either is
    missing): the host's slow phases last minutes and hit both sides of a run alike."""
    if not xs or not ys:
        return "-"
    return f"{statistics.median(x / y for x, y in zip(xs, ys)):.2f}x"


def kept_vs_best(kept, times, np_, b):
    """Per run, what auto kept against that run's fastest ddl algorithm."""
    cells = []
    for k, a in enumerate(kept):
        run = {d: times[(np_, b, d)][k] for d in DDL if len(times.get((np_, b, d), [])) > k}
        best = min(run, key=run.get) if run else "?"
        cells.append(f"{a}={best}" if a == best else f"{a}!={best}")
    return " ".join(cells) or "-"


def main(paths):
    times = defaultdict(list)  # (ranks, bytes, algo) -> time of run 0, 1, ...
    bound = defaultdict(list)
    correct = defaultdict(lambda: True)
    resolved = defaultdict(list)  # (ranks, bytes, "auto") -> what it ran in run 0, 1, ...
    for path in paths:
        try:
            lines = open(path).read().splitlines()
        except FileNotFoundError:
            continue
        for line in lines:
            r = json.loads(line)
            algo = family(r["algo"])
            key = (r["ranks"], r["bytes"], algo)
            times[key].append(r["time_us"])
            correct[key] = correct[key] and r["correct"]
            if "pass_us" in r:
                bound[(r["ranks"], r["bytes"])].append(r["pass_us"])
            if r.get("resolved"):
                resolved[key].append(family(r["resolved"]))
    med = {k: statistics.median(v) for k, v in times.items()}
    for np_ in sorted({k[0] for k in med}):
        algos = [a for a in ORDER if any(k[0] == np_ and k[2] == a for k in med)]
        runs = max(len(v) for k, v in times.items() if k[0] == np_)
        print(f"\n# np {np_}: time per call, us (median of {runs} runs)")
        head = ["size"] + [("C loop" if a == "mpi-c" else a) for a in algos] + \
            ["best/C", "auto/best", "mpi/C", "best/gloo", "bw", "shm/pass", "kept/best"]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for b in sorted({k[1] for k in med if k[0] == np_}):
            row = [size(b)]
            for a in algos:
                t = med.get((np_, b, a))
                cell = "-" if t is None else f"{t:.1f}" if t < 100 else f"{t:.0f}"
                if t is not None and not correct[(np_, b, a)]:
                    cell += "*"
                if a == "auto" and resolved[(np_, b, a)]:
                    cell += " (" + ",".join(sorted(set(resolved[(np_, b, a)]))) + ")"
                row.append(cell)
            ddl = {a: med[(np_, b, a)] for a in DDL if (np_, b, a) in med}
            best_algo = min(ddl, key=ddl.get) if ddl else None
            best = ddl.get(best_algo)
            c = med.get((np_, b, "mpi-c"))
            paired = lambda x, y: paired_ratio(times.get((np_, b, x)), times.get((np_, b, y)))
            mpi = med.get((np_, b, "mpi"))
            gloo = med.get((np_, b, "gloo"))
            mc = bound.get((np_, b))
            ratio = lambda x, y: "-" if x is None or y is None else f"{x / y:.2f}x"
            row.append(paired("mpi-c", best_algo) + (f" ({best_algo})" if best_algo else ""))
            row.append(paired("auto", best_algo))
            row.append(paired("mpi-c", "mpi"))
            row.append(ratio(gloo, best))
            row.append("-" if not mc or best is None else f"{statistics.median(mc) / best:.2f}")
            shm = med.get((np_, b, "shm"))
            row.append("-" if not mc or shm is None else f"{shm / statistics.median(mc):.2f}")
            row.append(kept_vs_best(resolved[(np_, b, "auto")], times, np_, b))
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
