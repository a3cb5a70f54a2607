"""Tests of ``ddl.Loader`` across nodes: the record exchange (``exchange=Q``) between emulated
nodes (one torchrun agent per node on this machine), and the exact elastic resume of a
``state_dict`` on another number of nodes or ranks.

The records each rank served are the global ids the Rust core hands out with each batch
(``RecordedIds`` of ``tests/scripts/_job.py``). The ``shards`` fixture holds 96 train records
in 4 shards of 24: two nodes hold 48 each, and batches of 8 leave nothing out on one or two
nodes of one rank. ``uneven`` holds the same records in 3 shards of 32, which do not divide
evenly over 2 nodes (64 and 32 at home): the nodes hold 48 each all the same.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Dict, List

import pytest

import ddl
from conftest import SCRIPTS, Job, torchrun_nodes

sys.path.insert(0, str(SCRIPTS))
from _job import RecordedIds  # noqa: E402

RECORDS = 96
#: Hang limit of each job (seconds): each needs well under a quarter of it.
LIMIT = 240


def ran(job: Job, ranks: int) -> None:
    """Fails with the job's output unless every rank printed its ok line."""
    assert job.returncode == 0, f"exit code {job.returncode}:\n{job.output}"
    assert job.stdout.count("loader_epochs ok") == ranks, job.output


def outputs(out: Path, ranks: int) -> List[Dict]:
    """What each rank of a ``loader_epochs.py`` job wrote, in rank order."""
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


def served(ranks: List[Dict], epoch: int, upto: str = "") -> List[int]:
    """Every id the ranks served in ``epoch`` (only those before the saved state with
    ``upto="before"``, only those after it with ``"after"``)."""
    ids = []
    for r in ranks:
        mine = r["ids"][str(epoch)]
        at = r.get("saved_at", len(mine))
        ids += {"": mine, "before": mine[:at], "after": mine[at:]}[upto]
    return ids


def once(ids: List[int]) -> set:
    """``ids`` as a set, failing when one is there twice."""
    assert len(set(ids)) == len(ids), "a record served twice"
    return set(ids)


def rest_of_epoch(loader: ddl.Loader, epoch: int) -> List[int]:
    """The ids ``loader`` serves in the rest of ``epoch``."""
    core = loader._core
    rec = core if isinstance(core, RecordedIds) else RecordedIds(loader)
    rec.ids = []
    loader.set_epoch(epoch)
    for _ in loader:
        pass
    return rec.ids


def loader(shards: Path, rank: int = 0, world_size: int = 1) -> ddl.Loader:
    """A loader of this process at ``rank`` of ``world_size`` (each rank its own node, no
    ddl.dist), with the settings of ``loader_epochs.py``."""
    return ddl.Loader(shards, batch_size=8, image_size=16, workers=1, seed=3, rank=rank,
                      world_size=world_size)


# 1. exchange=Q --------------------------------------------------------------------------------

@pytest.mark.parametrize("q,per_node,data", [(0.25, 2, "shards"), (1.0, 1, "uneven")])
def test_exchange_moves_records_between_nodes_and_serves_each_once(
        request: pytest.FixtureRequest, tmp_path: Path, q: float, per_node: int,
        data: str) -> None:
    """On 2 nodes of ``per_node`` ranks, every epoch's batches over all ranks hold every record
    of the split exactly once; each node serves its own shards in epoch 0 (3 shards: evened
    out, 16 records of node 0's shards served by node 1) and other records later (the sets
    change every epoch, by about Q / 2 of them); the leaders count what they received and
    sent, and both sides agree."""
    ranks = 2 * per_node
    path = request.getfixturevalue(data)
    job = torchrun_nodes(2, per_node, "loader_epochs.py",
                         [path, tmp_path, "--exchange", q, "--last-epoch", 3], timeout=LIMIT)
    ran(job, ranks)
    outs = outputs(tmp_path, ranks)
    node_sets = []
    for epoch in range(4):
        assert once(served(outs, epoch)) == set(range(RECORDS)), f"epoch {epoch}"
        node_sets.append([set().union(*(o["ids"][str(epoch)] for o in outs if o["node"] == n))
                          for n in range(2)])
    if data == "shards":
        assert node_sets[0][0] == set(range(24)) | set(range(48, 72))  # shards 0 and 2
    else:
        assert [len(s) for s in node_sets[0]] == [48, 48]
        assert len(node_sets[0][1] - set(range(32, 64))) == 16  # not of its shard 1
    for epoch in range(1, 4):
        for n in range(2):
            moved = len(node_sets[epoch][n] - node_sets[epoch - 1][n])
            assert 0 < moved <= 48 * q, (epoch, n, moved)
    leaders = [o["stats"] for o in outs if o["local_rank"] == 0]
    assert len(leaders) == 2
    got = sum(s["exchange_records_in"] for s in leaders)
    assert got == sum(s["exchange_records_out"] for s in leaders) > 0
    assert sum(s["exchange_bytes_in"] for s in leaders) > 0


def test_an_exchanging_loader_refuses_a_locked_fork_and_ranks_at_other_epochs(
        shards: Path) -> None:
    """Two nodes exchanging records: a process forked while another of its threads waits in
    the loader for the other node gets a loader that raises RuntimeError saying why (before:
    its first use blocked forever); ranks starting different epochs raise ValueError naming
    each rank's epoch (before: "timed out waiting for peer 1" after the timeout)."""
    job = torchrun_nodes(2, 1, "loader_misuse.py", [shards], timeout=LIMIT)
    assert job.returncode == 0, job.output
    assert job.stdout.count("loader_misuse ok") == 2, job.output


def test_exchange_arguments_are_checked(shards: Path) -> None:
    """Out of range or not a number: ValueError naming ``exchange``; a val loader refuses;
    several nodes without ddl.dist: RuntimeError saying to initialise it; one node: a
    warning, and the loader works as without."""
    for bad in (-0.1, 1.5, float("nan"), True, "0.5"):
        with pytest.raises(ValueError, match="exchange"):
            ddl.Loader(shards, batch_size=4, image_size=16, exchange=bad)
    with pytest.raises(ValueError, match="exchange: only a shuffled train loader"):
        ddl.Loader(shards, split="val", batch_size=4, image_size=16, exchange=0.5)
    with pytest.raises(RuntimeError, match=r"ddl.dist.init\(\)"):
        ddl.Loader(shards, batch_size=4, image_size=16, rank=0, world_size=2, exchange=0.5)
    with pytest.warns(RuntimeWarning, match="one node"):
        loader = ddl.Loader(shards, batch_size=8, image_size=16, workers=1, exchange=0.5)
    assert loader.exchange == 0.5 and len(loader) == 12
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ddl.Loader(shards, batch_size=8, image_size=16, workers=1, exchange=0)


# 2. elastic resume ----------------------------------------------------------------------------

def test_two_nodes_stopped_mid_epoch_resume_on_one_rank(uneven: Path, tmp_path: Path) -> None:
    """2 nodes (exchanging a quarter of their records, on shards that do not divide evenly
    over them) stop after 2 steps of epoch 1; one rank restored from either node's state
    serves exactly the 64 records they had not served (in 8 batches, ``len()`` of that epoch),
    then full epochs of its own. Stopped again in that remainder, a one-rank loader restored
    from its state continues that remainder exactly."""
    job = torchrun_nodes(2, 1, "loader_epochs.py",
                         [uneven, tmp_path, "--exchange", 0.25, "--last-epoch", 1,
                          "--stop", "1:2", "--break"], timeout=LIMIT)
    ran(job, 2)
    outs = outputs(tmp_path, 2)
    before = once(served(outs, 1, "before"))
    assert len(before) == 32
    states = [o["state"] for o in outs]
    assert states[0]["world_size"] == 2 and states[0]["nodes"] == 2
    rests = []
    for state in states:
        one = loader(uneven)
        one.load_state_dict(state)
        assert len(one) == 8
        rests.append(rest_of_epoch(one, 1))
        assert len(one) == 12  # the next epoch is this layout's own
        assert once(rest_of_epoch(one, 2)) == set(range(RECORDS))
    assert rests[0] == rests[1], "every old rank's state gives the same remainder"
    assert once(rests[0]) | before == set(range(RECORDS))
    assert not before & set(rests[0])
    # The same layout again, mid-remainder: the remainder goes on where it stopped.
    one = loader(uneven)
    one.load_state_dict(states[0])
    rec = RecordedIds(one)
    it = iter(one)
    for _ in range(3):
        next(it)
    mid = one.state_dict()
    assert mid["progress"] is not None and (mid["epoch"], mid["step"]) == (1, 3)
    again = loader(uneven)
    again.load_state_dict(mid)
    assert len(again) == 8
    assert rest_of_epoch(again, 1) == rests[0][len(rec.ids):]
    assert rec.ids == rests[0][:len(rec.ids)]


def test_one_rank_resumes_on_two_nodes_and_again_on_other_layouts(
        shards: Path, tmp_path: Path) -> None:
    """One rank stops after 3 steps of epoch 1; 2 nodes (exchanging a quarter) restored from
    its state serve the 72 records left, each once but for the Drop tail (fewer than a step's
    8 per node), then an exchanged epoch of their own. Their state after 2 steps of that
    remainder (it carries ``progress``) resumes on one rank, and on 2 ranks of another layout,
    with exactly the records left: a second change of layout in one epoch."""
    one = loader(shards)
    rec = RecordedIds(one)
    one.set_epoch(1)
    it = iter(one)
    for _ in range(3):
        next(it)
    first = once(rec.ids)
    (tmp_path / "state.json").write_text(json.dumps(one.state_dict()))
    out = tmp_path / "two"
    out.mkdir()
    job = torchrun_nodes(2, 1, "loader_epochs.py",
                         [shards, out, "--exchange", 0.25, "--last-epoch", 2,
                          "--load", tmp_path / "state.json", "--stop", "1:2"], timeout=LIMIT)
    ran(job, 2)
    outs = outputs(out, 2)
    assert [o["len"]["1"] for o in outs] == [4, 4]  # 36 records per node, 4 batches of 8
    remainder = once(served(outs, 1))
    assert not remainder & first
    left = set(range(RECORDS)) - first - remainder
    assert len(left) == 72 - 64
    assert once(served(outs, 2)) == set(range(RECORDS))  # the next epoch, exchanged
    assert [o["len"]["2"] for o in outs] == [6, 6]
    states = [o["state"] for o in outs]
    assert states[0]["progress"] is not None and states[0]["step"] == 2
    served_before = first | once(served(outs, 1, "before"))
    assert len(served_before) == 24 + 32
    # On one rank, from either node's state.
    for state in states:
        again = loader(shards)
        again.load_state_dict(state)
        rest = once(rest_of_epoch(again, 1))
        assert not rest & served_before
        assert len(set(range(RECORDS)) - served_before - rest) < 8
    # On two ranks of another layout (each its own node, no exchange): all ranks together.
    rest = []
    for rank in range(2):
        again = loader(shards, rank, 2)
        again.load_state_dict(states[1])
        rest += rest_of_epoch(again, 1)
    rest_set = once(rest)
    assert not rest_set & served_before
    assert len(set(range(RECORDS)) - served_before - rest_set) < 16


@pytest.mark.parametrize("data,world", [("uneven", 2), ("shards", 3)])
@pytest.mark.parametrize("drop_last", [True, False])
def test_shards_that_do_not_divide_evenly_serve_every_record(
        request: pytest.FixtureRequest, data: str, world: int, drop_last: bool) -> None:
    """Shards that do not divide evenly over the nodes (3 over 2, 4 over 3; each rank its own
    node, no exchange, no ddl.dist): every rank takes as many batches, and an epoch over all
    ranks serves each record once, all of them but fewer than one global step's with
    ``drop_last=True``, all of them without (padded by at most a record per rank, as
    DistributedSampler pads)."""
    path = request.getfixturevalue(data)
    loaders = [ddl.Loader(path, batch_size=8, image_size=16, workers=1, seed=3, rank=r,
                          world_size=world, drop_last=drop_last) for r in range(world)]
    assert len({len(one) for one in loaders}) == 1
    ids: List[int] = []
    for one in loaders:
        ids += rest_of_epoch(one, 1)
    if drop_last:
        assert RECORDS - len(once(ids)) < world * 8
    else:
        assert set(ids) == set(range(RECORDS)) and len(ids) - RECORDS < world


def test_a_state_of_the_same_images_in_other_shards_is_refused(
        shards: Path, uneven: Path) -> None:
    """A state carries its dataset's identity: the same images packed into 3 shards instead
    of 4 are another dataset (other records at each position), refused naming both."""
    saved = loader(shards)
    next(iter(saved))
    state = saved.state_dict()
    assert state["data"]["shards"] == 4 and state["data"]["records"] == RECORDS
    with pytest.raises(ValueError, match="another dataset") as e:
        loader(uneven).load_state_dict(state)
    for named in (str(shards), "4 shards", str(uneven), "3 shards"):
        assert named in str(e.value), (named, str(e.value))
    loader(shards).load_state_dict(state)  # its own data resumes


def test_a_val_loader_refuses_another_layout(shards: Path) -> None:
    """A val loader's records per rank depend on the layout: another world size is refused,
    naming it; a train loader's state of an older ddl (no layout) too."""
    state = ddl.Loader(shards, split="val", batch_size=4, image_size=16, rank=0,
                       world_size=2).state_dict()
    with pytest.raises(ValueError, match="world_size is 2 in the state but 1"):
        ddl.Loader(shards, split="val", batch_size=4, image_size=16).load_state_dict(state)
    old = {k: v for k, v in loader(shards, 0, 2).state_dict().items()
           if k not in ("nodes", "ranks_per_node", "exchange", "drop_last", "wrap", "progress")}
    with pytest.raises(ValueError, match="older ddl.Loader"):
        loader(shards).load_state_dict(old)
    old["world_size"] = 1
    loader(shards).load_state_dict(old)  # its own world size: as before
