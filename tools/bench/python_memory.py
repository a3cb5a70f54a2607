"""Node memory of N local ranks that each open a `ddl.Loader` over the same shards: are the
shards counted once?

Run under `mpirun -np N`. Every rank: ddl.dist.init(), reads its proportional set size (PSS,
/proc/self/smaps_rollup: each shared page counted 1/sharers in every process mapping it), opens
ddl.Loader(SHARDS, "train", populate=True, ...), iterates one pass (its 1/N of the node's
records) and, at its last batch, while every rank's pipeline still runs (barrier before and
after), reads again its smaps_rollup and, from /proc/self/smaps, the mappings whose path ends
in ".ddl" (Size, Rss, Pss). Rank 0 gathers every rank's figures and prints one JSON line:
per-rank values (MiB) and their sums, the shard files' bytes and whether the node's page cache
of them is counted once (sum of shard-mapping PSS / shard bytes: 1.0 = counted once).
Usage: mpirun -np N python python_memory.py SHARDS [--batch 64] [--size 224] [--workers 2]
"""
import argparse
import glob
import json
import os

import torch

import ddl
import ddl.dist as dd

MIB = 1 << 20


def rollup() -> dict:
    """smaps_rollup fields in bytes (Rss, Pss, Pss_Anon, Pss_File, ...)."""
    out = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[2] == "kB":
                out[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return out


def shard_mappings(suffix: str = ".ddl") -> dict:
    """Size, Rss and Pss (bytes) summed over the mappings of files ending in `suffix`."""
    sums = {"Size": 0, "Rss": 0, "Pss": 0, "mappings": 0}
    current = None
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            if "-" in parts[0] and len(parts) >= 5 and not parts[0].endswith(":"):
                # A mapping header: address perms offset dev inode [path]
                current = len(parts) >= 6 and parts[-1].endswith(suffix)
                if current:
                    sums["mappings"] += 1
            elif current and parts[0].rstrip(":") in ("Size", "Rss", "Pss"):
                sums[parts[0].rstrip(":")] += int(parts[1]) * 1024
    return sums


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shards")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dd.init()
    rank, n = dd.rank(), dd.size()
    dd.barrier()
    before = rollup()
    loader = ddl.Loader(args.shards, split="train", batch_size=args.batch, image_size=args.size,
                        workers=args.workers, seed=0, populate=True)
    images = 0
    last = len(loader) - 1  # the same on every rank (train)
    for step, (x, _y) in enumerate(loader):
        images += x.shape[0]
        if step == last:
            # Measured while the pipeline still runs (its batch buffers and decode threads
            # alive, this batch held): once the epoch ends the loader frees them.
            dd.barrier()
            after = rollup()
            maps = shard_mappings()
            dd.barrier()
    del x, _y
    fields = [before["Pss"], before.get("Pss_Anon", 0), after["Pss"], after.get("Pss_Anon", 0),
              after.get("Pss_File", 0), after["Rss"], maps["Size"], maps["Rss"], maps["Pss"],
              maps["mappings"], images]
    # Every rank's row to every rank (rows zero but one, summed), in MiB as float32.
    table = torch.zeros(n, len(fields), dtype=torch.float32)
    table[rank] = torch.tensor([v / MIB for v in fields[:-2]] + fields[-2:], dtype=torch.float32)
    dd.allreduce_(table, average=False, algorithm="ring")
    if rank == 0:
        names = ["pss_before_loader_mib", "pss_anon_before_loader_mib", "pss_mib", "pss_anon_mib",
                 "pss_file_mib", "rss_mib", "shard_map_size_mib", "shard_map_rss_mib",
                 "shard_map_pss_mib",
                 "shard_mappings", "images"]
        per_rank = {k: [round(float(v), 1) for v in table[:, i]] for i, k in enumerate(names)}
        shard_bytes = sum(os.path.getsize(p)
                          for p in glob.glob(os.path.join(args.shards, "train-*.ddl")))
        row = {"peer": "ddl-python-memory", "ranks": n, "shard_mib": round(shard_bytes / MIB, 1),
               "per_rank": per_rank}
        for k in names[:-2]:
            row["sum_" + k] = round(float(table[:, names.index(k)].sum()), 1)
        row["shard_pss_over_bytes"] = round(row["sum_shard_map_pss_mib"] * MIB / shard_bytes, 3)
        row["images"] = int(table[:, -1].sum())
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
