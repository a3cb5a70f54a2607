"""``ddl.Loader(trace_records=PATH)``: the records of every batch a loader delivers, one JSON
line per batch, in ddl-train's ``--trace-records`` format (written by ``ddl._ddl.TraceRecords``;
the format: ``docs/TRACE_RECORDS.md``)."""

from __future__ import annotations

import os
from typing import Dict, List, Optional

from . import _ddl


class RecordTrace:
    """One rank's record trace of a loader: ``PATH`` for a job of one rank, ``PATH.<rank>``
    for several. The file is locked from the loader's construction to its close: a second
    loader (or a ddl-train run) given the same path raises ValueError naming it. A batch's ids
    are noted when the loader takes the batch from the pipeline (:meth:`take`) and written when
    the consumer receives it (:meth:`deliver`): a batch staged ahead (``device="cuda"``) and
    never delivered is never written. The file's content is first changed at the first
    delivery: emptied, or after :meth:`resume_after` cut after the restored step and appended
    to."""

    def __init__(self, path: "str | os.PathLike[str]", rank: int, world_size: int) -> None:
        self.path, self.rank, self.world_size = os.fspath(path), rank, world_size
        self._file: Optional[_ddl.TraceRecords] = _ddl.TraceRecords(
            self.path, rank=rank, world_size=world_size)
        self._started = False
        self._resumed_after: Optional[int] = None
        self._world_size_before = world_size
        self._taken: Dict[int, List[int]] = {}

    def resume_after(self, step: int, world_size_before: int) -> None:
        """The loader was restored at global step ``step`` of a job of ``world_size_before``
        ranks (``load_state_dict``): at the next delivery the file is cut after that step (the
        lines a run killed after its saved state wrote past it) and appended to, and rank 0
        cuts there the files of that job's ranks this job does not have."""
        if self._file is not None:
            self._file.restart()
        self._started = False
        self._resumed_after, self._world_size_before = step, world_size_before
        self._taken.clear()

    def restart(self) -> None:
        """A new iteration: forgets the batches taken by the last one and never delivered."""
        self._taken.clear()

    def take(self, step: int, ids: List[int]) -> None:
        """The batch of step ``step`` of the epoch holds records ``ids``."""
        self._taken[step] = ids

    def deliver(self, epoch: int, step: int, global_step: int) -> None:
        """Writes the line of the batch of step ``step`` (taken before) of ``epoch``, the
        ``global_step`` of the loader."""
        ids = self._taken.pop(step)
        if self._file is None:
            return
        if not self._started:
            self._file.start(self._resumed_after, self._world_size_before)
            self._started = True
        self._file.write(epoch, global_step, 0, ids)

    def flush(self) -> None:
        """Writes the buffered lines to the file."""
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        """Writes the buffered lines and closes the file (its lock released)."""
        if self._file is not None:
            self._file.close()
        self._file = None

    def forget_after_fork(self) -> None:
        """In a child just forked: the file stays the parent's; this process writes nothing to
        it (and not the lines the parent had buffered)."""
        if self._file is not None:
            self._file.forget_after_fork()
        self._file = None
