"""The staging pool behind ``ddl.Loader(device="cuda")``: pinned buffers reused from batch to
batch, never while a copy may still read them. Run on the CPU with events whose completion the
test controls (the pool only calls ``query()`` and ``synchronize()`` on them)."""

from __future__ import annotations

from typing import List

import torch

from ddl.loader import _StagingPool


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
