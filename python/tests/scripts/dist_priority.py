"""``DistributedOptimizer(comm_order="priority")`` against ``"fifo"`` on 2 ranks: the same start,
data and learning-rate schedule (the rate changes between steps), tiny buckets cut into 64-byte
chunks. The updates really wait for the next forward (pending after ``step()``, applied by the
forward's pre-hooks); the weights end bitwise those of ``fifo`` on every rank, through an
evaluation forward, ``state_dict()`` of the model and of the optimizer; a model with a
parameter no rank uses and one only the last rank uses does not hang.

Usage: mpirun -np 2 python dist_priority.py. Prints ``dist_priority ok rank=R``.
"""

from __future__ import annotations

from typing import Dict

import torch
import torch.nn.functional as F

import ddl.dist as dd
from _job import run_job, say
from dist_ddp import BUCKET_MB, Net, batches, flat, sgd, snapshot


def weights(model: torch.nn.Module) -> torch.Tensor:
    """The parameters, flat (read without ``state_dict()``, which applies pending updates)."""
    return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


def train(order: str, rank: int, size: int, unused: bool) -> Dict[str, torch.Tensor]:
    """The dist_ddp.py steps under ``order``; returns the final weights and the logits of an
    evaluation forward (under ``priority``, the last step's updates are applied by it)."""
    model = Net(seed=1000 + rank, unused=unused, ranks=size)
    dd.broadcast_parameters(model)
    opt = dd.DistributedOptimizer(sgd(model), model, bucket_cap_mb=BUCKET_MB,
                                  comm_order=order, chunk_bytes=64)
    assert len(opt._buckets) >= 3, f"{len(opt._buckets)} bucket(s); need several"
    for step, (x, y) in enumerate(batches(rank)):
        before = weights(model) if order == "priority" and step > 0 else None
        loss = F.cross_entropy(model(x, rank), y)
        loss.backward()
        opt.step()
        if order == "priority":
            assert opt._deferred.pending, "step() applied the updates itself"
        opt.zero_grad()
        # A schedule: the rate of the next step, not of the one still pending.
        for g in opt.param_groups:
            g["lr"] *= 0.5
        if before is not None:
            assert not torch.equal(before, weights(model)), "the forward applied nothing"
    x, _ = next(batches(rank))
    with torch.no_grad():
        logits = model(x, rank)
    state = snapshot(model)
    state["logits"] = logits
    state["optimizer"] = torch.cat([s["momentum_buffer"].reshape(-1)
                                    for s in opt.state_dict()["state"].values()])
    return state


def main() -> None:
    torch.set_num_threads(1)
    dd.init(timeout=60)
    rank, size = dd.rank(), dd.size()
    assert size == 2, "2 ranks: at more, a chunk may be summed in another order"
    for unused in (False, True):
        fifo = train("fifo", rank, size, unused)
        priority = train("priority", rank, size, unused)
        for key, want in fifo.items():
            got = priority[key]
            assert torch.equal(got, want), \
                f"unused={unused} {key}: priority differs from fifo by {(got - want).abs().max()}"
        del priority["logits"]  # of this rank's own batch
        mine = flat(priority)
        root = mine.clone()
        dd.broadcast_(root, root=0)
        assert torch.equal(mine, root), f"rank {rank}'s weights differ from rank 0's"
    dd.barrier()
    say(f"dist_priority ok rank={rank}")


if __name__ == "__main__":
    run_job(main)
