"""ddl for PyTorch: ddl's RAM-resident JPEG pipeline and its MPI allreduce.

- :class:`ddl.Loader`: batches of a ``ddl-pack`` shard directory as torch tensors.
- :class:`ddl.Shards`: map-style access to the packed records (JPEG bytes and labels).
- :mod:`ddl.dist`: ``allreduce_`` / ``broadcast_`` of tensors, a DDP comm hook and a
  Horovod-style ``DistributedOptimizer``. Importing ``ddl`` does not start MPI;
  ``ddl.dist.init()`` does.
"""

from __future__ import annotations

from ._ddl import DdlError, DistError, ShardError
from .loader import IMAGENET_MEAN, IMAGENET_STD, Loader
from .shards import Shards

__all__ = [
    "DdlError",
    "DistError",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "Loader",
    "ShardError",
    "Shards",
]
