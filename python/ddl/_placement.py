"""Where this process sits in the job: rank, world size, and the node layout.

The loader needs them to pick this node's shards and this rank's share of them; ``ddl.dist``
knows them exactly once initialised, otherwise they come from the launcher's environment.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional


@dataclass(frozen=True)
class Placement:
    """A process's position: global rank and size, rank and size within its node, node index
    and count. Ranks are assumed node-contiguous (``mpirun``'s and Slurm's block placement)
    when only the environment is known."""

    rank: int
    world_size: int
    local_rank: int
    local_size: int
    node: int
    nodes: int
    source: str


def _int(env: Mapping[str, str], *names: str) -> Optional[int]:
    for name in names:
        value = env.get(name)
        if value not in (None, ""):
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"environment variable {name}={value!r} is not an integer") from None
    return None


def _from_env(env: Mapping[str, str]) -> Optional[Placement]:
    """Open MPI, MPICH/Hydra (PMI), Slurm, or torchrun variables, in that order."""
    launchers = [
        ("Open MPI", ("OMPI_COMM_WORLD_RANK",), ("OMPI_COMM_WORLD_SIZE",),
         ("OMPI_COMM_WORLD_LOCAL_RANK",), ("OMPI_COMM_WORLD_LOCAL_SIZE",)),
        ("PMI", ("PMI_RANK", "PMIX_RANK"), ("PMI_SIZE",),
         ("MPI_LOCALRANKID", "PMI_LOCAL_RANK"), ("MPI_LOCALNRANKS", "PMI_LOCAL_SIZE")),
        ("Slurm", ("SLURM_PROCID",), ("SLURM_NTASKS",),
         ("SLURM_LOCALID",), ("SLURM_NTASKS_PER_NODE",)),
        ("torchrun", ("RANK",), ("WORLD_SIZE",),
         ("LOCAL_RANK",), ("LOCAL_WORLD_SIZE",)),
    ]
    for source, rank_vars, size_vars, local_rank_vars, local_size_vars in launchers:
        rank, size = _int(env, *rank_vars), _int(env, *size_vars)
        if rank is None or size is None:
            continue
        local_rank = _int(env, *local_rank_vars)
        local_size = _int(env, *local_size_vars)
        if local_rank is None or local_size is None:
            local_rank, local_size = 0, 1
        return _checked(rank, size, local_rank, local_size, source)
    return None


def _checked(rank: int, size: int, local_rank: int, local_size: int, source: str) -> Placement:
    if not (0 <= rank < size and 0 <= local_rank < local_size) or size % local_size:
        raise ValueError(
            f"{source}: rank {rank} of {size}, local rank {local_rank} of {local_size} "
            "is not a block layout of equal nodes"
        )
    return Placement(rank, size, local_rank, local_size, rank // local_size,
                     size // local_size, source)


def current() -> Placement:
    """The placement from ``ddl.dist`` when initialised, else ``torch.distributed`` (with the
    launcher's local rank), else the MPI / Slurm / torchrun environment, else one process."""
    from . import _ddl

    if _ddl.dist_initialized():
        rank, size, local_rank, local_size, node, nodes, _ = _ddl.dist_info()
        return Placement(rank, size, local_rank, local_size, node, nodes, "ddl.dist")
    env = _from_env(os.environ)
    try:
        import torch.distributed as tdist

        if tdist.is_available() and tdist.is_initialized():
            rank, size = tdist.get_rank(), tdist.get_world_size()
            if env is not None and env.world_size == size and env.rank == rank:
                return env
            return _checked(rank, size, 0, 1, "torch.distributed")
    except ImportError:
        pass
    if env is not None:
        return env
    return Placement(0, 1, 0, 1, 0, 1, "single process")
