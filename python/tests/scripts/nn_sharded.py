"""Under mpirun or torchrun (or within dist_suite.py): ddl.dist.all_gather_ / reduce_scatter_
exact on uneven rows, and ddl.nn.ShardedLinearCrossEntropy against a single-process full-head
cross-entropy (loss and gradients within 1e-5), with uneven classes and batches per rank, with
and without label smoothing and with a grad that is not 1. Prints ``nn_sharded ok rank=R
checks=N``."""

import torch
import torch.nn.functional as F

import ddl.dist as dd
import ddl.nn
from _job import run_job, say

FEATURES, CLASSES = 37, 23


def close(ours: torch.Tensor, want: torch.Tensor, what: str) -> None:
    scale = want.abs().max().item()
    diff = (ours.double() - want.double()).abs().max().item()
    assert diff <= 1e-5 * scale, f"{what}: differs by {diff} (scale {scale})"


def collectives(p: int, me: int) -> int:
    counts = [3 * q + (q % 2) for q in range(p)]  # rank 0 owns none
    rows = torch.arange(sum(counts) * 5, dtype=torch.float32).view(-1, 5)
    first = sum(counts[:me])
    mine = torch.full_like(rows, float("nan"))
    mine[first:first + counts[me]] = rows[first:first + counts[me]]
    dd.all_gather_(mine, counts)
    assert torch.equal(mine, rows), "all_gather_"
    summed = dd.reduce_scatter_(rows * (me + 1), counts)
    want = rows[first:first + counts[me]] * (p * (p + 1) // 2)
    assert torch.equal(summed, want), "reduce_scatter_"
    return 2


def head(p: int, me: int) -> int:
    torch.manual_seed(7)
    counts = [4 + 2 * q for q in range(p)]  # uneven batches
    x = torch.randn(sum(counts), FEATURES)
    y = torch.randint(CLASSES, (sum(counts),))
    w, b = 0.3 * torch.randn(CLASSES, FEATURES), 0.1 * torch.randn(CLASSES)
    first = sum(counts[:me])
    rows = slice(first, first + counts[me])
    checks = 0
    for eps, grad in ((0.0, 1.0), (0.1, 2.5)):
        module = ddl.nn.ShardedLinearCrossEntropy(FEATURES, CLASSES, label_smoothing=eps)
        cls = slice(module.classes.start, module.classes.stop)
        with torch.no_grad():
            module.weight.copy_(w[cls])
            module.bias.copy_(b[cls])
        xs = x[rows].clone().requires_grad_()
        loss = module(xs, y[rows])
        (grad * loss).backward()
        # One process, the whole head: each rank's mean loss, their mean the objective.
        wr, br, xr = w.clone().requires_grad_(), b.clone().requires_grad_(), x.clone().requires_grad_()
        losses = [F.cross_entropy(xr[sum(counts[:q]):sum(counts[:q + 1])] @ wr.t() + br,
                                  y[sum(counts[:q]):sum(counts[:q + 1])], label_smoothing=eps)
                  for q in range(p)]
        (grad * sum(losses) / p).backward()
        close(loss.detach(), losses[me].detach(), f"loss eps={eps}")
        close(module.weight.grad, wr.grad[cls], f"weight grad eps={eps}")
        close(module.bias.grad, br.grad[cls], f"bias grad eps={eps}")
        # The features' gradient is that of this rank's loss: p times its share of the mean.
        close(xs.grad, p * xr.grad[rows], f"features grad eps={eps}")
        ranks = module.target_rank(x[rows], y[rows])
        logits = x[rows] @ w.t() + b
        target = logits.gather(1, y[rows].unsqueeze(1))
        assert torch.equal(ranks, (logits > target).sum(1)), "target_rank"
        checks += 5
    return checks


def main() -> None:
    dd.init()
    p, me = dd.size(), dd.rank()
    checks = collectives(p, me) + head(p, me)
    say(f"nn_sharded ok rank={me} checks={checks}")


if __name__ == "__main__":
    run_job(main)
