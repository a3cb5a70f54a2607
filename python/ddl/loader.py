"""``ddl.Loader``: ddl's RAM-resident decoding pipeline as a PyTorch iterable."""

from __future__ import annotations

import operator
import os
import warnings
import weakref
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import (Any, Callable, Deque, Dict, Generator, Iterator, List, Optional, Sequence,
                    Tuple)

import numpy as np
import torch

from . import _ddl, _placement
from ._trace_records import RecordTrace
from .shards import Shards

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# torchvision's RandomResizedCrop and RandomHorizontalFlip defaults, and the 256-for-224 resize.
CROP_SCALE = (0.08, 1.0)
CROP_RATIO = (3.0 / 4.0, 4.0 / 3.0)
FLIP_P = 0.5
RESIZE_RATIO = 8.0 / 7.0

_LAYOUTS = ("NCHW", "NHWC")
_DEVICES = ("cpu", "cuda")
#: The output types by name; the pipeline makes float32 (normalised) or uint8 (raw) pixels.
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
           "uint8": torch.uint8}
_MEMORY_FORMATS = (torch.contiguous_format, torch.channels_last)
_U32 = 2**32 - 1
_U64 = 2**64 - 1


def _integer(name: str, value: Any, high: int = _U64, low: int = 0) -> int:
    """``value`` as an ``int``: any integral number (``int``, NumPy integers, anything with
    ``__index__``) from ``low`` to ``high``; bools and floats are refused (ValueError naming
    ``name``)."""
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name}: must be an integer, got the bool {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise ValueError(f"{name}: must be an integer (int or NumPy integer), got {value!r} "
                         f"of type {type(value).__name__}") from None
    if not low <= number <= high:
        top = {_U64: "2**64 - 1", _U32: "2**32 - 1"}.get(high, str(high))
        raise ValueError(f"{name}: must be an integer from {low} to {top}, got {number}")
    return number


def _fraction(name: str, value: Any) -> float:
    """``value`` as a ``float`` from 0 to 1 (any real number but a bool; ValueError naming
    ``name`` otherwise)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer,
                                                                     np.floating)):
        raise ValueError(f"{name}: must be a number from 0 to 1, got {value!r}")
    number = float(value)
    if not 0.0 <= number <= 1.0:  # NaN fails too
        raise ValueError(f"{name}: must be a fraction from 0 to 1 (0: each node keeps its "
                         f"records, 1: a global shuffle every epoch), got {number!r}")
    return number


def _trace_path(value: Any) -> str:
    """``trace_records`` as a ``str`` path: a ``str``, ``bytes`` (decoded as the file system
    does) or ``os.PathLike``; anything else raises TypeError naming the argument."""
    try:
        path = os.fspath(value)
    except TypeError:
        raise TypeError(f"trace_records: must be a path (str, bytes or os.PathLike) of the file "
                        f"to write the record trace to, got {value!r} of type "
                        f"{type(value).__name__}") from None
    return os.fsdecode(path)


def _check_exchange(exchange: float, split: str, place: "_placement.Placement") -> float:
    """The fraction the Rust loader exchanges: ``exchange``, or 0 where there is nothing to
    exchange (one node: a ``RuntimeWarning``). Refuses a val loader and several nodes without
    ``ddl.dist`` (the records travel over its transport)."""
    if exchange == 0.0:
        return 0.0
    if split == "val":
        raise ValueError(
            "exchange: only a shuffled train loader exchanges records between nodes; "
            "split='val' reads each node's own shards in order (leave exchange=0.0)")
    if place.nodes == 1:
        warnings.warn(f"ddl.Loader: exchange={exchange} exchanges nothing: the job has one "
                      "node, which holds every record", RuntimeWarning, stacklevel=3)
        return 0.0
    if place.source != "ddl.dist":
        why = ("the loader's rank and world_size are not ddl.dist's (leave them to it)"
               if _ddl.dist_initialized() else
               "it is not initialised (call ddl.dist.init() before making the loader)")
        raise RuntimeError(f"exchange={exchange}: the records move between the job's "
                           f"{place.nodes} nodes over ddl.dist's transport, but {why}")
    return exchange


def _output_dtype(dtype: Any) -> torch.dtype:
    """The ``dtype`` argument (a ``torch.dtype`` or its name) as a ``torch.dtype``."""
    found = _DTYPES.get(dtype) if isinstance(dtype, str) else dtype
    if not any(found is known for known in _DTYPES.values()):
        raise ValueError(f"dtype: {dtype!r} is not one of torch.float32, torch.bfloat16, "
                         "torch.float16, torch.uint8 (or their names)")
    return found


def _check_normalization(mean: Sequence[float], std: Sequence[float]) -> None:
    """Refuses ``mean``/``std`` of the 0-255 scale (FFCV's): on the 0-1 scale the loader
    uses, they would make every input nearly constant. Neither is above 1 on the 0-1 scale
    (a mean is a pixel value, a std of values in [0, 1] at most 0.5)."""
    if len(mean) != 3 or len(std) != 3:
        raise ValueError("mean, std: three channel values each")
    for name, values in (("mean", mean), ("std", std)):
        if any(float(v) > 1 for v in values):
            raise ValueError(
                f"{name}: {tuple(values)!r} is above 1, the 0-255 scale, but ddl.Loader normalises "
                "pixels on the 0-1 scale ((x / 255 - mean) / std): divide each value by 255, "
                f"e.g. {tuple(round(float(v) / 255, 4) for v in values)!r}")


#: Every loader not yet freed, for the reset of a forked child.
_LIVE: "weakref.WeakSet[Loader]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """In a child just forked: the loaders' threads stayed in the parent, so each live loader
    forgets its running epoch and starts new threads on its next iteration."""
    for loader in list(_LIVE):
        loader._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _end_exchanges() -> None:
    """Ends the record exchange of every live loader (``ddl.dist``'s exit, before its
    transport goes): a transfer in flight finishes first."""
    for loader in list(_LIVE):
        loader._end_exchange()


_binding_checked = False


def _warn_binding(workers: int) -> None:
    """Warns once per node (on its local rank 0) when ``ddl.dist`` is initialised and the
    launcher bound this rank to fewer CPUs than its ``workers`` decode threads and its training
    thread while the node's ranks leave CPUs unused (Open MPI's default binding)."""
    global _binding_checked
    if _binding_checked or not _ddl.dist_initialized():
        return
    _rank, _size, local_rank, *_rest = _ddl.dist_info()
    if local_rank != 0:
        return
    _binding_checked = True
    line = _ddl.dist_binding_warning(workers + 1)
    if line is not None:
        warnings.warn(f"ddl.Loader: {line}", RuntimeWarning, stacklevel=3)


def _pair(values: Sequence[float]) -> Tuple[float, float]:
    """A ``(lo, hi)`` argument as the extension takes it."""
    return float(values[0]), float(values[1])


def _to_output(images: torch.Tensor, dtype: torch.dtype,
               memory_format: Optional[torch.memory_format]) -> torch.Tensor:
    """``images`` as ``dtype`` in ``memory_format`` (None: as they are): one pass where they
    differ, ``images`` itself where not."""
    return images.to(dtype=dtype, memory_format=memory_format or torch.preserve_format)


def _tensor(array: Any) -> torch.Tensor:
    # numpy.asarray reads the array interface and keeps the Rust batch alive as the array's
    # base; torch.from_numpy keeps the array alive: no copy on the way.
    return torch.from_numpy(np.asarray(array))


class Loader:
    """Batches of one split of a ``ddl-pack`` shard directory, decoded and augmented on Rust
    threads (no worker processes, the GIL released while waiting).

    Each iteration yields ``(images, labels)``: ``images`` is a ``torch.Tensor`` of shape
    ``[B, 3, S, S]`` (``layout="NCHW"``) or ``[B, S, S, 3]`` (``"NHWC"``), float32 (or
    bfloat16 / float16) normalised with ``mean``/``std`` or raw uint8 RGB (``dtype=torch.uint8``);
    ``labels`` is int64 ``[B]``. float32 NCHW and uint8 tensors share memory with ddl's batch
    buffers: keep them as long as you like (they stay valid); once freed, their buffers are
    reused.

    Arguments (all but ``path`` keyword-only, as ``DataLoader``'s keyword arguments):
        path: directory written by ``ddl-pack`` (holds ``manifest.json``).
        split: ``"train"`` (random-resized crop and flip, shuffled) or ``"val"`` (resize to
            ``resize`` = ``ceil(resize_ratio S)`` and center crop, in order, every record
            exactly once over all ranks, never padded; see "Validation" below).
        batch_size: images per batch of this rank.
        image_size: output side S in pixels (changed per epoch by :meth:`set_image_size`).
        workers: decode threads of this rank (default 8); ``num_workers``, DataLoader's
            name, is accepted for it (threads here, not processes).
        seed: seed of the order and the augmentation (the same on every rank), 0 to 2**64 - 1.
        rank, world_size: this process's position; default: ``ddl.dist`` when initialised,
            else ``torch.distributed``, else the MPI / Slurm / torchrun environment, else 0/1.
            Ranks on one node share that node's shards (each node maps 1/nodes of them).
        drop_last: train only: drop the incomplete last step; ``False`` ends the epoch with a
            shorter batch, as ``DataLoader`` does (the same size on every rank, as with a
            ``DistributedSampler``).
        wrap: with ``drop_last=False``: complete the last batch by wrapping around to the
            start of the epoch's order instead (every batch full).
        dtype: ``torch.float32`` (normalised), ``torch.bfloat16`` or ``torch.float16`` (the
            normalised float32 values rounded to nearest, what autocast feeds the model), or
            ``torch.uint8`` (raw pixels, normalise on the GPU); their names are accepted too.
        layout: ``"NCHW"`` or ``"NHWC"`` (a view, never a copy).
        memory_format: with ``layout="NCHW"``: ``torch.channels_last`` (for a model in
            channels-last) or ``torch.contiguous_format``; None (default): float32 batches
            contiguous, uint8 channels-last (as decoded). Integer arguments accept any integral
            number (NumPy integers included).
        device: ``"cpu"`` or ``"cuda"``/``"cuda:N"``: batches are copied to the GPU from pinned
            memory on a side stream by a thread of the loader's, one batch ahead of the step
            that uses it.
        on_bad_record: ``"replace"`` (by the next good record of the epoch), ``"skip"`` (the
            batch is one shorter) or ``"fail"`` (raise ``ddl.DdlError``). Val never scores a
            stand-in: ``"replace"`` skips there.
        prefetch: ready batches queued ahead of the consumer.
        scale, ratio: train: ``RandomResizedCrop``'s area fraction range (``0 < lo <= hi <=
            1``) and aspect ratio range (``0 < lo <= hi``), torchvision's defaults.
        flip_p: train: probability of a horizontal flip (``RandomHorizontalFlip(p)``).
        mean, std: normalisation of float output on the 0-1 scale, ``(x / 255 - mean) / std``
            (``0 < std <= 1``, ``mean <= 1``): values on the 0-255 scale (FFCV's, e.g.
            ``(123.7, 116.3, 103.5)``) are refused; divide them by 255.
        resize: val only: shorter side before the center crop (0: ``ceil(resize_ratio S)``).
        resize_ratio: val only: the resize as a multiple of the image size (at least 1;
            ``8/7``: 256 for 224).
        populate: pre-fault this node's shards into RAM at start.
        trace_records: a path: each rank writes the records of every batch it delivers there,
            one JSON line per batch, ``{"epoch": E, "step": G, "rank": R, "replica": 0, "ids":
            [...]}`` (ddl-train's ``--trace-records`` format), to audit the data order: to
            ``trace_records`` itself in a job of one rank, to ``trace_records.<rank>`` in a job
            of several. See "Record trace" below.
        exchange: train: fraction ``Q`` (0 to 1) of every node's records that the nodes trade
            at each epoch boundary, as ``ddl-train --exchange Q`` ("partial local shuffling"):
            0 (default) keeps each node on its own shards, 1 is a global shuffle every epoch.
            Needs ``ddl.dist`` initialised on several nodes (the records travel over its
            transport, into ``/dev/shm``); on one node it exchanges nothing (a
            ``RuntimeWarning``). Collective: every rank makes its loader with the same value,
            and every rank iterates every epoch (as in DDP training), since each epoch's start
            waits until every node holds its records; the next epoch's records are received
            while this one is served. Refused for ``split="val"``.

    With ``ddl.dist`` initialised, the first loader of a node warns (``RuntimeWarning``) when
    the launcher bound its rank to fewer CPUs than ``workers + 1`` while the node's ranks leave
    CPUs unused: give each rank its share of the cores (``mpirun --map-by slot:PE=N``).

    Like a ``DataLoader`` with shuffle, iterating again after a completed epoch runs the next
    epoch (new order and augmentation); ``set_epoch(epoch)`` (as ``DistributedSampler`` has it)
    picks the epoch explicitly. ``state_dict()`` / ``load_state_dict()`` resume exactly
    mid-epoch (torchdata's ``Stateful`` protocol), also on another number of nodes or ranks
    (see :meth:`load_state_dict`). DataLoader's attributes: ``dataset``
    (:class:`ddl.Shards` of the split), ``sampler`` (``len``: this rank's share of the epoch,
    as ``DistributedSampler``'s), ``batch_size``, ``drop_last``, ``num_workers``; ``len()`` and
    the last batch as ``DataLoader``'s, for either ``drop_last``.

    Validation: every rank gets the same number of batches (``len()`` equal on every rank, so
    a DDP-wrapped model in eval runs the same forwards everywhere), and no record is dropped
    or repeated, unlike ``DistributedSampler``'s padding. Each rank gets ``floor`` or ``ceil``
    of ``records / ranks`` of its node's records: full batches while every rank can have one,
    then the records left shared evenly (the first ranks one more), so a rank's last batch is
    short. A rank left without records in that last step (fewer records left than ranks), or a
    node with fewer records (or none) than the largest node, gets empty batches (``[0, 3, S,
    S]`` images, ``[0]`` labels) for its remaining steps: torch's layers accept them, and a
    metric summed over ranks counts each record once.

    Lifetime: ``close()`` (or leaving ``with ddl.Loader(...) as loader:``) stops the threads and
    frees the buffers; iterating afterwards raises RuntimeError. A process forked after
    iterating (``os.fork``, multiprocessing's ``fork``) gets loaders whose next iteration
    starts new threads in the child, at the position the parent's loader had reached (the
    parent's threads do not exist there; their state is left, not freed, in the child).

    Record exchange (``exchange=Q``): each epoch, a node serves the records the placement
    gives it (its own shards in epoch 0; a fraction ``Q`` of them traded each epoch), so the
    ranks together still serve every record of the split once per epoch. ``stats()`` counts
    what moved. Epochs go forward as in training; going back to an earlier one computes its
    placement again and trades its records anew.

    Threads: ``stats()`` may be called from any thread at any time. A loader serves one
    iteration at a time: iterating it on a second thread while another iteration is under
    way raises ``RuntimeError`` (give each thread its own loader), and a newer ``iter()`` on
    the same thread supersedes the older iterator.

    ``batch_size``, ``image_size``, ``workers``, ``prefetch`` and ``resize`` have ddl-train's
    limits, and the batch buffers must fit in the memory available: a refusal is a
    ``ValueError`` naming the argument and the limit; so are augmentation values out of range.

    Progressive resizing: ``set_image_size(n)`` changes the output side from the next epoch
    on (the running one keeps its size); ``state_dict()`` carries both, so a resume on either
    side of the change yields the same batches.

    Record trace (``trace_records``): ``epoch`` is the epoch iterated (``set_epoch``'s, or
    the next one), ``rank`` this process's (``ddl.dist``'s rank when initialised, see ``rank``),
    ``ids`` the records' global ids in the batch's order (positions in the split,
    ``0..len(loader.dataset)``: ``loader.dataset[i]`` is record ``i``; padding rows, never
    delivered, are left out) and ``step`` the batch's global step, 1-based: ``epoch *
    len(loader) + i + 1`` for batch ``i`` (from 0) of the epoch, which is the count of batches
    delivered since epoch 0 when the epochs run in order, resumes included (as ddl-train numbers
    its steps). A batch is written when the loop receives it, not when it is staged ahead. The
    file is emptied at the first batch; a loader restored by ``load_state_dict`` instead keeps
    the lines up to the restored position (cutting those a process killed after saving its
    state wrote past it, and keeping the trace lines around any line that is not one, with a
    ``RuntimeWarning``) and appends; restored from a job of more ranks, rank 0 also cuts the
    files of the ranks this job lacks there. Lines reach the file at the end of each
    iteration, at ``state_dict()`` (so that a checkpoint's state has its lines on disk) and at
    ``close()``. The file is locked from the loader's construction to ``close()``: a second
    loader, or a ddl-train run, given the same path raises ValueError naming it. A forked child
    leaves the file to its parent and writes nothing.

    Output types and layouts: the pipeline writes float32 NCHW or uint8 NHWC; other types and
    memory formats are converted in one pass per batch (on the CPU into a new tensor; with
    ``device="cuda"`` by the copy into pinned memory that the transfer needs anyway, so half
    the bytes cross to the GPU for bfloat16 / float16).

    uint8 output (``dtype=torch.uint8``) leaves normalisation and any further augmentation to the
    GPU: apply ``torchvision.transforms.v2`` to the batch on the device (see
    ``examples/pytorch/train.py --gpu-augment``).

    Example::

        loader = ddl.Loader("shards/", split="train", batch_size=64, image_size=224)
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for images, labels in loader:
                ...
    """

    def __init__(
        self,
        path: "str | os.PathLike[str]",
        *,
        split: str = "train",
        batch_size: int = 64,
        image_size: int = 224,
        workers: Optional[int] = None,
        num_workers: Optional[int] = None,
        seed: int = 0,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        drop_last: bool = True,
        wrap: bool = False,
        dtype: "str | torch.dtype" = torch.float32,
        layout: str = "NCHW",
        memory_format: Optional[torch.memory_format] = None,
        device: "str | torch.device" = "cpu",
        on_bad_record: str = "replace",
        prefetch: int = 2,
        scale: Sequence[float] = CROP_SCALE,
        ratio: Sequence[float] = CROP_RATIO,
        flip_p: float = FLIP_P,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        resize: int = 0,
        resize_ratio: float = RESIZE_RATIO,
        populate: bool = False,
        trace_records: "str | os.PathLike[str] | None" = None,
        exchange: float = 0.0,
    ) -> None:
        if workers is not None and num_workers is not None:
            raise ValueError("workers, num_workers: give one (num_workers is DataLoader's "
                             "spelling of workers)")
        workers = _integer("workers" if num_workers is None else "num_workers",
                           8 if workers is None and num_workers is None else (
                               workers if workers is not None else num_workers))
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise FileNotFoundError(f"path: {path!r} is not a directory of ddl shards")
        if not os.path.exists(os.path.join(path, "manifest.json")):
            raise FileNotFoundError(
                f"path: {os.path.join(path, 'manifest.json')!r} not found (pack the images "
                "with ddl-pack first)"
            )
        if layout not in _LAYOUTS:
            raise ValueError(f"layout: {layout!r} is not one of {_LAYOUTS}")
        out_dtype = _output_dtype(dtype)
        if memory_format is not None and memory_format not in _MEMORY_FORMATS:
            raise ValueError(f"memory_format: {memory_format!r} is not torch.contiguous_format "
                             "or torch.channels_last")
        if memory_format is not None and layout != "NCHW":
            raise ValueError("memory_format: applies to layout=\"NCHW\" ([B, 3, S, S] "
                             "tensors); layout=\"NHWC\" is channels-last memory already")
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"device: {device!r} is not a device ({e})") from None
        if self.device.type not in _DEVICES:
            raise ValueError(f"device: {device!r} is not a CPU or CUDA device")
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device: {device!r} requested but CUDA is not available")
        # Types and the integers' widths here; the ranges (and the memory the batches take)
        # are checked by the Rust loader, with the same limits as ddl-train and ddl-prof.
        batch_size, prefetch = _integer("batch_size", batch_size), _integer("prefetch", prefetch)
        image_size, resize = _integer("image_size", image_size, _U32), _integer("resize", resize,
                                                                                _U32)
        seed = _integer("seed", seed)
        _check_normalization(mean, std)
        for name, pair in (("scale", scale), ("ratio", ratio)):
            if len(pair) != 2:
                raise ValueError(f"{name}: a (lo, hi) pair, got {pair!r}")
        if wrap and drop_last:
            raise ValueError("wrap: completes the last batch of drop_last=False; "
                             "drop_last=True has no last batch to complete")
        exchange = _fraction("exchange", exchange)
        place = _placement.current()
        if rank is not None or world_size is not None:
            size = place.world_size if world_size is None else _integer("world_size", world_size)
            me = place.rank if rank is None else _integer("rank", rank)
            if not 0 <= me < size:
                raise ValueError(f"rank, world_size: rank {me!r} of {size!r} is out of range")
            if size != place.world_size or me != place.rank:
                # Explicit positions: each rank its own node unless the launcher says otherwise.
                place = _placement.Placement(me, size, 0, 1, me, size, "arguments")
        if place.source == "ddl.dist" and rank is None and world_size is None:
            _placement.check_torch_world(place)
        moved = _check_exchange(exchange, split, place)
        self.placement = place
        trace_path = None if trace_records is None else _trace_path(trace_records)
        #: Fraction of every node's train records traded at each epoch boundary.
        self.exchange = exchange
        self.path, self.split, self.batch_size = path, split, batch_size
        self.drop_last = drop_last if split == "train" else False
        self._drop_last = drop_last  # as the Rust loader takes it (any split but val trains)
        self.wrap = wrap
        self.num_workers = workers
        self.image_size, self.dtype, self.layout = image_size, out_dtype, layout
        self.memory_format = memory_format
        self.seed = seed
        # By name: two arguments swapped cannot pass unnoticed.
        self._core: Optional[_ddl.Loader] = _ddl.Loader(
            path, split=split, batch_size=batch_size, image_size=image_size, workers=workers,
            seed=seed, node=place.node, nodes=place.nodes, rank_in_node=place.local_rank,
            ranks_in_node=place.local_size, drop_last=drop_last, wrap=wrap,
            dtype="uint8" if out_dtype == torch.uint8 else "float32", prefetch=prefetch,
            on_bad_record=on_bad_record, resize=resize, resize_ratio=float(resize_ratio),
            scale=_pair(scale), ratio=_pair(ratio), flip_p=float(flip_p),
            mean=[float(v) for v in mean], std=[float(v) for v in std], populate=populate,
            exchange=moved,
        )
        # Last: it takes the trace file's lock, which a loader refused above must not keep.
        self._trace = (None if trace_path is None
                       else RecordTrace(trace_path, place.rank, place.world_size))
        _LIVE.add(self)
        _warn_binding(workers)
        self._dataset: Optional[Shards] = None
        # The size asked for (from the next epoch on) and that of the epoch under way.
        self._epoch_image_size = image_size
        self._epoch = 0
        self._start_step = 0
        self._next_step = 0
        self._iterating = False
        self._completed = False

    @property
    def dataset(self) -> Shards:
        """The split's records as a map-style dataset (``len``: records of the split over all
        nodes), as ``DataLoader.dataset``; opened on first use."""
        if self._dataset is None:
            self._dataset = Shards(self.path, split=self.split)
        return self._dataset

    @property
    def sampler(self) -> "RankSampler":
        """This rank's share of the epoch, as ``DataLoader.sampler`` with a
        ``DistributedSampler`` (``len``: as ``DistributedSampler``'s, see
        :class:`RankSampler`)."""
        return RankSampler(self)

    @property
    def classes(self) -> List[str]:
        """The class wnids in label order (label ``i`` is ``classes[i]``)."""
        return self._live().classes

    @property
    def num_classes(self) -> int:
        """The number of classes."""
        return len(self.classes)

    def __len__(self) -> int:
        """Batches this rank gets per epoch (the same on every rank, val included). In an
        epoch resumed on another layout (:meth:`load_state_dict`): its remainder's batches."""
        return self._live().steps_per_epoch(self._current_epoch())

    def samples(self) -> int:
        """Images this rank gets per epoch (val: its share of every record exactly once)."""
        return self._live().samples_per_epoch(self._current_epoch())

    def _current_epoch(self) -> int:
        """The epoch under way, or the one the next iteration runs after a completed one."""
        if self._completed and not self._iterating:
            return self._epoch + 1
        return self._epoch

    def _live(self) -> _ddl.Loader:
        """The Rust loader, or RuntimeError once closed."""
        if self._core is None:
            raise RuntimeError("ddl.Loader: closed (by close() or the end of its with block): "
                               "make a new ddl.Loader to load again")
        return self._core

    def close(self) -> None:
        """Stops the decode threads and frees the batch buffers and this loader's mapping of
        the shards; batches already handed out stay valid. Iterating (or any other use)
        afterwards raises RuntimeError; closing again does nothing. ``with ddl.Loader(...) as
        loader:`` closes it at the end of the block."""
        if self._core is None:
            return
        self._core.stop()
        self._core.end_exchange()  # a transfer in flight ends first, the GIL released
        self._core = None
        self._iterating = False
        if self._trace is not None:
            self._trace.close()

    def _end_exchange(self) -> None:
        """Leaves the record exchange (before ddl.dist shuts down at the interpreter's exit)."""
        if self._core is not None:
            self._core.end_exchange()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _after_fork(self) -> None:
        """In a child just forked: forgets the parent's running epoch (its threads are not
        here) so that the next iteration starts new ones where the parent was."""
        if self._core is None:
            return
        self._core.forget_after_fork()
        if self._trace is not None:
            self._trace.forget_after_fork()
        if self._iterating:
            self._start_step, self._iterating = self._next_step, False

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch the next iteration runs (its order and augmentation). Without it,
        iterating again after a completed epoch runs the next epoch, as a shuffling
        ``DataLoader`` does; with it, the epoch given. A loader restored with
        ``load_state_dict`` resumes mid-epoch when set to the saved epoch. ``epoch``: an
        integer from 0 to 2**64 - 1."""
        epoch = _integer("epoch", epoch)
        if epoch != self._epoch:
            self._start_step = 0
        self._epoch = epoch
        self._completed = False

    def set_image_size(self, image_size: int) -> None:
        """Changes the output side from the next epoch on, for progressive resizing (FFCV's
        ResNet recipes grow it from 160 to 192 over the epochs): an epoch under way, or broken
        off and resumed, keeps the size it started with. Checked as ``image_size`` is (a
        ``ValueError`` names the limit)."""
        image_size = _integer("image_size", image_size, _U32)
        self._live().check_image_size(image_size)
        self.image_size = image_size

    def state_dict(self) -> Dict[str, Any]:
        """Where the loader is: the epoch and the batches of it already delivered (after a
        completed epoch: the next epoch, step 0), the image size of that epoch and of the
        epochs after it, what must match on resume (seed, batch size, split), and the layout
        that took the epoch's records (``world_size``, ``rank``, ``nodes``,
        ``ranks_per_node``, ``exchange``, ``drop_last``, ``wrap``), from which
        :meth:`load_state_dict` recomputes what the whole job served. In an epoch resumed on
        another layout, ``progress`` is what the epoch had served when its remainder began
        (``{"records": N, "words": [...]}``, bit ``i % 32`` of word ``i // 32`` is record
        ``i``), else None. ``data`` is the dataset's identity (``path``, ``fingerprint``: the
        crc32c of its manifest's classes and split, ``shards``, ``records``). Plain numbers,
        strings and lists: ``torch.save`` and JSON keep it. Writes the record trace's lines so
        far to its file (``trace_records``)."""
        if self._trace is not None:
            self._trace.flush()
        core = self._live()
        mid_epoch = False
        if self._completed and not self._iterating:
            epoch, step = self._epoch + 1, 0  # this epoch is done: resume with the next one
        else:
            epoch = self._epoch
            step = self._next_step if self._iterating else self._start_step
            mid_epoch = step > 0
        served = core.progress(epoch) if epoch <= _U64 else None
        mid_epoch = mid_epoch or served is not None  # a remainder keeps its epoch's size
        p = self.placement
        fingerprint, shards, records = core.data
        return {
            "epoch": epoch,
            "step": step,
            "image_size": self._epoch_image_size if mid_epoch else self.image_size,
            "next_image_size": self.image_size,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "world_size": p.world_size,
            "rank": p.rank,
            "split": self.split,
            "nodes": p.nodes,
            "ranks_per_node": p.local_size,
            "exchange": self.exchange,
            "drop_last": self._drop_last,
            "wrap": self.wrap,
            "progress": None if served is None else {"records": served[0],
                                                     "words": served[1]},
            "data": {"path": self.path, "fingerprint": f"{fingerprint:08x}", "shards": shards,
                     "records": records},
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resumes at ``state`` (a :meth:`state_dict` of any rank of the saved job).

        On the saved job's layout (same world size, nodes, ranks per node, ``exchange``,
        ``drop_last``, ``wrap``), the next iteration yields exactly the batches the saved
        loader had not yet delivered, at the saved epoch's image size, and later epochs at the
        size set then.

        On another layout (a train loader on another number of nodes or ranks, or another
        ``exchange``): exact elastic resume. The loader recomputes which records the whole
        saved job served of the interrupted epoch (every old rank's sampler over its node's
        records, for the steps taken), deals the records it had not served over this job's
        nodes (the same way on every rank, from the seed) and serves them in the rest of the
        epoch, each exactly once over all ranks, but for what the last incomplete step leaves
        out with ``drop_last=True`` (and the few records a node holds beyond the smallest
        node's). Each node reads its part from every shard of the directory. ``len()`` in that
        epoch is the remainder's batches (fewer than a full epoch's); the epochs after it are
        this layout's own. A state saved in such a remainder carries ``progress`` (what the
        epoch had served when the remainder began), so a second change of layout in the same
        epoch continues the same way.

        Raises ValueError when the state is of another dataset (its ``data`` fingerprint, say
        the same images packed into other shards: the message names both), when the seed,
        batch size or split differ, when a val loader's layout differs (its records per rank
        depend on it), or when a value is out of its range (``epoch`` 0 to 2**64 - 1,
        ``step`` within the saved epoch), before changing anything."""
        core = self._live()
        mine = self.state_dict()
        _check_same_data(state.get("data"), mine["data"], self.split)
        for key in ("seed", "batch_size", "split"):
            if state.get(key) != mine[key]:
                raise ValueError(
                    f"load_state_dict: {key} is {state.get(key)!r} in the state but "
                    f"{mine[key]!r} in this loader"
                )
        for key in ("epoch", "step"):
            if key not in state:
                raise ValueError(f"load_state_dict: the state has no {key!r} (not a state_dict() "
                                 "of a ddl.Loader)")
        epoch = _integer("load_state_dict: epoch", state["epoch"])
        step = _integer("load_state_dict: step", state["step"])
        # States of older versions lack the sizes: this loader's size then.
        sizes = [_integer(f"load_state_dict: {k}", state.get(k, self.image_size), _U32)
                 for k in ("image_size", "next_image_size")]
        for size in sizes:
            core.check_image_size(size)
        layout = self._saved_layout(state, mine)
        start = core.resume(epoch, step, nodes=layout["nodes"],
                            ranks_in_node=layout["ranks_per_node"],
                            exchange=layout["exchange"], drop_last=layout["drop_last"],
                            wrap=layout["wrap"], before=_saved_progress(state))
        core.stop()
        self._iterating = False
        self._completed = False
        self._epoch = epoch
        self._start_step = start
        self._epoch_image_size, self.image_size = sizes
        if self._trace is not None:
            self._trace.resume_after(epoch * len(self) + step, layout["world_size"])

    def _saved_layout(self, state: Dict[str, Any], mine: Dict[str, Any]) -> Dict[str, Any]:
        """The layout that took the saved epoch's records; ValueError when it differs from
        this loader's and this loader cannot resume on another (val), or when the state of an
        older ddl.Loader does not say it."""
        keys = ("world_size", "nodes", "ranks_per_node", "exchange", "drop_last", "wrap")
        if "nodes" not in state:  # older states: only the world size, which had to match
            if state.get("world_size") != mine["world_size"]:
                raise ValueError(
                    f"load_state_dict: world_size is {state.get('world_size')!r} in the state "
                    f"but {mine['world_size']!r} in this loader, and the state (of an older "
                    "ddl.Loader) does not say how its job took the records: resume it on its "
                    "world size")
            return {k: mine[k] for k in keys}
        layout = {}
        for key in keys:
            if key not in state:
                raise ValueError(f"load_state_dict: the state has no {key!r}")
            layout[key] = state[key]
        for key in ("world_size", "nodes", "ranks_per_node"):
            layout[key] = _integer(f"load_state_dict: {key}", layout[key], _U32, 1)
        layout["exchange"] = _fraction("load_state_dict: exchange", layout["exchange"])
        layout["drop_last"], layout["wrap"] = bool(layout["drop_last"]), bool(layout["wrap"])
        if layout["nodes"] * layout["ranks_per_node"] != layout["world_size"]:
            raise ValueError(f"load_state_dict: {layout['nodes']} nodes of "
                             f"{layout['ranks_per_node']} ranks are not world_size "
                             f"{layout['world_size']}")
        differ = [k for k in keys if layout[k] != mine[k]]
        if differ and self.split == "val":
            k = differ[0]
            raise ValueError(
                f"load_state_dict: {k} is {layout[k]!r} in the state but {mine[k]!r} in this "
                "loader; a val loader resumes only on the layout that saved it (its ranks' "
                "records depend on it): evaluate the epoch again")
        return layout

    def stats(self) -> Dict[str, Any]:
        """Since the first batch: ``images``, ``batches``, ``seconds``, ``images_per_s``,
        ``wait_s`` and ``wait_fraction`` (time the consumer waited for batches) and
        ``bad_records`` (``(file, record, reason)`` of each bad record met). With
        ``exchange``, over the epochs started so far: ``exchange_records_in`` /
        ``exchange_records_out`` and ``exchange_bytes_in`` / ``exchange_bytes_out`` (records
        and bytes this node received and sent) and ``exchange_transfer_s`` (seconds its
        transfers took), all counted on the node's first rank (0 on its others), and
        ``exchange_wait_s`` (seconds epoch starts waited for a transfer); all 0 without.
        Safe from any thread, also while another one iterates."""
        return dict(self._live().stats())

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        self._live()
        if self._completed:
            # The previous epoch ran to its end and set_epoch did not pin another: go on.
            self._epoch += 1
            self._start_step = 0
            self._completed = False
        if self.device.type == "cuda":
            # Converted to the output type and memory format by the copy into pinned memory.
            source = _to_cuda(self._batches(), self.device, self.dtype, self.memory_format)
        else:
            source = self._converted(self._batches())
        return self._deliver(source)

    def _converted(self, batches: Generator[Tuple[torch.Tensor, torch.Tensor, int], None, None]
                   ) -> Generator[Tuple[torch.Tensor, torch.Tensor, int], None, None]:
        """The batches in the output type and memory format: one conversion pass where they
        differ from the pipeline's, the pipeline's buffers themselves where not."""
        try:
            for images, labels, step in batches:
                yield _to_output(images, self.dtype, self.memory_format), labels, step
        finally:
            batches.close()

    def _batches(self) -> Generator[Tuple[torch.Tensor, torch.Tensor, int], None, None]:
        """The epoch's batches from ``_start_step`` on, with their steps, as CPU tensors. The
        loader serves one iteration at a time: a second one on another thread while this one
        runs raises RuntimeError, and this one ends when the generator does."""
        core = self._live()
        if self._start_step == 0 and core.progress(self._epoch) is None:
            self._epoch_image_size = self.image_size  # a new epoch takes the size asked for
        ticket = core.start(self._epoch, self._start_step, self._epoch_image_size)
        channels_first = self.dtype != torch.uint8
        want_first = self.layout == "NCHW"
        try:
            if core.node_records == 0:
                # Val on a node without records: as many (empty) batches as every other rank.
                yield from self._empty_batches(channels_first, want_first)
                return
            while True:
                item = core.next(ticket)
                if item is None:
                    return
                images, labels, indices, step = item
                if self._trace is not None:
                    self._trace.take(step, np.asarray(indices).tolist())
                images = _tensor(images)
                if channels_first != want_first:
                    images = (images.permute(0, 3, 1, 2) if want_first
                              else images.permute(0, 2, 3, 1))
                yield images, _tensor(labels), step
        finally:
            core.release(ticket)

    def _empty_batches(self, channels_first: bool, want_first: bool
                       ) -> Iterator[Tuple[torch.Tensor, torch.Tensor, int]]:
        """The epoch's remaining steps as batches of no images."""
        s = self._epoch_image_size
        first, last = (0, 3, s, s), (0, s, s, 3)
        shape = first if want_first else last
        dtype = torch.float32 if channels_first else torch.uint8
        for step in range(self._start_step, len(self)):
            if self._trace is not None:
                self._trace.take(step, [])
            yield torch.empty(shape, dtype=dtype), torch.empty(0, dtype=torch.int64), step

    def _deliver(self, source: Generator[Tuple[torch.Tensor, torch.Tensor, int], None, None]
                 ) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        """Hands batches to the caller, counting those delivered (for ``state_dict``) and
        writing them to the record trace."""
        self._next_step = self._start_step
        self._iterating = True
        self._completed = False
        trace, steps = self._trace, len(self)
        if trace is not None:
            trace.restart()
        try:
            for images, labels, step in source:
                self._next_step = step + 1
                if trace is not None:
                    trace.deliver(self._epoch, step, self._epoch * steps + step + 1)
                yield images, labels
        finally:
            source.close()  # a staging thread, if any, stops before the iteration ends
            # (After close() the position no longer matters.)
            finished = self._core is None or self._next_step >= len(self)
            self._iterating = False
            # A completed epoch is followed by the next when iterated again (unless
            # set_epoch says otherwise); a broken-off one resumes where the consumer stopped.
            self._start_step = 0 if finished else self._next_step
            self._completed = finished
            if trace is not None:
                trace.flush()
            # The pipeline stays: the next epoch reuses its threads and batch buffers.

    def __repr__(self) -> str:
        p = self.placement
        batches = "closed" if self._core is None else f"batches={len(self)}"
        return (
            f"ddl.Loader({self.path!r}, split={self.split!r}, batch_size={self.batch_size}, "
            f"image_size={self.image_size}, dtype={self.dtype}, layout={self.layout!r}, "
            f"memory_format={self.memory_format}, rank={p.rank}, world_size={p.world_size}, "
            f"nodes={p.nodes}, {batches})"
        )


def _check_same_data(saved: Any, mine: Dict[str, Any], split: str) -> None:
    """ValueError naming both datasets when a state's ``data`` is not this loader's (a state
    of an older ddl.Loader has none: nothing to compare)."""
    if saved is None:
        return
    def name(d: Dict[str, Any]) -> str:
        return (f"{d.get('path')!r} ({d.get('shards')} shards, {d.get('records')} records, "
                f"fingerprint {d.get('fingerprint')})")

    if not isinstance(saved, dict) or saved.get("fingerprint") != mine["fingerprint"]:
        described = name(saved) if isinstance(saved, dict) else repr(saved)
        raise ValueError(
            f"load_state_dict: the state is of another dataset: split {split!r} of "
            f"{described}, this loader reads {name(mine)}; its epoch's records are not these "
            "(resume on the data that saved it, or start the epoch over)")


def _saved_progress(state: Dict[str, Any]) -> Optional[Tuple[int, List[int]]]:
    """The state's ``progress`` as ``(records, words)`` (None when absent); ValueError when it
    is not the numbers :meth:`Loader.state_dict` writes."""
    progress = state.get("progress")
    if progress is None:
        return None
    try:
        records = _integer("load_state_dict: progress records", progress["records"])
        words = [_integer("load_state_dict: progress words", w, _U32) for w in progress["words"]]
    except (KeyError, TypeError) as e:
        raise ValueError(f"load_state_dict: progress: {progress!r:.80} is not a ddl.Loader's "
                         f"progress ({e!r})") from None
    return records, words


class RankSampler:
    """What ``DataLoader.sampler`` is to a script: ``len`` this rank's share of the epoch
    before batching, as a ``DistributedSampler`` counts it (``ceil(records / ranks)``, also
    with ``drop_last=True``, whose loader leaves the incomplete batch out; with ``wrap=True``
    every sample drawn; val: this rank's records), ``set_epoch`` passed on to its loader."""

    def __init__(self, loader: Loader) -> None:
        self._loader = loader

    def __len__(self) -> int:
        loader = self._loader
        return loader._live().sampler_len(loader._current_epoch())

    def set_epoch(self, epoch: int) -> None:
        """The loader's :meth:`Loader.set_epoch`."""
        self._loader.set_epoch(epoch)


class _StagingPool:
    """Reusable pinned host buffers for the copies to the GPU. A buffer goes back to the pool
    only once the copy that read it has completed (its event), so it is never overwritten
    while the GPU still reads it; with ``depth`` copies in flight, taking a buffer waits for
    the oldest. ``allocate(like)`` makes a buffer of ``like``'s shape, dtype and strides."""

    def __init__(self, depth: int, allocate: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.depth = depth
        self.allocate = allocate
        self.in_flight: Deque[Tuple[Any, List[torch.Tensor]]] = deque()
        self.free: List[torch.Tensor] = []

    def take(self, like: torch.Tensor) -> torch.Tensor:
        """A buffer shaped like ``like`` that no copy is reading."""
        while self.in_flight:
            done, buffers = self.in_flight[0]
            if not done.query():
                if len(self.in_flight) < self.depth:
                    break
                done.synchronize()  # depth copies in flight: wait for the oldest
            self.in_flight.popleft()
            self.free.extend(buffers)
        for i, buf in enumerate(self.free):
            if (buf.shape, buf.stride(), buf.dtype) == (like.shape, like.stride(), like.dtype):
                return self.free.pop(i)
        del self.free[: max(0, len(self.free) - 2 * self.depth)]  # shapes no longer asked for
        return self.allocate(like)

    def copying(self, done: Any, buffers: List[torch.Tensor]) -> None:
        """``buffers`` are read by a copy that has completed once ``done`` (an event) has."""
        self.in_flight.append((done, buffers))


class _StagedAhead:
    """Runs ``stage(images, labels, step)`` on each batch of ``batches`` on a thread of its own,
    one batch ahead of the consumer, so that staging batch n+1 (a copy into pinned memory, the
    copy to the GPU) overlaps the step on batch n, as DataLoader's pin-memory thread does. The
    batches themselves are taken on the consumer's thread: the loader's iteration belongs to it.
    An error raised by ``batches`` reaches the consumer after the batches before it."""

    def __init__(self, batches: Generator[Tuple[torch.Tensor, torch.Tensor, int], None, None],
                 stage: Callable[[torch.Tensor, torch.Tensor, int], Any]) -> None:
        self.batches = batches
        self.stage = stage
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="ddl-stage")
        self.ahead: Optional[Future] = None
        self._submit()

    def _submit(self) -> None:
        try:
            images, labels, step = next(self.batches)
        except StopIteration:
            self.ahead = None
        except BaseException as e:  # delivered in order, after the batch being staged
            self.ahead = Future()
            self.ahead.set_exception(e)
        else:
            self.ahead = self.worker.submit(self.stage, images, labels, step)

    def __iter__(self) -> "_StagedAhead":
        return self

    def __next__(self) -> Any:
        if self.ahead is None:
            raise StopIteration
        staged = self.ahead.result()
        self._submit()
        return staged

    def close(self) -> None:
        """Waits for the staging in flight, then ends ``batches`` (the iteration's end)."""
        self.worker.shutdown(wait=True, cancel_futures=True)
        self.ahead = None
        self.batches.close()


class _CudaStager:
    """Stages a batch for the GPU: a copy into a pinned buffer reused from batch to batch
    (pinning a new buffer per batch costs more than the copy), which also converts the images
    to ``dtype`` in ``memory_format`` (None: as they are), then a non-blocking copy on a side
    stream, whose completion the returned event marks."""

    def __init__(self, device: torch.device, dtype: torch.dtype,
                 memory_format: Optional[torch.memory_format]) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.pool = _StagingPool(
            2, lambda like: torch.empty_like(like, device="cpu", pin_memory=True))
        self.dtype, self.memory_format = dtype, memory_format

    def __call__(self, images: torch.Tensor, labels: torch.Tensor,
                 step: int) -> Tuple[torch.Tensor, torch.Tensor, int, Any]:
        # The pinned buffer's shape, type and strides (a meta tensor: nothing allocated).
        target = _to_output(images.to("meta"), self.dtype, self.memory_format)
        staged = [self.pool.take(like).copy_(t) for like, t in ((target, images),
                                                                (labels, labels))]
        with torch.cuda.stream(self.stream):
            on_gpu = [t.to(self.device, non_blocking=True) for t in staged]
            done = torch.cuda.Event()
            done.record(self.stream)
        self.pool.copying(done, staged)
        return on_gpu[0], on_gpu[1], step, done


def _to_cuda(batches: Generator[Tuple[torch.Tensor, torch.Tensor, int], None, None],
             device: torch.device, dtype: torch.dtype,
             memory_format: Optional[torch.memory_format]
             ) -> Generator[Tuple[torch.Tensor, torch.Tensor, int], None, None]:
    """The batches on ``device`` as ``dtype`` in ``memory_format``, staged one ahead; the
    consumer's stream waits for each copy."""
    ahead = _StagedAhead(batches, _CudaStager(device, dtype, memory_format))
    try:
        for images, labels, step, done in ahead:
            current = torch.cuda.current_stream(device)
            current.wait_event(done)
            images.record_stream(current)
            labels.record_stream(current)
            yield images, labels, step
    finally:
        ahead.close()
