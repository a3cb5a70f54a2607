"""Where this process sits in the job: rank, world size, and the node layout.

The loader needs them to pick this node's shards and this rank's share of them; ``ddl.dist``
knows them exactly once initialised, otherwise they come from the launcher's environment.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from typing import Mapping, Optional, Tuple


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


#: The MPI launchers' variables: (name, rank, size, local rank, local size).
_MPI_LAUNCHERS = [
    ("Open MPI", ("OMPI_COMM_WORLD_RANK",), ("OMPI_COMM_WORLD_SIZE",),
     ("OMPI_COMM_WORLD_LOCAL_RANK",), ("OMPI_COMM_WORLD_LOCAL_SIZE",)),
    ("PMI", ("PMI_RANK", "PMIX_RANK"), ("PMI_SIZE",),
     ("MPI_LOCALRANKID", "PMI_LOCAL_RANK"), ("MPI_LOCALNRANKS", "PMI_LOCAL_SIZE")),
]
#: torchrun's (and any launcher's that follows its convention, e.g. Kubeflow's PyTorchJob).
_TORCHRUN = ("torchrun", ("RANK",), ("WORLD_SIZE",), ("LOCAL_RANK",), ("LOCAL_WORLD_SIZE",))
#: What ddl.dist's TCP backend needs besides the positions: the rendezvous address.
_RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT")


def _launcher_placement(env: Mapping[str, str], launcher: tuple) -> Optional[Placement]:
    source, rank_vars, size_vars, local_rank_vars, local_size_vars = launcher
    rank, size = _int(env, *rank_vars), _int(env, *size_vars)
    if rank is None or size is None:
        return None
    local_rank = _int(env, *local_rank_vars)
    local_size = _int(env, *local_size_vars)
    if local_rank is None or local_size is None:
        local_rank, local_size = 0, 1
    return _checked(rank, size, local_rank, local_size, source)


def _slurm_placement(env: Mapping[str, str], alone: bool) -> Optional[Placement]:
    """The position srun gave this process, only inside a job step (a task that srun
    started, which has ``SLURM_STEP_ID``): a batch shell's ``SLURM_PROCID`` and
    ``SLURM_NTASKS`` describe the allocation, not a world this process belongs to. There a
    process that no other launcher started (``alone``) is a world of one, and says so when
    the allocation has several tasks. The node layout is the step's when every node runs as
    many of its tasks (``SLURM_STEP_TASKS_PER_NODE``: ``4(x2)``), else a node per task."""
    if "SLURM_STEP_ID" not in env:
        tasks = _int(env, "SLURM_NTASKS")
        if alone and tasks is not None and tasks > 1:
            warnings.warn(
                f"this process runs in the batch shell of Slurm job "
                f"{env.get('SLURM_JOB_ID', '?')}, not in a job step of its {tasks} tasks "
                "(SLURM_NTASKS): it is a world of one and a ddl.Loader serves it the whole "
                "split; start one process per task with `srun --mpi=pmix python ...`",
                RuntimeWarning)
        return None
    rank, size = _int(env, "SLURM_PROCID"), _int(env, "SLURM_STEP_NUM_TASKS")
    if rank is None or size is None:
        return None
    per_node = {m.group(1) if m else None for m in (
        re.fullmatch(r"(\d+)(\(x\d+\))?", part)
        for part in env.get("SLURM_STEP_TASKS_PER_NODE", "").split(","))}
    local_rank = _int(env, "SLURM_LOCALID")
    if len(per_node) != 1 or None in per_node or local_rank is None:
        return _checked(rank, size, 0, 1, "Slurm")
    return _checked(rank, size, local_rank, int(per_node.pop()), "Slurm")


def launcher(env: Mapping[str, str]) -> Tuple[str, Optional[Placement]]:
    """What started this process, as ``(backend, placement)``: ``"mpi"`` for an MPI launcher
    (mpirun, mpiexec, srun) or none at all, ``"tcp"`` for torchrun and other launchers that
    set RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT. An environment where an MPI launcher
    and torchrun's variables give different positions is refused (ValueError naming both):
    ranks would otherwise disagree on who they are without a word. Slurm's variables count
    only inside a job step (:func:`_slurm_placement`)."""
    mpi = next((p for p in (_launcher_placement(env, l) for l in _MPI_LAUNCHERS) if p), None)
    torchrun = _launcher_placement(env, _TORCHRUN)
    mpi = mpi or _slurm_placement(env, alone=torchrun is None)
    if mpi is not None and torchrun is not None and (
            mpi.rank, mpi.world_size) != (torchrun.rank, torchrun.world_size):
        raise ValueError(
            f"contradictory launch environment: {mpi.source} says rank {mpi.rank} of "
            f"{mpi.world_size} ranks, torchrun's RANK / WORLD_SIZE say rank {torchrun.rank} of "
            f"{torchrun.world_size}: start the script with one launcher (or unset the other's "
            "variables)")
    if mpi is not None and "TORCHELASTIC_RUN_ID" not in env:
        return "mpi", mpi
    if torchrun is not None and all(env.get(v) for v in _RENDEZVOUS):
        return "tcp", torchrun
    return "mpi", mpi or torchrun


def _from_env(env: Mapping[str, str]) -> Optional[Placement]:
    """The launcher's placement (see :func:`launcher`): Open MPI, MPICH/Hydra (PMI), Slurm or
    torchrun variables."""
    return launcher(env)[1]


def _checked(rank: int, size: int, local_rank: int, local_size: int, source: str) -> Placement:
    if not (0 <= rank < size and 0 <= local_rank < local_size) or size % local_size:
        raise ValueError(
            f"{source}: rank {rank} of {size}, local rank {local_rank} of {local_size} "
            "is not a block layout of equal nodes"
        )
    return Placement(rank, size, local_rank, local_size, rank // local_size,
                     size // local_size, source)


def check_torch_world(place: Placement) -> None:
    """Raises ValueError naming both worlds when ``torch.distributed`` is initialised with
    another rank or size than ``place`` (ddl.dist's): ``ddl.dist.init()`` called before
    ``init_process_group`` in processes started without a launcher
    (``torch.multiprocessing.spawn``) forms a world of one per process, and a loader dealing
    over it would give every process the whole split."""
    try:
        import torch.distributed as tdist
    except ImportError:
        return
    if not (tdist.is_available() and tdist.is_initialized()):
        return
    rank, size = tdist.get_rank(), tdist.get_world_size()
    if (rank, size) != (place.rank, place.world_size):
        raise ValueError(
            f"ddl.dist's world has {place.world_size} rank(s) (this is rank {place.rank}) but "
            f"torch.distributed's has {size} (this is rank {rank}): a loader dealing over "
            "ddl.dist's world would serve other records than the training expects. Call "
            "ddl.dist.init() after init_process_group (it then joins torch.distributed's "
            "world), or start both with the same launcher")


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
