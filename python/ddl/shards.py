"""``ddl.Shards``: the packed records, for users who bring their own transforms."""

from __future__ import annotations

import os
from typing import List, Tuple

from . import _ddl


class Shards:
    """Map-style access to every record of one split of a ``ddl-pack`` directory.

    ``shards[i]`` is ``(jpeg: bytes, label: int, height: int, width: int)`` (its checksum
    checked: a damaged record raises ``ddl.ShardError`` naming the shard file and record).
    Opening maps every shard and checks its header, index and size against the manifest.

    Example::

        shards = ddl.Shards("shards/", split="val")
        jpeg, label, h, w = shards[0]
        assert shards.verify() == []
    """

    def __init__(self, path: "str | os.PathLike[str]", split: str = "train") -> None:
        self.path, self.split = os.fspath(path), split
        self._core = _ddl.Shards(self.path, split)

    def __len__(self) -> int:
        return len(self._core)

    def __getitem__(self, i: int) -> Tuple[bytes, int, int, int]:
        return self._core[i]

    @property
    def classes(self) -> List[str]:
        """The class wnids in label order."""
        return self._core.classes

    @property
    def files(self) -> List[str]:
        """The shard files of the split, in order."""
        return [os.fspath(f) for f in self._core.files]

    def verify(self) -> List[Tuple[str, int, str]]:
        """Checks every record's checksum; returns ``(file, record, reason)`` for each damaged
        record (an empty list when all are intact)."""
        return self._core.verify()

    def __repr__(self) -> str:
        return f"ddl.Shards({self.path!r}, split={self.split!r}, records={len(self)})"
