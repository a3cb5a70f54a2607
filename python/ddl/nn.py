"""``ddl.nn``: a classifier head split by class over the ranks, for PyTorch scripts.

:class:`ShardedLinearCrossEntropy` is the last linear layer of a classifier and its softmax
cross-entropy, with the weight and bias of ``num_classes`` classes split over the ranks (rank
``q`` holds :func:`class_range` ``(num_classes, q, size)``): the hybrid of Das et al. 2016 and
Intel's MLSL that ``ddl-train --head-parallel`` runs. The backbone stays data-parallel (DDP
with :func:`ddl.dist.allreduce_hook`, or :class:`ddl.dist.DistributedOptimizer`); the head
must stay out of it, since its gradient is already complete on every rank::

    backbone = torchvision.models.resnet50(num_classes=1)
    backbone.fc = torch.nn.Identity()                   # features out: [batch, 2048]
    backbone = torch.nn.parallel.DistributedDataParallel(backbone)
    backbone.register_comm_hook(None, dd.allreduce_hook)
    head = ddl.nn.ShardedLinearCrossEntropy(2048, 21841)
    loss = head(backbone(images), labels)               # this rank's mean loss
    loss.backward()

Each call all-gathers the features and labels of every rank (:func:`ddl.dist.all_gather_`),
computes the logits of this rank's classes for all of them, and the cross-entropy without
gathering the logits (as Megatron's vocab-parallel cross-entropy does): the per-sample maximum
is exchanged with ``max``, the sums of exponentials, target logits and sums of logits are
summed. Backward reduce-scatters the gradient of the features back to the rank they came from
(:func:`ddl.dist.reduce_scatter_`).
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import torch

from . import dist as dd

__all__ = ["ShardedLinearCrossEntropy", "class_range"]


def class_range(num_classes: int, rank: int, size: int) -> range:
    """The classes rank ``rank`` of ``size`` holds: as even a split as possible, the first
    ``num_classes % size`` ranks one more (as ``ddl-train --head-parallel`` splits them)."""
    base, extra = divmod(num_classes, size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (rank < extra))


def _offsets(counts: Sequence[int]) -> List[int]:
    out = [0]
    for c in counts:
        out.append(out[-1] + c)
    return out


def _gather(features: torch.Tensor, target: torch.Tensor,
            algorithm: str) -> Tuple[List[int], torch.Tensor, torch.Tensor]:
    """Every rank's row count, and the features (float32) and targets of every rank's samples,
    in rank order."""
    p, me = dd.size(), dd.rank()
    width = features.shape[1]
    counted = torch.zeros(p, dtype=torch.float32)
    counted[me] = features.shape[0]
    dd.all_gather_(counted, [1] * p, algorithm=algorithm)
    counts = [int(c) for c in counted.tolist()]
    rows = torch.empty(sum(counts), width + 1, dtype=torch.float32, device=features.device)
    mine = rows.narrow(0, sum(counts[:me]), counts[me])
    mine[:, :width] = features.detach().float()
    mine[:, width] = target.float()
    dd.all_gather_(rows, counts, algorithm=algorithm)
    return counts, rows[:, :width], rows[:, width].long()


def _logits(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """This rank's classes' logits (float32) of the gathered features."""
    logits = x @ weight.detach().float().t()
    return logits + bias.detach().float() if bias is not None else logits


def _owned(labels: torch.Tensor, classes: range) -> Tuple[torch.Tensor, torch.Tensor]:
    """Each target's index among this rank's classes (0 where it is not one), and whether it
    is one."""
    local = labels - classes.start
    owned = (local >= 0) & (local < len(classes))
    return local.where(owned, torch.zeros_like(local)), owned


def _at(logits: torch.Tensor, local: torch.Tensor, owned: torch.Tensor) -> torch.Tensor:
    """Each sample's target logit where this rank owns the target, 0 elsewhere."""
    at = logits.gather(1, local.unsqueeze(1)).squeeze(1)
    return at.where(owned, torch.zeros_like(at))


class _ShardedCrossEntropy(torch.autograd.Function):
    """This rank's mean cross-entropy over its samples, with the head split over the ranks.

    Gradients: of the features, that of the returned loss (``grad`` x its derivative); of the
    weight and bias slices, that of the mean over the ranks of their losses, so that a backbone
    averaged over the ranks and the head agree on one objective."""

    @staticmethod
    def forward(ctx: Any, features: torch.Tensor, weight: torch.Tensor,  # type: ignore[override]
                bias: Optional[torch.Tensor], target: torch.Tensor,
                head: "ShardedLinearCrossEntropy") -> torch.Tensor:
        counts, x, labels = _gather(features, target, head.algorithm)
        logits = _logits(x, weight, bias)
        top = logits.amax(1)
        dd._allreduce_max_(top, algorithm=head.algorithm)
        exp = (logits - top.unsqueeze(1)).exp()
        local, owned = _owned(labels, head.classes)
        at_target = _at(logits, local, owned)
        sums = torch.stack([exp.sum(1), at_target, logits.sum(1)])
        dd.allreduce_(sums, average=False)
        lse = top + sums[0].log()
        eps = head.label_smoothing
        loss = (1 - eps) * (lse - sums[1]) + eps * (lse - sums[2] / head.num_classes)
        ctx.save_for_backward(x, exp, sums[0], local, owned)
        ctx.head, ctx.counts, ctx.dtypes = head, counts, (features.dtype, weight.dtype)
        ctx.weight, ctx.has_bias = weight.detach().float(), bias is not None
        first = sum(counts[:dd.rank()])
        return loss.narrow(0, first, counts[dd.rank()]).mean()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        x, exp, sum_exp, local, owned = ctx.saved_tensors
        head, counts = ctx.head, ctx.counts
        p, me = dd.size(), dd.rank()
        # Every rank's grad of its loss, and its samples' weight in it.
        grads = torch.zeros(p, dtype=torch.float32)
        grads[me] = grad.detach().float().cpu()
        dd.all_gather_(grads, [1] * p, algorithm=head.algorithm)
        per_sample = torch.cat([torch.full((c,), float(grads[q]) / max(c, 1))
                                for q, c in enumerate(counts)]).to(x.device)
        eps = head.label_smoothing
        dz = exp / sum_exp.unsqueeze(1)
        dz = dz - (1 - eps) * torch.zeros_like(dz).scatter(1, local.unsqueeze(1),
                                                         owned.float().unsqueeze(1))
        if eps:
            dz = dz - eps / head.num_classes
        dz = dz * per_sample.unsqueeze(1)
        grad_weight = (dz.t() @ x / p).to(ctx.dtypes[1])
        grad_bias = (dz.sum(0) / p).to(ctx.dtypes[1]) if ctx.has_bias else None
        partial = dz @ ctx.weight
        own = dd.reduce_scatter_(partial, counts, algorithm=head.algorithm)
        return own.to(ctx.dtypes[0]), grad_weight, grad_bias, None, None


class ShardedLinearCrossEntropy(torch.nn.Module):
    """A linear classifier of ``num_classes`` classes over ``in_features`` features and its
    softmax cross-entropy, the classes split over the ranks of ``ddl.dist``.

    ``forward(features, target)`` takes this rank's features ``[batch, in_features]`` and
    targets ``[batch]`` (the batch may differ between ranks) and returns this rank's mean loss,
    what a data-parallel script gets from ``torch.nn.functional.cross_entropy``: every rank
    must call it, and backward, together. The features' gradient is that of the returned loss;
    the slices' gradients are those of the mean over the ranks of their losses, complete on
    every rank (keep the head out of DDP and of gradient averaging). ``weight`` is
    ``[len(classes), in_features]``, the rows ``classes`` of a whole head's weight, drawn as
    :class:`torch.nn.Linear` draws the whole one's. ``label_smoothing`` as in
    :func:`torch.nn.functional.cross_entropy`; ``algorithm`` (``auto``, ``ring``, ``shm``)
    of the allgather and reduce-scatter.
    """

    def __init__(self, in_features: int, num_classes: int, *, bias: bool = True,
                 label_smoothing: float = 0.0, algorithm: str = "auto",
                 device: "Optional[torch.device | str]" = None,
                 dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        if num_classes < dd.size():
            raise ValueError(f"num_classes: {num_classes} classes cannot be split over "
                             f"{dd.size()} ranks (each needs one)")
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing: {label_smoothing} is outside [0, 1)")
        dd._check_shard_algorithm(algorithm)
        self.in_features, self.num_classes = in_features, num_classes
        self.label_smoothing, self.algorithm = label_smoothing, algorithm
        self.classes = class_range(num_classes, dd.rank(), dd.size())
        options = {"device": device, "dtype": dtype}
        self.weight = torch.nn.Parameter(torch.empty(len(self.classes), in_features, **options))
        self.bias = (torch.nn.Parameter(torch.empty(len(self.classes), **options))
                     if bias else None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """:class:`torch.nn.Linear`'s initialisation of the whole head, drawn on every rank
        (the same values where the ranks' generators agree, as after the same
        ``torch.manual_seed``), each keeping its rows."""
        rows = slice(self.classes.start, self.classes.stop)
        whole = torch.nn.Linear(self.in_features, self.num_classes, bias=self.bias is not None)
        with torch.no_grad():
            self.weight.copy_(whole.weight[rows])
            if self.bias is not None:
                self.bias.copy_(whole.bias[rows])

    def forward(self, features: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """This rank's mean cross-entropy (see the class doc)."""
        if features.dim() != 2 or features.shape[1] != self.in_features:
            raise ValueError(f"features: shape {tuple(features.shape)} is not "
                             f"[batch, {self.in_features}]")
        if target.shape != features.shape[:1]:
            raise ValueError(f"target: shape {tuple(target.shape)} is not [{features.shape[0]}]")
        return _ShardedCrossEntropy.apply(features, self.weight, self.bias, target, self)

    @torch.no_grad()
    def target_rank(self, features: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """How many classes score above each sample's target (``[batch]``, this rank's
        samples): the target is in the top k exactly when fewer than k do. Every rank counts
        among its classes, and the counts are summed: what merging every rank's top k finds,
        without moving them."""
        counts, x, labels = _gather(features, target, self.algorithm)
        logits = _logits(x, self.weight, self.bias)
        local, owned = _owned(labels, self.classes)
        at_target = _at(logits, local, owned)
        dd.allreduce_(at_target, average=False)
        above = (logits > at_target.unsqueeze(1)).sum(1).float()
        dd.allreduce_(above, average=False)
        first = sum(counts[:dd.rank()])
        return above.narrow(0, first, counts[dd.rank()]).long()

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, num_classes={self.num_classes}, "
                f"classes={self.classes.start}..{self.classes.stop - 1}, "
                f"bias={self.bias is not None}")
