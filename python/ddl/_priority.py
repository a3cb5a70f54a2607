"""The ``priority`` schedule of :class:`ddl.dist.DistributedOptimizer` (``comm_order=
"priority"``), as ddl-train's ``--comm-order priority`` runs it.

Buckets are reduced lowest priority number first (the first layers' buckets, handed over last
by backward), in chunks, so that a late first-layer bucket overtakes the head's chunks still
queued; ``step()`` returns without waiting, and the next forward applies each bucket's update
just before the first module that uses it runs (forward pre-hooks), waiting for that bucket
only. Which chunk comes next is agreed by every rank (``ddl._ddl.Negotiator``, ddl-comm's
negotiation: one small allreduce per chunk), since ranks finish their buckets in different
orders. The rounds of a step run as one job on the ddl communication thread, from the step's
first bucket until every rank has handed its whole step over; the rest is then reduced in
priority order without rounds (every rank holds every bucket still unreduced).
"""

import queue
import threading
from typing import Callable, List, Optional

import torch

from . import _ddl

class PrioritySchedule:
    """The buckets of one optimizer under the priority order: ``hand_over`` each bucket's flat
    gradient as backward completes it, ``finish_step`` once every bucket of the step is handed
    over, ``wait`` for a bucket's average before applying it."""

    def __init__(self, priorities: List[int], sizes: List[int], chunk: int, average: bool,
                 algorithm: str, start: Callable[[Callable[[], None]], object]) -> None:
        self._negotiator = _ddl.Negotiator(list(zip(priorities, sizes)), chunk, algorithm)
        self._average, self._algorithm = average, algorithm
        self._start = start
        self._flat: List[Optional[torch.Tensor]] = [None] * len(sizes)
        self._done = [threading.Event() for _ in sizes]
        for e in self._done:
            e.set()
        # This step's hand-overs, read by this step's job only: the last step's job may still
        # be finishing its rounds when this step's first buckets arrive.
        self._events: "Optional[queue.Queue[Optional[int]]]" = None
        self._error: Optional[BaseException] = None

    def hand_over(self, i: int, flat: torch.Tensor) -> None:
        """Bucket ``i``'s gradients of this step, flat, contiguous on the CPU (reduced in place
        into the average); starts the step's rounds with its first bucket."""
        self._flat[i] = flat
        self._done[i].clear()
        if self._events is None:
            self._events = queue.Queue()
            events = self._events
            self._start(lambda: self._serve(events))
        self._events.put(i)

    def finish_step(self) -> None:
        """Every bucket of this step is handed over."""
        if self._events is not None:
            self._events.put(None)
            self._events = None

    def wait(self, i: int) -> torch.Tensor:
        """Bucket ``i``'s average once it is reduced (raises the communication's error)."""
        self._done[i].wait()
        if self._error is not None:
            raise self._error
        flat = self._flat[i]
        assert flat is not None, "a bucket waited for before it was handed over"
        return flat

    def _reduce(self, i: int, start: int, end: int, last: bool) -> None:
        flat = self._flat[i]
        assert flat is not None
        part = flat[start:end]
        dtype = {torch.float32: "float32", torch.float16: "float16",
                 torch.bfloat16: "bfloat16"}[flat.dtype]
        _ddl.allreduce(part.data_ptr(), part.numel(), dtype, self._average, self._algorithm)
        if last:
            self._done[i].set()

    def _serve(self, events: "queue.Queue[Optional[int]]") -> None:
        """The step's rounds, on the communication thread (see the module doc)."""
        try:
            self._rounds(events)
            while (chunk := self._negotiator.next_rest()) is not None:
                self._reduce(*chunk[1:])
        except BaseException as e:  # every waiter raises it
            self._error = e
            for d in self._done:
                d.set()
            raise

    def _rounds(self, events: "queue.Queue[Optional[int]]") -> None:
        done = False
        while True:
            while True:
                try:
                    event = events.get_nowait()
                except queue.Empty:
                    break
                done = self._take(event, done)
            if not done and not self._negotiator.any_ready():
                # Nothing to offer: this rank is the one behind (every rank hands its buckets
                # over in the same order), and the others wait in the round until it catches
                # up. A rank that offers what the others lack goes to the next round at once.
                done = self._take(events.get(), done)
                continue
            kind, i, start, end, last = self._negotiator.negotiate(done)
            if kind == "exit":
                return
            if kind == "chunk":
                self._reduce(i, start, end, last)

    def _take(self, event: Optional[int], done: bool) -> bool:
        if event is None:
            return True
        self._negotiator.ready(event)
        return done


class DeferredUpdates:
    """The optimizer's side of the priority order: ``step()`` defers each bucket's update to
    the next forward, where a pre-hook of the first module using the bucket's parameters
    applies it (the wrapped optimizer stepped with only that bucket's gradients, at the
    hyper-parameters ``step()`` saw), or to :meth:`apply_all` (the model's ``state_dict``, the
    optimizer's, ``synchronize``)."""

    def __init__(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module,
                 buckets: List[List[torch.nn.Parameter]], *, chunk_bytes: int, average: bool,
                 algorithm: str, start: Callable[[Callable[[], None]], object]) -> None:
        self.optimizer = optimizer
        self.buckets = buckets
        order = {id(p): k for k, p in enumerate(model.parameters())}
        # The earliest parameter in forward (creation) order: backward hands it over last.
        self.priority = [min(order[id(p)] for p in b) for b in buckets]
        sizes = [sum(p.numel() for p in b) for b in buckets]
        element = buckets[0][0].element_size()
        chunk = max(1, chunk_bytes // element)
        self.schedule = PrioritySchedule(self.priority, sizes, chunk, average, algorithm, start)
        self.pending: set = set()
        self.hyper: List[dict] = []
        self.hooks = []
        bucket_of = {id(p): i for i, b in enumerate(buckets) for p in b}
        for module in model.modules():
            mine = sorted({bucket_of[id(p)] for p in module.parameters(recurse=False)
                           if id(p) in bucket_of}, key=lambda i: self.priority[i])
            if mine:
                self.hooks.append(module.register_forward_pre_hook(
                    lambda _m, _args, mine=mine: self.apply(mine)))
        self.hooks.append(model.register_state_dict_pre_hook(
            lambda *_args: self.apply_all()))

    def hand_over(self, i: int, flat: torch.Tensor) -> None:
        """Bucket ``i``'s gradients of a new step (its last step's update applied first)."""
        self.apply([i])
        self.schedule.hand_over(i, flat.cpu() if flat.is_cuda else flat)

    def defer(self) -> None:
        """``step()``: every bucket is handed over; their updates wait for the next forward."""
        self.schedule.finish_step()
        self.hyper = [{k: v for k, v in g.items() if k != "params"}
                      for g in self.optimizer.param_groups]
        self.pending = set(range(len(self.buckets)))

    def apply(self, buckets: List[int]) -> None:
        """Applies the pending updates of ``buckets``, each once it is reduced."""
        for i in buckets:
            if i in self.pending:
                self._apply(i)

    def apply_all(self) -> None:
        """Applies every pending update, the first layers' first."""
        self.apply(sorted(self.pending, key=lambda i: self.priority[i]))

    def _apply(self, i: int) -> None:
        flat = self.schedule.wait(i)
        groups = self.optimizer.param_groups
        grads = [(p, p.grad) for g in groups for p in g["params"]]
        now = [{k: v for k, v in g.items() if k != "params"} for g in groups]
        try:
            for p, _ in grads:
                p.grad = None
            offset = 0
            for p in self.buckets[i]:
                n = p.numel()
                p.grad = flat[offset:offset + n].view_as(p).to(p.device)
                offset += n
            for g, h in zip(groups, self.hyper):
                g.update(h)
            self.optimizer.step()
        finally:
            for g, h in zip(groups, now):
                g.update(h)
            for p, grad in grads:
                p.grad = grad
        self.pending.discard(i)
