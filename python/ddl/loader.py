"""``ddl.Loader``: ddl's RAM-resident decoding pipeline as a PyTorch iterable."""

from __future__ import annotations

import os
import warnings
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import (Any, Callable, Deque, Dict, Generator, Iterator, List, Optional, Sequence,
                    Tuple)

import numpy as np
import torch

from . import _ddl, _placement
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


def _tensor(array: Any) -> torch.Tensor:
    # numpy.asarray reads the array interface and keeps the Rust batch alive as the array's
    # base; torch.from_numpy keeps the array alive: no copy on the way.
    return torch.from_numpy(np.asarray(array))


class Loader:
    """Batches of one split of a ``ddl-pack`` shard directory, decoded and augmented on Rust
    threads (no worker processes, the GIL released while waiting).

    Each iteration yields ``(images, labels)``: ``images`` is a ``torch.Tensor`` of shape
    ``[B, 3, S, S]`` (``layout="NCHW"``) or ``[B, S, S, 3]`` (``"NHWC"``), float32 normalised
    with ``mean``/``std`` or raw uint8 RGB (``dtype="uint8"``); ``labels`` is int64 ``[B]``.
    Tensors share memory with ddl's batch buffers: keep them as long as you like (they stay
    valid); once freed, their buffers are reused.

    Arguments (all but ``path`` keyword-only, as ``DataLoader``'s keyword arguments):
        path: directory written by ``ddl-pack`` (holds ``manifest.json``).
        split: ``"train"`` (random-resized crop and flip, shuffled) or ``"val"`` (resize to
            ``resize`` = ``ceil(resize_ratio S)`` and center crop, in order, every record
            exactly once over all ranks; the last batch may be short).
        batch_size: images per batch of this rank.
        image_size: output side S in pixels (changed per epoch by :meth:`set_image_size`).
        workers: decode threads of this rank (default 8); ``num_workers``, DataLoader's
            name, is accepted for it (threads here, not processes).
        seed: seed of the order and the augmentation (the same on every rank).
        rank, world_size: this process's position; default: ``ddl.dist`` when initialised,
            else ``torch.distributed``, else the MPI / Slurm / torchrun environment, else 0/1.
            Ranks on one node share that node's shards (each node maps 1/nodes of them).
        drop_last: train only: drop the incomplete last step; ``False`` ends the epoch with a
            shorter batch, as ``DataLoader`` does (the same size on every rank, as with a
            ``DistributedSampler``).
        wrap: with ``drop_last=False``: complete the last batch by wrapping around to the
            start of the epoch's order instead (every batch full).
        dtype: ``"float32"`` (normalised) or ``"uint8"`` (raw pixels, normalise on the GPU).
        layout: ``"NCHW"`` or ``"NHWC"`` (a view, never a copy).
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
        mean, std: normalisation (0-1 scale) of float32 output (``std > 0``).
        resize: val only: shorter side before the center crop (0: ``ceil(resize_ratio S)``).
        resize_ratio: val only: the resize as a multiple of the image size (at least 1;
            ``8/7``: 256 for 224).
        populate: pre-fault this node's shards into RAM at start.

    With ``ddl.dist`` initialised, the first loader of a node warns (``RuntimeWarning``) when
    the launcher bound its rank to fewer CPUs than ``workers + 1`` while the node's ranks leave
    CPUs unused: give each rank its share of the cores (``mpirun --map-by slot:PE=N``).

    Like a ``DataLoader`` with shuffle, iterating again after a completed epoch runs the next
    epoch (new order and augmentation); ``set_epoch(epoch)`` (as ``DistributedSampler`` has it)
    picks the epoch explicitly. ``state_dict()`` / ``load_state_dict()`` resume exactly
    mid-epoch (torchdata's ``Stateful`` protocol). DataLoader's attributes: ``dataset``
    (:class:`ddl.Shards` of the split), ``sampler`` (``len``: this rank's share of the epoch,
    as ``DistributedSampler``'s), ``batch_size``, ``drop_last``, ``num_workers``; ``len()`` and
    the last batch as ``DataLoader``'s, for either ``drop_last``.

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

    uint8 output (``dtype="uint8"``) leaves normalisation and any further augmentation to the
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
        dtype: str = "float32",
        layout: str = "NCHW",
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
    ) -> None:
        if workers is not None and num_workers is not None:
            raise ValueError("workers, num_workers: give one (num_workers is DataLoader's "
                             "spelling of workers)")
        workers = 8 if workers is None and num_workers is None else (
            workers if workers is not None else num_workers)
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
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"device: {device!r} is not a device ({e})") from None
        if self.device.type not in _DEVICES:
            raise ValueError(f"device: {device!r} is not a CPU or CUDA device")
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device: {device!r} requested but CUDA is not available")
        # Types here; the ranges (and the memory the batches take) are checked by the Rust
        # loader, with the same limits as ddl-train and ddl-prof.
        for name, value in (("batch_size", batch_size), ("image_size", image_size),
                            ("workers", workers), ("prefetch", prefetch), ("resize", resize)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}: must be a non-negative integer, got {value!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed: must be a non-negative integer, got {seed!r}")
        if len(mean) != 3 or len(std) != 3:
            raise ValueError("mean, std: three channel values each")
        for name, pair in (("scale", scale), ("ratio", ratio)):
            if len(pair) != 2:
                raise ValueError(f"{name}: a (lo, hi) pair, got {pair!r}")
        if wrap and drop_last:
            raise ValueError("wrap: completes the last batch of drop_last=False; "
                             "drop_last=True has no last batch to complete")
        place = _placement.current()
        if rank is not None or world_size is not None:
            size = place.world_size if world_size is None else world_size
            me = place.rank if rank is None else rank
            if not (isinstance(me, int) and isinstance(size, int) and 0 <= me < size):
                raise ValueError(f"rank, world_size: rank {me!r} of {size!r} is out of range")
            if size != place.world_size or me != place.rank:
                # Explicit positions: each rank its own node unless the launcher says otherwise.
                place = _placement.Placement(me, size, 0, 1, me, size, "arguments")
        self.placement = place
        self.path, self.split, self.batch_size = path, split, batch_size
        self.drop_last = drop_last if split == "train" else False
        self.wrap = wrap
        self.num_workers = workers
        self.image_size, self.dtype, self.layout = image_size, dtype, layout
        self.seed = seed
        self._core = _ddl.Loader(
            path, split, batch_size, image_size, workers, seed, place.node, place.nodes,
            place.local_rank, place.local_size, drop_last, wrap, dtype, prefetch,
            on_bad_record, resize, float(resize_ratio), _pair(scale), _pair(ratio),
            float(flip_p), [float(v) for v in mean], [float(v) for v in std], populate,
        )
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
        return self._core.classes

    @property
    def num_classes(self) -> int:
        """The number of classes."""
        return len(self._core.classes)

    def __len__(self) -> int:
        """Batches this rank gets per epoch (the same on every rank for train)."""
        return self._core.steps_per_epoch()

    def samples(self) -> int:
        """Images this rank gets per epoch (val: its share of every record exactly once)."""
        return self._core.samples_per_epoch()

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch the next iteration runs (its order and augmentation). Without it,
        iterating again after a completed epoch runs the next epoch, as a shuffling
        ``DataLoader`` does; with it, the epoch given. A loader restored with
        ``load_state_dict`` resumes mid-epoch when set to the saved epoch."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch: must be a non-negative integer, got {epoch!r}")
        if epoch != self._epoch:
            self._start_step = 0
        self._epoch = epoch
        self._completed = False

    def set_image_size(self, image_size: int) -> None:
        """Changes the output side from the next epoch on, for progressive resizing (FFCV's
        ResNet recipes grow it from 160 to 192 over the epochs): an epoch under way, or broken
        off and resumed, keeps the size it started with. Checked as ``image_size`` is (a
        ``ValueError`` names the limit)."""
        if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 0:
            raise ValueError(f"image_size: must be a non-negative integer, got {image_size!r}")
        self._core.check_image_size(image_size)
        self.image_size = image_size

    def state_dict(self) -> Dict[str, Any]:
        """Where the loader is: the epoch and the batches of it already delivered (after a
        completed epoch: the next epoch, step 0), the image size of that epoch and of the
        epochs after it, plus what must match on resume (seed, batch size, world size, rank)."""
        mid_epoch = False
        if self._completed and not self._iterating:
            epoch, step = self._epoch + 1, 0  # this epoch is done: resume with the next one
        else:
            epoch = self._epoch
            step = self._next_step if self._iterating else self._start_step
            mid_epoch = step > 0
        return {
            "epoch": epoch,
            "step": step,
            "image_size": self._epoch_image_size if mid_epoch else self.image_size,
            "next_image_size": self.image_size,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "world_size": self.placement.world_size,
            "rank": self.placement.rank,
            "split": self.split,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resumes at ``state``: the next iteration yields exactly the batches the saved
        loader had not yet delivered, at the saved epoch's image size, and later epochs at the
        size set then. Raises ValueError when the seed, batch size, world size or split
        differ (those batches would not be the same)."""
        for key in ("seed", "batch_size", "world_size", "split"):
            mine = self.state_dict()[key]
            if state.get(key) != mine:
                raise ValueError(
                    f"load_state_dict: {key} is {state.get(key)!r} in the state but "
                    f"{mine!r} in this loader"
                )
        step = int(state["step"])
        if not 0 <= step <= len(self):
            raise ValueError(f"load_state_dict: step {step} beyond the epoch's {len(self)}")
        # States of older versions lack the sizes: this loader's size then.
        sizes = [int(state.get(k, self.image_size)) for k in ("image_size", "next_image_size")]
        for size in sizes:
            self._core.check_image_size(size)
        self._core.stop()
        self._iterating = False
        self._completed = False
        self._epoch = int(state["epoch"])
        self._start_step = step
        self._epoch_image_size, self.image_size = sizes

    def stats(self) -> Dict[str, Any]:
        """Since the first batch: ``images``, ``batches``, ``seconds``, ``images_per_s``,
        ``wait_s`` and ``wait_fraction`` (time the consumer waited for batches) and
        ``bad_records`` (``(file, record, reason)`` of each bad record met). Safe from any
        thread, also while another one iterates."""
        return dict(self._core.stats())

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        if self._completed:
            # The previous epoch ran to its end and set_epoch did not pin another: go on.
            self._epoch += 1
            self._start_step = 0
            self._completed = False
        source = self._batches()
        if self.device.type == "cuda":
            source = _to_cuda(source, self.device)
        return self._deliver(source)

    def _batches(self) -> Generator[Tuple[torch.Tensor, torch.Tensor, int], None, None]:
        """The epoch's batches from ``_start_step`` on, with their steps, as CPU tensors. The
        loader serves one iteration at a time: a second one on another thread while this one
        runs raises RuntimeError, and this one ends when the generator does."""
        if self._start_step == 0:
            self._epoch_image_size = self.image_size  # a new epoch takes the size asked for
        ticket = self._core.start(self._epoch, self._start_step, self._epoch_image_size)
        channels_first = self.dtype == "float32"
        want_first = self.layout == "NCHW"
        try:
            while True:
                item = self._core.next(ticket)
                if item is None:
                    return
                images, labels, _indices, step = item
                images = _tensor(images)
                if channels_first != want_first:
                    images = (images.permute(0, 3, 1, 2) if want_first
                              else images.permute(0, 2, 3, 1))
                yield images, _tensor(labels), step
        finally:
            self._core.release(ticket)

    def _deliver(self, source: Generator[Tuple[torch.Tensor, torch.Tensor, int], None, None]
                 ) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        """Hands batches to the caller, counting those delivered (for ``state_dict``)."""
        self._next_step = self._start_step
        self._iterating = True
        self._completed = False
        try:
            for images, labels, step in source:
                self._next_step = step + 1
                yield images, labels
        finally:
            source.close()  # a staging thread, if any, stops before the iteration ends
            finished = self._next_step >= len(self)
            self._iterating = False
            # A completed epoch is followed by the next when iterated again (unless
            # set_epoch says otherwise); a broken-off one resumes where the consumer stopped.
            self._start_step = 0 if finished else self._next_step
            self._completed = finished
            # The pipeline stays: the next epoch reuses its threads and batch buffers.

    def __repr__(self) -> str:
        p = self.placement
        return (
            f"ddl.Loader({self.path!r}, split={self.split!r}, batch_size={self.batch_size}, "
            f"image_size={self.image_size}, dtype={self.dtype!r}, layout={self.layout!r}, "
            f"rank={p.rank}, world_size={p.world_size}, nodes={p.nodes}, batches={len(self)})"
        )


class RankSampler:
    """What ``DataLoader.sampler`` is to a script: ``len`` this rank's share of the epoch
    before batching, as a ``DistributedSampler`` counts it (``ceil(records / ranks)``, also
    with ``drop_last=True``, whose loader leaves the incomplete batch out; with ``wrap=True``
    every sample drawn; val: this rank's records), ``set_epoch`` passed on to its loader."""

    def __init__(self, loader: Loader) -> None:
        self._loader = loader

    def __len__(self) -> int:
        return self._loader._core.sampler_len()

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
    (pinning a new buffer per batch costs more than the copy), then a non-blocking copy on a
    side stream, whose completion the returned event marks."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.pool = _StagingPool(2, lambda like: torch.empty_like(like, pin_memory=True))

    def __call__(self, images: torch.Tensor, labels: torch.Tensor,
                 step: int) -> Tuple[torch.Tensor, torch.Tensor, int, Any]:
        staged = [self.pool.take(t).copy_(t) for t in (images, labels)]
        with torch.cuda.stream(self.stream):
            on_gpu = [t.to(self.device, non_blocking=True) for t in staged]
            done = torch.cuda.Event()
            done.record(self.stream)
        self.pool.copying(done, staged)
        return on_gpu[0], on_gpu[1], step, done


def _to_cuda(batches: Generator[Tuple[torch.Tensor, torch.Tensor, int], None, None],
             device: torch.device) -> Generator[Tuple[torch.Tensor, torch.Tensor, int], None, None]:
    """The batches on ``device``, staged one ahead; the consumer's stream waits for each copy."""
    ahead = _StagedAhead(batches, _CudaStager(device))
    try:
        for images, labels, step, done in ahead:
            current = torch.cuda.current_stream(device)
            current.wait_event(done)
            images.record_stream(current)
            labels.record_stream(current)
            yield images, labels, step
    finally:
        ahead.close()
