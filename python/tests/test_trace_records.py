"""ddl.Loader(trace_records=...): one JSON line per batch delivered, whose ids are the records
the batch holds (their labels are the batch's), every record once per epoch, one file per
rank, and a loader restored by load_state_dict continuing the file of the run it resumes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

import ddl


def lines(path: Path) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_lines_are_the_batches_yielded(shards: Path, tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    loader = ddl.Loader(shards, batch_size=8, image_size=32, workers=1, trace_records=path)
    records = ddl.Shards(shards, "train")
    steps = len(loader)
    labels = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        labels += [y.tolist() for _, y in loader]
    trace = lines(path)
    assert len(trace) == len(labels) == 2 * steps
    for i, (line, batch) in enumerate(zip(trace, labels)):
        assert list(line) == ["epoch", "step", "rank", "replica", "ids"]
        assert (line["epoch"], line["step"], line["rank"], line["replica"]) == (
            i // steps, i + 1, 0, 0)
        assert [records[j][1] for j in line["ids"]] == batch, f"batch {i}"
    for epoch in range(2):
        ids = [j for line in trace if line["epoch"] == epoch for j in line["ids"]]
        # 96 records in batches of 8: the epoch serves each once.
        assert sorted(ids) == list(range(len(records))), f"epoch {epoch}"
    assert [j for line in trace[:steps] for j in line["ids"]] != \
        [j for line in trace[steps:] for j in line["ids"]], "each epoch its own order"


def test_each_rank_writes_its_own_file(shards: Path, tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    for rank in range(2):
        with ddl.Loader(shards, batch_size=8, image_size=32, workers=1, rank=rank,
                        world_size=2, trace_records=path) as loader:
            assert len(list(loader)) == len(loader)
    assert not path.exists()
    trace = [lines(tmp_path / f"trace.jsonl.{rank}") for rank in range(2)]
    assert [{line["rank"] for line in t} for t in trace] == [{0}, {1}]
    ids = [j for t in trace for line in t for j in line["ids"]]
    assert len(ids) == len(set(ids)) == 2 * len(trace[0]) * 8
    assert max(ids) < len(ddl.Shards(shards, "train"))


def test_a_restored_loader_continues_the_trace(shards: Path, tmp_path: Path) -> None:
    """Broken off mid-epoch after its state was saved and two more batches delivered (and a
    line torn by a kill), the run restored from that state ends with the uninterrupted
    run's file."""
    full, cut = tmp_path / "full.jsonl", tmp_path / "cut.jsonl"
    kw: Dict[str, Any] = dict(batch_size=8, image_size=32, workers=1)
    with ddl.Loader(shards, trace_records=full, **kw) as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            for _ in loader:
                pass

    first = ddl.Loader(shards, trace_records=cut, **kw)
    steps = len(first)
    for _ in first:  # epoch 0
        pass
    it = iter(first)
    for _ in range(5):
        next(it)
    state = first.state_dict()
    assert lines(cut)[-1]["step"] == steps + 5, "state_dict() writes the lines so far"
    next(it), next(it)
    first.close()
    assert lines(cut)[-1]["step"] == steps + 7
    with cut.open("a") as f:
        f.write('{"epoch": 1, "st')

    second = ddl.Loader(shards, trace_records=cut, **kw)
    second.load_state_dict(state)
    for _ in second:
        pass
    second.close()
    assert cut.read_bytes() == full.read_bytes()


def test_an_unwritable_trace_names_the_file(shards: Path, tmp_path: Path) -> None:
    path = tmp_path / "missing" / "trace.jsonl"
    with pytest.raises(FileNotFoundError, match=str(path)):
        ddl.Loader(shards, batch_size=8, image_size=32, workers=1, trace_records=path)


def test_a_second_loader_of_the_same_trace_is_refused_naming_it(shards: Path,
                                                                 tmp_path: Path) -> None:
    """A train and a val loader given one path would overwrite each other's lines: the second
    is refused, naming the file, until the first is closed."""
    path = tmp_path / "trace.jsonl"
    kw: Dict[str, Any] = dict(batch_size=8, image_size=32, workers=1, trace_records=path)
    train = ddl.Loader(shards, **kw)
    with pytest.raises(ValueError, match=f"trace_records: record trace {path}: another run or "
                                         "loader is writing this file"):
        ddl.Loader(shards, split="val", **kw)
    next(iter(train))
    train.close()
    with ddl.Loader(shards, split="val", **kw) as val:
        batches = len(val)
        assert len(list(val)) == batches
    assert len(lines(path)) == batches, "the val loader's lines alone"


def test_a_trace_path_of_another_type_is_refused_by_name(shards: Path, tmp_path: Path) -> None:
    kw: Dict[str, Any] = dict(batch_size=8, image_size=32, workers=1)
    with pytest.raises(TypeError, match=r"trace_records: must be a path \(str, bytes or "
                                        r"os.PathLike\) .* got 3 of type int"):
        ddl.Loader(shards, trace_records=3, **kw)
    path = tmp_path / "bytes.jsonl"
    with ddl.Loader(shards, trace_records=os.fsencode(path), **kw) as loader:
        next(iter(loader))
    assert len(lines(path)) == 1


def test_a_restore_keeps_the_trace_lines_around_one_that_is_not(shards: Path,
                                                                  tmp_path: Path) -> None:
    """A line that is not a trace line before the restored step goes, with a RuntimeWarning
    naming it; the trace lines around it stay (they used to be cut off with it)."""
    path = tmp_path / "trace.jsonl"
    kw: Dict[str, Any] = dict(batch_size=8, image_size=32, workers=1, trace_records=path)
    with ddl.Loader(shards, **kw) as first:
        it = iter(first)
        for _ in range(4):
            next(it)
        state = first.state_dict()
        next(it)  # past the saved state
    text = path.read_text().splitlines(keepends=True)
    path.write_text("".join(text[:2] + ["not a trace line\n"] + text[2:]))
    with ddl.Loader(shards, **kw) as second:
        second.load_state_dict(state)
        with pytest.warns(RuntimeWarning, match=r"line\(s\) \[3\] are not trace lines"):
            next(iter(second))
    assert [line["step"] for line in lines(path)] == [1, 2, 3, 4, 5]


def test_a_restore_on_fewer_ranks_cuts_the_files_of_the_ranks_gone(shards: Path,
                                                                    tmp_path: Path) -> None:
    """States of 2 ranks (each its own node) after 2 batches, each rank having delivered a
    third: restored on one rank, rank 0 cuts both old files at the saved step, the departed
    rank's included (it used to keep its line past it)."""
    path = tmp_path / "trace.jsonl"
    kw: Dict[str, Any] = dict(batch_size=8, image_size=32, workers=1, seed=3,
                              trace_records=path)
    states = []
    for rank in range(2):
        with ddl.Loader(shards, rank=rank, world_size=2, **kw) as loader:
            it = iter(loader)
            next(it), next(it)
            states.append(loader.state_dict())
            next(it)
    with ddl.Loader(shards, **kw) as one:
        one.load_state_dict(states[0])
        next(iter(one))
    for rank in range(2):
        assert [line["step"] for line in lines(tmp_path / f"trace.jsonl.{rank}")] == [1, 2]
    assert len(lines(path)) == 1


def test_a_forked_child_leaves_the_trace_to_its_parent(shards: Path, tmp_path: Path) -> None:
    """The child of a fork mid-epoch iterates on, writing nothing (not even the lines its
    parent had buffered); the parent's file is what an unforked run writes."""
    code = """
import os, sys, ddl
L = ddl.Loader(sys.argv[1], batch_size=8, image_size=32, workers=1, trace_records=sys.argv[2])
it = iter(L)
next(it), next(it)
pid = os.fork()
if pid == 0:
    for _ in L:
        pass
    L.close()
    sys.exit(0)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, "child"
for _ in it:
    pass
L.close()
"""
    forked, plain = tmp_path / "forked.jsonl", tmp_path / "plain.jsonl"
    done = subprocess.run([sys.executable, "-c", code, str(shards), str(forked)], text=True,
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    with ddl.Loader(shards, batch_size=8, image_size=32, workers=1,
                    trace_records=plain) as loader:
        assert len(list(loader)) == len(loader)
    assert forked.read_bytes() == plain.read_bytes()
