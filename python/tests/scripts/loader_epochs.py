"""A ``ddl.Loader`` of every rank over some epochs, the records each rank served written out:
for the tests of the record exchange (``exchange=Q``) and of the elastic resume (a state of
one layout loaded on another).

Usage: loader_epochs.py SHARDS OUT --exchange Q --last-epoch E [--load STATE] [--stop E:K]
       [--break]
Each rank writes ``OUT/rank<R>.json``: its node and local rank, the ids it served per epoch,
``len()`` at each epoch's start, its stats, and with ``--stop E:K`` the state after its K-th
batch of epoch E (``state``) and how many ids it had served of that epoch then
(``saved_at``); ``--break`` ends the job there. ``STATE`` may hold ``{rank}``. Prints
``loader_epochs ok rank=R``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import ddl
import ddl.dist as dd
from _job import RecordedIds, run_job, say


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("shards")
    p.add_argument("out", type=Path)
    p.add_argument("--exchange", type=float, default=0.0)
    p.add_argument("--last-epoch", type=int, required=True)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--load")
    p.add_argument("--stop")
    p.add_argument("--break", dest="stop_there", action="store_true")
    a = p.parse_args()
    dd.init(timeout=60)
    rank = dd.rank()
    loader = ddl.Loader(a.shards, batch_size=a.batch, image_size=16, workers=1, seed=3,
                        exchange=a.exchange)
    rec = RecordedIds(loader)
    if a.load:
        loader.load_state_dict(json.loads(Path(a.load.format(rank=rank)).read_text()))
    stop = tuple(map(int, a.stop.split(":"))) if a.stop else None
    out: dict = {"node": dd.node(), "local_rank": dd.local_rank(), "ids": {}, "len": {}}
    done = False
    for epoch in range(loader.state_dict()["epoch"], a.last_epoch + 1):
        loader.set_epoch(epoch)
        out["len"][epoch] = len(loader)
        rec.ids = []
        for _ in loader:
            if (epoch, loader.state_dict()["step"]) == stop:
                out["state"], out["saved_at"] = loader.state_dict(), len(rec.ids)
                if a.stop_there:
                    done = True
                    break
        out["ids"][epoch] = rec.ids
        if done:
            break
    out["stats"] = {k: v for k, v in loader.stats().items() if k != "bad_records"}
    dd.barrier()
    (a.out / f"rank{rank}.json").write_text(json.dumps(out))
    say(f"loader_epochs ok rank={rank}")


if __name__ == "__main__":
    run_job(main)
