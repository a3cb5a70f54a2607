"""``ddl.dist``: ddl's allreduce (multi-color, multi-dimensional ring, ring, halving/doubling
or MPI's own, chosen per call by a cost model) for PyTorch tensors and training loops.

Two ways to use it in a training script::

    import ddl.dist as dd
    dd.init()                     # under mpirun / srun, torchrun, or alone (1 rank)

    # 1. keep torch.distributed (gloo) for DDP's bookkeeping, let ddl reduce the gradients
    model = torch.nn.parallel.DistributedDataParallel(model)
    model.register_comm_hook(None, dd.allreduce_hook)

    # 2. or without torch.distributed at all (Horovod style)
    dd.broadcast_parameters(model)
    opt = dd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)

For a classifier head split by class over the ranks (:class:`ddl.nn.ShardedLinearCrossEntropy`),
:func:`all_gather_` and :func:`reduce_scatter_` exchange rows of a tensor that each rank owns
a part of.

Reductions run on one ddl communication thread, in the order they are submitted (the same
order on every rank), while backward goes on. CUDA tensors are staged through pinned host
memory. A rank that dies makes the others raise :class:`ddl.DistError` within the timeout
given to :func:`init` (under ``mpirun`` the launcher usually ends the job first), except
with ``algorithm="mpi"``, or ``"auto"`` at sizes where it picks ``mpi``: MPI_Allreduce blocks
with no timeout, so there only the launcher ends the job; under ``shm`` a peer whose process
exited is named within a tenth of a second. After a DistError the job cannot go on: exit, or
call :func:`abort`. After the shutdown at interpreter exit every call raises RuntimeError.
"""

import atexit
import datetime
import operator
import os
import queue
import secrets
import socket
import threading
from typing import (Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple,
                    Union)

import torch
import torch.distributed

from . import _ddl, _placement, _priority
from ._ddl import DistError

__all__ = [
    "DistError",
    "DistributedOptimizer",
    "abort",
    "all_gather_",
    "allreduce_",
    "allreduce_async_",
    "allreduce_hook",
    "backend",
    "barrier",
    "broadcast_",
    "broadcast_parameters",
    "init",
    "is_initialized",
    "local_rank",
    "local_size",
    "node",
    "nodes",
    "rank",
    "reduce_scatter_",
    "size",
]

#: The algorithms of :func:`allreduce_` (``"auto"`` first), as ddl's Rust side names them.
ALGORITHMS = tuple(_ddl.ALGORITHMS)
#: Each of :data:`ALGORITHMS` as ``(name, syntax, help)``: what follows ``name:`` in
#: ``syntax`` sets its parameters (``"multiring:4x2"``).
ALGORITHM_HELP = tuple(tuple(entry) for entry in _ddl.ALGORITHM_HELP)
#: The prefixes of the algorithms given with parameters (``"shm:"``...).
_WITH_PARAMETERS = tuple(f"{name}:" for name, syntax, _ in ALGORITHM_HELP if syntax != name)
#: The algorithms of :func:`all_gather_` and :func:`reduce_scatter_`.
SHARD_ALGORITHMS = tuple(_ddl.SHARD_ALGORITHMS)
_GradBucket = torch.distributed.GradBucket
_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def init(timeout: float = 60.0,
         cost_model: Optional[Union[str, "os.PathLike[str]"]] = None) -> None:
    """Starts ddl's communication, once per process (later calls return at once).

    The backend follows what launched the process: under ``mpirun`` / ``srun`` (or alone, a
    one-rank job) MPI, also beside an MPI already initialised by mpi4py (ddl then uses a
    duplicate of its world communicator and leaves finalising to mpi4py); under ``torchrun``
    (or any launcher setting RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
    MASTER_PORT) ddl's own TCP transport, with no MPI launcher: the ranks exchange their
    listening addresses through torch's TCPStore at MASTER_ADDR:MASTER_PORT (torchrun's agent
    serves it; otherwise rank 0 does, or ``torch.distributed``'s store if it is initialised
    already) and the ranks of one node (torchrun's GROUP_RANK, else the host name) still
    reduce through shared memory. An environment where both launchers' variables disagree
    raises ValueError naming both; so do ranks started with different world sizes, and a
    MASTER_ADDR or MASTER_PORT that is no address (naming the variable). A store that does
    not answer within ``timeout`` raises :class:`ddl.DistError` naming its address.

    When ``torch.distributed`` is initialised already, ddl.dist joins its world: with no
    launcher (``torch.multiprocessing.spawn`` and ``init_process_group(rank=...,
    world_size=...)``, as FFCV launches) the TCP backend at torch.distributed's rank and size,
    through its store; a launcher whose ranks disagree with torch.distributed's raises
    ValueError naming both sizes.

    ``timeout``: seconds after which a blocking operation waiting on a dead or stuck peer
    raises :class:`ddl.DistError` naming it. ``cost_model``: a model file written by
    ``mpirun ddl-bench calibrate`` in the job's layout; ``algorithm="auto"`` then runs, per
    size, the algorithm measured fastest there (without it, ``"auto"`` times the candidates
    on the first calls of each size class and every rank keeps the fastest). A file that
    cannot be read raises ValueError naming it.
    """
    first = not _ddl.dist_initialized()
    model = None if cost_model is None else os.fspath(cost_model)
    if first:
        backend, place = _placement.launcher(os.environ)
        env: Mapping[str, str] = os.environ
        joined = _torch_world()
        if joined is not None:
            backend, place, env = _join_torch(backend, place, joined)
        if backend == "tcp":
            _check_rendezvous(env)
            _init_tcp(float(timeout), model, place, env)
        else:
            _ddl.dist_init(float(timeout), model)
        atexit.register(_shutdown)
        if joined is not None and (rank(), size()) != joined:
            raise DistError(
                f"ddl.dist formed a world of {size()} ranks (this is rank {rank()}) but "
                f"torch.distributed has {joined[1]} ranks (this is rank {joined[0]}): start "
                "ddl.dist and torch.distributed with the same launcher and ranks")
    else:
        _ddl.dist_init(float(timeout), model)


def _torch_world() -> Optional[Tuple[int, int]]:
    """``(rank, size)`` of torch.distributed's default group when it is initialised."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return None


def _join_torch(backend: str, place: "Optional[_placement.Placement]",
                joined: Tuple[int, int]) -> Tuple[str, Any, Mapping[str, str]]:
    """The backend, placement and environment of a process whose torch.distributed is
    initialised at rank ``joined[0]`` of ``joined[1]``: an MPI launcher's or torchrun's own
    when they agree with torch.distributed (ValueError naming both otherwise); without a
    launcher (``torch.multiprocessing.spawn`` + ``init_process_group(rank=, world_size=)``)
    ddl's TCP backend at torch.distributed's rank and size, through its store."""
    rank_, size_ = joined
    launched = place is not None and (backend == "tcp" or place.source != "torchrun")
    if launched and (place.rank, place.world_size) != joined:
        raise ValueError(
            f"torch.distributed is initialised as rank {rank_} of {size_} ranks but "
            f"{place.source} launched this process as rank {place.rank} of {place.world_size} "
            "ranks: ddl.dist joins torch.distributed's world; give init_process_group the "
            "launcher's rank and world size")
    if launched or size_ == 1:
        return backend, place, os.environ
    env = dict(os.environ)
    if not (env.get("MASTER_ADDR") and env.get("MASTER_PORT")):
        # init_method="tcp://HOST:PORT": the route to the other ranks is the store's.
        store = torch.distributed.distributed_c10d._get_default_store()
        base = getattr(store, "_underlying_non_prefix_store", store)
        if not isinstance(base, torch.distributed.TCPStore):
            raise ValueError(
                f"torch.distributed is initialised with a {type(base).__name__} and MASTER_ADDR "
                "/ MASTER_PORT are unset: set them to the address of rank 0's machine and a "
                "port for ddl.dist to route from")
        env.update(MASTER_ADDR=base.host, MASTER_PORT=str(base.port))
    return "tcp", _placement.Placement(rank_, size_, 0, 1, 0, 1, "torch.distributed"), env


def _check_rendezvous(env: Mapping[str, str]) -> None:
    """Checks MASTER_ADDR and MASTER_PORT of ``env``: ValueError naming the variable, its
    value and the form expected when the port is not one or the host does not resolve."""
    host, port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not 1 <= number <= 65535:
        raise ValueError(
            f"MASTER_PORT={port!r} is not a TCP port: expected an integer from 1 to 65535 "
            "(the port of the rendezvous store on MASTER_ADDR)")
    try:
        socket.getaddrinfo(host, number, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as e:
        raise ValueError(
            f"MASTER_ADDR={host!r} does not resolve ({e}): expected the host name or IP "
            "address of rank 0's machine, which serves the rendezvous store") from None


#: The TCP backend's rendezvous store, kept for the life of the process.
_rendezvous: Optional["torch.distributed.Store"] = None


def _store(timeout: float, rank: int, world_size: int,
           env: Mapping[str, str]) -> "torch.distributed.Store":
    """The rendezvous store of the TCP backend, its keys under a ``ddl/`` prefix of this run."""
    run = f"ddl/{env.get('TORCHELASTIC_RUN_ID', 'run')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        base = torch.distributed.distributed_c10d._get_default_store()
    else:
        agent = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        base = _within(timeout, rank, env, lambda: torch.distributed.TCPStore(
            env["MASTER_ADDR"], int(env["MASTER_PORT"]), world_size,
            is_master=rank == 0 and not agent, timeout=datetime.timedelta(seconds=timeout),
            wait_for_workers=False))
    return torch.distributed.PrefixStore(run, base)


def _within(timeout: float, rank: int, env: Mapping[str, str],
            connect: Callable[[], "torch.distributed.Store"]) -> "torch.distributed.Store":
    """``connect()`` (a TCPStore's construction), given up after ``timeout`` seconds with a
    DistError naming MASTER_ADDR:MASTER_PORT: torch's TCPStore client waits for the server's
    answer to its handshake without its own timeout, so a port held by something that accepts
    and never answers blocked for minutes. The construction runs on a daemon thread (it
    releases the GIL), left behind if it never returns."""
    done: List[Any] = []

    def run() -> None:
        try:
            done.append((True, connect()))
        except BaseException as e:  # re-raised on the calling thread
            done.append((False, e))

    thread = threading.Thread(target=run, name="ddl-store-connect", daemon=True)
    thread.start()
    thread.join(timeout)
    if not done:
        raise DistError(
            f"ddl.dist.init on rank {rank}: the rendezvous store at MASTER_ADDR:MASTER_PORT = "
            f"{env['MASTER_ADDR']}:{env['MASTER_PORT']} did not answer within {timeout:g} s: "
            "check that rank 0 (or torchrun's agent) serves it there and that no other process "
            "holds that port")
    ok, value = done[0]
    if not ok:
        raise value
    return value


def _agree_on_world(store: "torch.distributed.Store", place: "_placement.Placement",
                    timeout: float) -> None:
    """Compares this rank's world size with the other ranks' through the store, before the
    ranks wait for each other's addresses: every rank checks rank 0's and rank 0 every other
    rank's, so that ranks started with different sizes (WORLD_SIZE 2 on one, 3 on another)
    all raise ValueError naming both, instead of waiting for a rank that never comes."""
    rank_, size_ = place.rank, place.world_size
    variable = "WORLD_SIZE" if place.source == "torchrun" else f"{place.source}'s world size"
    store.set(f"world_size/{rank_}", str(size_))
    for r in range(1, size_) if rank_ == 0 else [0]:
        try:
            store.wait([f"world_size/{r}"], datetime.timedelta(seconds=timeout))
        except (RuntimeError, torch.distributed.DistStoreError) as e:
            raise DistError(
                f"ddl.dist.init on rank {rank_}: rank {r} did not publish its world size within "
                f"{timeout:g} s at the rendezvous store ({e})") from None
        theirs = int(store.get(f"world_size/{r}").decode())
        if theirs != size_:
            raise ValueError(
                f"ddl.dist.init on rank {rank_}: {variable} is {size_} here but {theirs} on rank "
                f"{r}: start every rank with the same {variable}")


def _local_address(host: str, port: int) -> str:
    """The address of this machine on the route to ``host`` (where the other ranks reach it)."""
    family = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)[0][0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((host, port))
        return s.getsockname()[0]


def _init_tcp(timeout: float, model: Optional[str], place: "_placement.Placement",
              env: Mapping[str, str]) -> None:
    """Connects the ranks of a torchrun-style job with ddl's TCP transport."""
    rank, size = place.rank, place.world_size
    host = env.get("DDL_TCP_ADDR") or _local_address(env["MASTER_ADDR"], int(env["MASTER_PORT"]))
    mine = _ddl.dist_listen(host)
    store = _store(timeout, rank, size, env)
    _agree_on_world(store, place, timeout)
    node = f"group{env['GROUP_RANK']}" if env.get("GROUP_RANK") else socket.gethostname()
    global _rendezvous
    _rendezvous = store  # a store rank 0 serves must outlive every rank's reads
    if rank == 0:  # the job's secret, set before rank 0's address: whoever sees one has both
        store.set("secret", secrets.token_bytes(32))
    store.set(f"addr/{rank}", mine)
    peers = []
    for r in range(size):
        try:
            store.wait([f"addr/{r}"], datetime.timedelta(seconds=timeout))
        except (RuntimeError, torch.distributed.DistStoreError) as e:
            raise DistError(
                f"ddl.dist.init on rank {rank}: rank {r} did not publish its address within "
                f"{timeout:g} s at the store {env['MASTER_ADDR']}:{env['MASTER_PORT']} ({e})"
            ) from None
        peers.append(store.get(f"addr/{r}").decode())
    _ddl.dist_init_tcp(timeout, model, rank, peers, node, store.get("secret"))


def _shutdown() -> None:
    """At interpreter exit: finishes queued reductions, stops the communication thread and
    the loaders' record exchanges, then releases ddl's communicators (finalising MPI if ddl
    started it)."""
    global _comm
    with _comm_lock:
        comm, _comm = _comm, None
    if comm is not None:
        comm.jobs.put(None)
        comm.thread.join()
    from . import loader  # the loaders' record exchanges use the transport: they end first

    loader._end_exchanges()
    _ddl.dist_finalize()


def is_initialized() -> bool:
    """Whether :func:`init` has run in this process."""
    return _ddl.dist_initialized()


def backend() -> str:
    """The transport of the running job: ``"mpi"`` (mpirun, srun, or one rank alone) or
    ``"tcp"`` (torchrun and other launchers without MPI; every algorithm but ``mpi``)."""
    return _ddl.dist_backend()


def _info() -> tuple:
    return _ddl.dist_info()


def rank() -> int:
    """This process's rank in the job."""
    return _info()[0]


def size() -> int:
    """The number of ranks in the job."""
    return _info()[1]


def resolve(nbytes: int, algorithm: str = "auto") -> str:
    """The algorithm that ``algorithm`` runs for a tensor of ``nbytes`` bytes of float32
    (halves count as their float32 size): for ``"auto"`` what its tuning kept at that size
    class, or before it has, the cost model's pick (``shm`` only once a first reduction found
    the ranks sharing memory); another name
    returns itself with its parameters (``"multicolor"`` -> ``"multicolor:4:1048576"``)."""
    _check_algorithm(algorithm)
    return _ddl.dist_resolve(algorithm, operator.index(nbytes))


def local_rank() -> int:
    """This process's rank among the ranks of its node."""
    return _info()[2]


def local_size() -> int:
    """The number of ranks on this node."""
    return _info()[3]


def node() -> int:
    """The index of this process's node."""
    return _info()[4]


def nodes() -> int:
    """The number of nodes in the job."""
    return _info()[5]


def barrier() -> None:
    """Blocks until every rank has entered the barrier (after the reductions this rank
    submitted before it: the barrier runs on the ddl communication thread, in order)."""
    _comm_thread().run(_ddl.barrier)


def abort(code: int = 1) -> None:
    """Ends every process of the job with exit code ``code`` (MPI_Abort)."""
    _ddl.abort(int(code))


def _check_algorithm(algorithm: str) -> None:
    if algorithm not in ALGORITHMS and not algorithm.startswith(_WITH_PARAMETERS):
        raise ValueError(f"algorithm: {algorithm!r} is not one of {ALGORITHMS}")


def _reduce_host(t: torch.Tensor, average: bool, algorithm: str) -> None:
    """Reduces a contiguous CPU tensor in place (GIL released inside)."""
    _ddl.allreduce(t.data_ptr(), t.numel(), _DTYPES[t.dtype], average, algorithm)


class _Staging:
    """Reusable pinned (CUDA) or plain (non-contiguous CPU) host buffers, per dtype."""

    def __init__(self) -> None:
        self.buffers: Dict[torch.dtype, torch.Tensor] = {}

    def host(self, like: torch.Tensor) -> torch.Tensor:
        buf = self.buffers.get(like.dtype)
        if buf is None or buf.numel() < like.numel():
            buf = torch.empty(like.numel(), dtype=like.dtype,
                              pin_memory=like.is_cuda and torch.cuda.is_available())
            self.buffers[like.dtype] = buf
        return buf[: like.numel()]


def _producer_event(t: torch.Tensor) -> "Optional[torch.cuda.Event]":
    """For a CUDA tensor: an event recorded now on the calling thread's current stream (the
    one producing ``t``'s values), which the copy off the device waits for, whichever thread
    runs it; None for a CPU tensor."""
    if not t.is_cuda:
        return None
    ready = torch.cuda.Event()
    ready.record(torch.cuda.current_stream(t.device))
    return ready


def _on_host(t: torch.Tensor, staging: _Staging, ready: "Optional[torch.cuda.Event]",
             op: Callable[[torch.Tensor], None]) -> None:
    """Runs ``op`` on a contiguous host tensor holding ``t``'s values (``t`` itself when it
    is a contiguous CPU tensor), then puts the result back into ``t``. A CUDA tensor is
    copied off the device on a side stream once ``ready`` (the producer's event) has
    completed, and is back on it when this returns."""
    if t.is_cuda:
        host = staging.host(t)
        stream = torch.cuda.Stream(t.device)
        stream.wait_event(ready)
        with torch.cuda.stream(stream):
            host.copy_(t.reshape(-1), non_blocking=True)
            stream.synchronize()
            op(host)
            t.copy_(host.view_as(t), non_blocking=True)
            stream.synchronize()
    elif t.is_contiguous():
        op(t)
    else:
        host = staging.host(t)
        host.copy_(t.reshape(-1))
        op(host)
        t.copy_(host.view_as(t))


def _reduce_any(t: torch.Tensor, average: bool, algorithm: str, staging: _Staging,
                ready: "Optional[torch.cuda.Event]") -> None:
    """Reduces ``t`` in place wherever it lives (staged through host memory if needed)."""
    _on_host(t, staging, ready, lambda host: _reduce_host(host, average, algorithm))


def _validate(t: torch.Tensor, algorithm: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"tensor: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _DTYPES:
        raise TypeError(f"tensor: dtype {t.dtype} is not float32, float16 or bfloat16")
    if t.device.type not in ("cpu", "cuda"):
        raise TypeError(f"tensor: device {t.device} is not a CPU or CUDA device")
    _check_algorithm(algorithm)


class _CommThread:
    """The ddl communication thread: runs reductions in submission order."""

    def __init__(self) -> None:
        self.jobs: "queue.Queue[Optional[Callable[[], None]]]" = queue.Queue()
        self.staging = _Staging()
        # Held while a job runs, on this thread or inline on a caller's (see `run`).
        self.running = threading.Lock()
        # Jobs queued and not yet finished, under its own lock so that queueing never waits
        # for a running job.
        self.pending = 0
        self.counting = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="ddl-comm", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        # Jobs write into tensors that may require grad (parameters): no autograd here.
        with torch.no_grad():
            while True:
                job = self.jobs.get()
                if job is None:
                    return
                with self.running:
                    job()
                with self.counting:
                    self.pending -= 1

    def _put(self, job: Callable[[], None]) -> None:
        with self.counting:
            self.pending += 1
        self.jobs.put(job)

    def run(self, fn: Callable[[], Any]) -> Any:
        """Runs ``fn`` after every job queued before it and returns its result: inline on the
        calling thread when nothing is queued or running (no thread hand-off, which costs
        tens of microseconds per call), otherwise queued and waited for."""
        with self.running:
            with self.counting:
                idle = self.pending == 0
            if idle:
                with torch.no_grad():
                    return fn()
        return self.call(fn).wait()

    def call(self, fn: Callable[[], Any]) -> "torch.futures.Future":
        """Queues ``fn``; the future completes with its result (or its error)."""
        fut: torch.futures.Future = torch.futures.Future()

        def job() -> None:
            try:
                fut.set_result(fn())
            except BaseException as e:  # delivered to whoever waits on the future
                fut.set_exception(e)

        self._put(job)
        return fut

    def submit(self, t: torch.Tensor, average: bool, algorithm: str,
               then: Optional[Callable[[torch.Tensor], Any]] = None) -> "torch.futures.Future":
        """Queues a reduction of ``t``; the future completes with ``t`` (or its error)."""
        fut: torch.futures.Future = torch.futures.Future()
        # The reduction must see the values the current stream is still producing.
        ready = _producer_event(t)

        def job() -> None:
            try:
                _reduce_any(t, average, algorithm, self.staging, ready)
                fut.set_result(then(t) if then is not None else t)
            except BaseException as e:  # delivered to whoever waits on the future
                fut.set_exception(e)

        self._put(job)
        return fut


_comm: Optional[_CommThread] = None
_comm_lock = threading.Lock()


def _comm_thread() -> _CommThread:
    global _comm
    with _comm_lock:
        if _comm is None:
            _ddl.dist_require()  # RuntimeError: not initialised yet, or shut down
            _comm = _CommThread()
        return _comm


def allreduce_(tensor: torch.Tensor, average: bool = True,
               algorithm: str = "auto") -> torch.Tensor:
    """Sums ``tensor`` over all ranks in place (``average``: then divides by the rank count)
    and returns it. float32, float16 or bfloat16 (half types are reduced in float32 and
    rounded once), CPU or CUDA; results are bitwise identical on every rank. ``algorithm``:
    one of :data:`ALGORITHMS`, listed below from :data:`ALGORITHM_HELP`.
    Every rank must make the same calls in the same order, with tensors of the same size and
    dtype: ranks that differ all raise :class:`ddl.DistError` naming each rank's element
    count and dtype, before any tensor changes (the job may go on). The ranks compare their
    ``algorithm`` on their first call: ranks that chose differently all raise DistError
    naming each rank's choice."""
    _validate(tensor, algorithm)
    comm = _comm_thread()
    ready = _producer_event(tensor)

    def job() -> torch.Tensor:
        _reduce_any(tensor, average, algorithm, comm.staging, ready)
        return tensor

    return comm.run(job)


if allreduce_.__doc__:  # None under python -OO
    allreduce_.__doc__ += "\n\n    Algorithms (:data:`ALGORITHM_HELP`):\n\n" + "\n".join(
        f"    - ``{syntax}``: {text}" for _, syntax, text in ALGORITHM_HELP)


def allreduce_async_(tensor: torch.Tensor, average: bool = True,
                     algorithm: str = "auto") -> "torch.futures.Future":
    """As :func:`allreduce_`, on the ddl communication thread: returns a
    ``torch.futures.Future`` completed with ``tensor`` once it holds the result. Do not touch
    the tensor before then."""
    _validate(tensor, algorithm)
    return _comm_thread().submit(tensor, average, algorithm)


def _rows(tensor: torch.Tensor, counts: Optional[Sequence[int]]) -> List[int]:
    """Rows (along dim 0) of ``tensor`` each rank owns: ``counts``, or as even as possible
    (the first ``rows % size()`` ranks one more)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype != torch.float32:
        raise TypeError(f"tensor: dtype {tensor.dtype} is not float32")
    if tensor.device.type not in ("cpu", "cuda"):
        raise TypeError(f"tensor: device {tensor.device} is not a CPU or CUDA device")
    rows = tensor.shape[0] if tensor.dim() > 0 else 1
    p = size()
    if counts is None:
        base, extra = divmod(rows, p)
        return [base + (q < extra) for q in range(p)]
    counts = [operator.index(c) for c in counts]
    if len(counts) != p or any(c < 0 for c in counts) or sum(counts) != rows:
        raise ValueError(f"counts: {counts} are not {p} row counts adding up to the tensor's "
                         f"{rows} rows")
    return counts


def _check_shard_algorithm(algorithm: str) -> None:
    if algorithm not in SHARD_ALGORITHMS and not algorithm.startswith("shm:"):
        raise ValueError(f"algorithm: {algorithm!r} is not one of {SHARD_ALGORITHMS}")


def all_gather_(tensor: torch.Tensor, counts: Optional[Sequence[int]] = None, *,
                algorithm: str = "auto") -> torch.Tensor:
    """Fills every other rank's rows of ``tensor`` (along its first dimension) with that
    rank's, in place, and returns it: rank ``q`` owns ``counts[q]`` rows, in rank order (by
    default as even as possible), and its own rows are its input. float32, CPU or CUDA; every
    rank ends bitwise the same. ``algorithm``: ``auto`` (the cost model picks), ``ring``, or
    ``shm`` (the ranks of one node meet in shared memory). Every rank must make the same calls
    with the same ``counts`` and element count: ranks that differ all raise
    :class:`ddl.DistError` naming each rank's, before any tensor changes (as do
    :func:`reduce_scatter_`'s)."""
    rows = _rows(tensor, counts)
    _check_shard_algorithm(algorithm)
    comm = _comm_thread()
    ready = _producer_event(tensor)

    def job() -> torch.Tensor:
        _on_host(tensor, comm.staging, ready, lambda t: _ddl.sharded(
            "all_gather", t.data_ptr(), t.numel(), rows, algorithm))
        return tensor

    return comm.run(job)


def reduce_scatter_(tensor: torch.Tensor, counts: Optional[Sequence[int]] = None, *,
                    algorithm: str = "auto") -> torch.Tensor:
    """Sums ``tensor`` over all ranks into each rank's own rows (along its first dimension;
    rank ``q`` owns ``counts[q]`` rows, in rank order, by default as even as possible), in
    place, and returns the view of this rank's rows; the other rows are left undefined.
    float32, CPU or CUDA. ``algorithm`` as in :func:`all_gather_`."""
    rows = _rows(tensor, counts)
    _check_shard_algorithm(algorithm)
    comm = _comm_thread()
    first = sum(rows[:rank()])
    ready = _producer_event(tensor)

    def job() -> torch.Tensor:
        _on_host(tensor, comm.staging, ready, lambda t: _ddl.sharded(
            "reduce_scatter", t.data_ptr(), t.numel(), rows, algorithm))
        return tensor.narrow(0, first, rows[rank()]) if tensor.dim() > 0 else tensor

    return comm.run(job)


def _allreduce_max_(tensor: torch.Tensor, *, algorithm: str = "auto") -> torch.Tensor:
    """The element-wise maximum of ``tensor`` over all ranks, in place (float32), bitwise the
    same on every rank: a reduce-scatter with ``max`` and an allgather."""
    _rows(tensor, None)
    _check_shard_algorithm(algorithm)
    comm = _comm_thread()
    ready = _producer_event(tensor)

    def job() -> torch.Tensor:
        _on_host(tensor, comm.staging, ready, lambda t: _ddl.sharded(
            "allreduce_max", t.data_ptr(), t.numel(), [], algorithm))
        return tensor

    return comm.run(job)


def _check_root(root: int) -> int:
    """``root`` as a rank of this job (ValueError naming it otherwise)."""
    try:
        root = operator.index(root)
    except TypeError:
        raise TypeError(f"root: expected an int rank, got {type(root).__name__}") from None
    if not 0 <= root < size():
        raise ValueError(f"root: {root} is not a rank of {size()} ranks")
    return root


def broadcast_(tensor: torch.Tensor, root: int = 0) -> torch.Tensor:
    """Copies rank ``root``'s ``tensor`` into ``tensor`` on every rank (any dtype) and
    returns it. The ranks compare their tensors' sizes first: ranks that differ all raise
    :class:`ddl.DistError` naming each rank's size in bytes, before any tensor changes."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor: expected a torch.Tensor, got {type(tensor).__name__}")
    comm = _comm_thread()
    root = _check_root(root)
    # As allreduce_: the root's values may still be in the making on the current stream.
    ready = _producer_event(tensor)

    def send(host: torch.Tensor) -> None:
        _ddl.broadcast(host.data_ptr(), host.numel() * host.element_size(), root)

    def job() -> torch.Tensor:
        _on_host(tensor, comm.staging, ready, send)
        return tensor

    return comm.run(job)


def broadcast_parameters(model: "torch.nn.Module | Iterable[torch.Tensor]", root: int = 0) -> None:
    """Copies rank ``root``'s parameters and buffers (a module's ``state_dict`` or an
    iterable of tensors) to every rank, so that all replicas start from the same weights."""
    if isinstance(model, torch.nn.Module):
        tensors = list(model.state_dict().values())
    else:
        tensors = list(model)
    for t in tensors:
        broadcast_(t, root)


# No postponed annotations in this module: DDP's register_comm_hook compares the hook's
# annotations with the objects dist.GradBucket and Future[Tensor], not with strings.
def allreduce_hook(state: Any, bucket: _GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A DistributedDataParallel communication hook: averages each gradient bucket with
    ddl's allreduce on the ddl communication thread, overlapped with the rest of backward.

    ``model.register_comm_hook(None, ddl.dist.allreduce_hook)``; pass an algorithm name as
    the state (``register_comm_hook("multicolor", ...)``) to fix the algorithm."""
    algorithm = state if isinstance(state, str) else "auto"
    tensor = bucket.buffer()
    _validate(tensor, algorithm)
    return _comm_thread().submit(tensor, True, algorithm)


class DistributedOptimizer:
    """Wraps an optimizer so that gradients are averaged over all ranks with ddl's allreduce,
    bucket by bucket while backward still runs (no ``torch.distributed`` needed).

    Gradients are grouped in buckets of about ``bucket_cap_mb`` MiB in reverse parameter
    order (the order backward produces them); a bucket is submitted to the ddl communication
    thread once all its gradients exist and every earlier bucket has been submitted, so every
    rank submits the same buckets in the same order. One backward per step (no gradient
    accumulation).

    ``comm_order="fifo"``: the buckets are reduced whole, as submitted; ``step()`` waits for
    the reductions, then steps the wrapped optimizer. ``comm_order="priority"`` (MLSL's
    schedule, as ``ddl-train --comm-order priority``): the first layers' buckets go first, in
    chunks of ``chunk_bytes`` that every rank agrees on, and ``step()`` returns at once: each
    bucket's update is applied in the next forward, just before the first module using its
    parameters runs (a forward pre-hook), so that forward overlaps the rest of the allreduce.
    The weights are those of ``fifo`` (bitwise at 2 ranks, where cutting a bucket changes no
    sum). Under ``priority`` a parameter's ``.grad`` keeps this rank's gradient (the average
    is applied from ddl's buffer), ``step()`` takes no closure, and the updates still pending
    are applied by the model's ``state_dict()``, this optimizer's ``state_dict()`` and
    :meth:`synchronize`: call one of them before reading the weights otherwise.

    Example::

        opt = dd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
        dd.broadcast_parameters(model)
        loss.backward(); opt.step(); opt.zero_grad()
    """

    def __init__(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module,
                 average: bool = True, algorithm: str = "auto",
                 bucket_cap_mb: float = 25.0, *, comm_order: str = "fifo",
                 chunk_bytes: int = 4 << 20) -> None:
        _check_algorithm(algorithm)
        if comm_order not in ("fifo", "priority"):
            raise ValueError(f"comm_order: {comm_order!r} is not 'fifo' or 'priority'")
        if operator.index(chunk_bytes) < 4:
            raise ValueError(f"chunk_bytes: {chunk_bytes} is below 4 bytes (one float32)")
        _comm_thread()  # fails now, not in the middle of backward, when init() has not run
        self.optimizer = optimizer
        self.average, self.algorithm = average, algorithm
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("model: no parameters require gradients")
        cap = max(1, int(bucket_cap_mb * 2**20))
        self._buckets: List[List[torch.nn.Parameter]] = [[]]
        used = 0
        for p in reversed(params):
            nbytes = p.numel() * p.element_size()
            current = self._buckets[-1]
            if current and (used + nbytes > cap or current[0].dtype != p.dtype
                            or current[0].device != p.device):
                self._buckets.append([])
                used = 0
            self._buckets[-1].append(p)
            used += nbytes
        self._bucket_of = {id(p): i for i, b in enumerate(self._buckets) for p in b}
        self._lock = threading.Lock()
        self._reset()
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready) for p in params]
        self._deferred = None if comm_order == "fifo" else _priority.DeferredUpdates(
            optimizer, model, self._buckets, chunk_bytes=operator.index(chunk_bytes),
            average=average, algorithm=algorithm, start=_comm_thread().call)

    def _reset(self) -> None:
        self._ready = [0] * len(self._buckets)
        self._submitted = 0
        self._pending: List[tuple] = []

    def _grad_ready(self, p: torch.Tensor) -> None:
        with self._lock:
            i = self._bucket_of[id(p)]
            if i < self._submitted:
                raise RuntimeError(
                    "DistributedOptimizer: a second backward before step() (gradient "
                    "accumulation is not supported)"
                )
            self._ready[i] += 1
            while (self._submitted < len(self._buckets)
                   and self._ready[self._submitted] == len(self._buckets[self._submitted])):
                self._submit(self._submitted)

    def _submit(self, i: int) -> None:
        params = self._buckets[i]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self._submitted += 1
        if self._deferred is not None:
            self._deferred.hand_over(i, flat)
            return
        fut = _comm_thread().submit(flat, self.average, self.algorithm)
        self._pending.append((params, fut))

    def synchronize(self) -> None:
        """Submits buckets whose gradients never came (unused parameters: zeros) and waits
        until every gradient holds its average; under ``comm_order="priority"``, applies the
        updates that ``step()`` left to the next forward instead."""
        if self._deferred is not None:
            self._deferred.apply_all()
            return
        for params, fut in self._submit_rest():
            flat = fut.wait()
            offset = 0
            for p in params:
                n = p.numel()
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                p.grad.copy_(flat[offset:offset + n].view_as(p))
                offset += n

    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        """Waits for the gradient averages, then steps the wrapped optimizer; under
        ``comm_order="priority"``, leaves each bucket's update to the next forward."""
        if self._deferred is None:
            self.synchronize()
            return self.optimizer.step(closure)
        if closure is not None:
            raise ValueError("closure: not supported with comm_order='priority' (the update "
                             "is applied in the next forward)")
        self._submit_rest()
        self._deferred.defer()
        return None

    def _submit_rest(self) -> List[tuple]:
        """Submits the buckets whose gradients never came (unused parameters: zeros) and
        starts counting the next step's; returns this step's ``fifo`` reductions."""
        with self._lock:
            while self._submitted < len(self._buckets):
                self._submit(self._submitted)
            pending, self._pending = self._pending, []
            self._ready = [0] * len(self._buckets)
            self._submitted = 0
        return pending

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As the wrapped optimizer's ``zero_grad``."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @property
    def param_groups(self) -> List[Dict[str, Any]]:
        """The wrapped optimizer's parameter groups (for learning-rate schedules)."""
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:
        """The wrapped optimizer's state."""
        return self.optimizer.state

    def state_dict(self) -> Dict[str, Any]:
        """The wrapped optimizer's ``state_dict`` (pending updates applied first)."""
        if self._deferred is not None:
            self._deferred.apply_all()
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """As the wrapped optimizer's ``load_state_dict``."""
        self.optimizer.load_state_dict(state_dict)
