"""The staging behind ``ddl.Loader(device="cuda")``: pinned buffers reused from batch to batch,
never while a copy may still read them, and a thread that stages batch n+1 while the consumer
works on batch n. Run on the CPU: with events whose completion the test controls (the pool only
calls ``query()`` and ``synchronize()`` on them), and a staging function the test observes."""

from __future__ import annotations

import threading
from typing import Iterator, List, Tuple

import pytest
import torch

from ddl.loader import _StagedAhead, _StagingPool


class Event:
    """A copy's completion event, completed when the test (or a wait) says so."""

    def __init__(self) -> None:
        self.completed = False
        self.waited = False

    def query(self) -> bool:
        return self.completed

    def synchronize(self) -> None:
        self.waited = True
        self.completed = True


def pool(depth: int) -> "tuple[_StagingPool, List[torch.Tensor]]":
    made: List[torch.Tensor] = []

    def allocate(like: torch.Tensor) -> torch.Tensor:
        made.append(torch.empty_like(like))
        return made[-1]

    return _StagingPool(depth, allocate), made


def one_copy(p: _StagingPool, like: torch.Tensor) -> "tuple[torch.Tensor, Event]":
    """Takes a buffer and starts a copy from it; returns both."""
    buf = p.take(like)
    copy = Event()
    p.copying(copy, [buf])
    return buf, copy


def test_a_buffer_is_not_reused_while_its_copy_runs() -> None:
    p, made = pool(depth=2)
    like = torch.zeros(4, 3, 8, 8)
    first, copy = one_copy(p, like)
    second = p.take(like)  # the first copy still runs: a second buffer
    assert second is not first and len(made) == 2
    assert not copy.waited


def test_a_completed_copy_gives_its_buffer_back_without_waiting() -> None:
    p, made = pool(depth=2)
    like = torch.zeros(4, 3, 8, 8)
    first, copy = one_copy(p, like)
    copy.completed = True
    assert p.take(like) is first and len(made) == 1
    assert not copy.waited


def test_depth_copies_in_flight_wait_for_the_oldest() -> None:
    p, made = pool(depth=2)
    like = torch.zeros(2, 5)
    copies = [one_copy(p, like)[1] for _ in range(2)]
    again = p.take(like)  # two copies in flight: wait for the first, reuse its buffer
    assert copies[0].waited and not copies[1].waited
    assert again is made[0] and len(made) == 2


def test_a_long_run_allocates_depth_buffers_of_each_kind() -> None:
    p, made = pool(depth=2)
    images, labels = torch.zeros(8, 3, 4, 4).permute(0, 2, 3, 1), torch.zeros(8, dtype=torch.int64)
    for _ in range(50):
        staged = [p.take(t).copy_(t) for t in (images, labels)]
        p.copying(Event(), staged)
    assert len(made) == 4
    # Buffers keep the batch's strides (a permuted view stays one memcpy away) and dtype.
    assert {(b.stride(), b.dtype) for b in made} == {(images.stride(), images.dtype),
                                                     (labels.stride(), labels.dtype)}


def test_another_shape_gets_its_own_buffer() -> None:
    p, made = pool(depth=2)
    full, short = torch.zeros(8, 3), torch.zeros(5, 3)
    done = Event()
    done.completed = True
    p.copying(done, [p.take(full)])
    assert p.take(short).shape == short.shape
    assert p.take(full) is made[0]


def numbered(n: int, taken_on: List[int], closed: List[bool],
             fail_at: int = -1) -> Iterator[Tuple[torch.Tensor, torch.Tensor, int]]:
    """Batches 0..n-1 (images filled with the step), noting the thread that takes each."""
    try:
        for step in range(n):
            taken_on.append(threading.get_ident())
            if step == fail_at:
                raise ValueError(f"bad record in batch {step}")
            yield torch.full((2, 3), float(step)), torch.tensor([step, step]), step
    finally:
        closed.append(True)


class Stager:
    """Doubles the images, noting the thread of each staging and signalling each step staged."""

    def __init__(self, n: int) -> None:
        self.threads: List[int] = []
        self.staged = [threading.Event() for _ in range(n)]

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, step: int):
        self.threads.append(threading.get_ident())
        self.staged[step].set()
        return images * 2, labels, step


def test_batches_are_staged_on_a_thread_of_their_own_in_order() -> None:
    taken_on: List[int] = []
    closed: List[bool] = []
    stage = Stager(4)
    ahead = _StagedAhead(numbered(4, taken_on, closed), stage)
    out = list(ahead)
    ahead.close()
    assert [step for _, _, step in out] == [0, 1, 2, 3]
    assert all(torch.equal(images, torch.full((2, 3), 2.0 * s)) for images, _, s in out)
    me = threading.get_ident()
    assert set(taken_on) == {me}, "the loader's batches are taken on the consumer's thread"
    assert me not in stage.threads
    assert closed == [True]


def test_the_next_batch_is_staged_while_the_consumer_holds_this_one() -> None:
    stage = Stager(3)
    ahead = _StagedAhead(numbered(3, [], []), stage)
    assert next(ahead)[2] == 0
    # No further call: batch 1 is staged on the worker meanwhile.
    assert stage.staged[1].wait(timeout=30), "batch 1 was not staged ahead of the consumer"
    assert not stage.staged[2].is_set()
    ahead.close()


def test_an_error_reaches_the_consumer_after_the_batches_before_it() -> None:
    ahead = _StagedAhead(numbered(4, [], [], fail_at=2), Stager(4))
    assert [next(ahead)[2] for _ in range(2)] == [0, 1]
    with pytest.raises(ValueError, match="bad record in batch 2"):
        next(ahead)
    ahead.close()


def test_closing_early_ends_the_batches() -> None:
    closed: List[bool] = []
    ahead = _StagedAhead(numbered(10, [], closed), Stager(10))
    next(ahead)
    ahead.close()
    assert closed == [True]
    assert ahead.worker._shutdown  # no thread left behind
