"""ddl.Loader: the same pixels as ddl-train's pipeline, exact resume, every val record once,
zero-copy batches that stay valid, bounded memory, and clear errors for bad input."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest
import torch

import ddl
from conftest import BIN

Batches = List[Tuple[torch.Tensor, torch.Tensor]]


def collect(loader: ddl.Loader, epoch: int = 0) -> Batches:
    loader.set_epoch(epoch)
    return [(x.clone(), y.clone()) for x, y in loader]


def rust_batches(shards: Path, out: Path, dtype: str, **kw: object) -> Tuple[np.ndarray, np.ndarray, List[int]]:
    """What ddl-train's loader produces for one rank (tools/examples/loader_dump.rs)."""
    exe = BIN / "examples" / "loader_dump"
    if not exe.exists():
        pytest.fail(f"{exe} not built: run `cargo build --release --workspace --all-targets`")
    args = [str(exe), str(shards), str(out), "--dtype", dtype]
    for k, v in kw.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    subprocess.run(args, check=True, capture_output=True)
    rows = json.loads((out / "batches.json").read_text())["rows"]
    images = np.fromfile(out / "images.bin", dtype=np.float32 if dtype == "float32" else np.uint8)
    labels = np.fromfile(out / "labels.bin", dtype=np.int64)
    return images, labels, rows


@pytest.mark.parametrize("split", ["train", "val"])
@pytest.mark.parametrize("dtype", ["float32", "uint8"])
def test_pixels_equal_the_rust_pipeline(shards: Path, tmp_path: Path, split: str, dtype: str) -> None:
    images, labels, rows = rust_batches(shards, tmp_path, dtype, split=split, batch=8, size=40,
                                        workers=1, seed=7, epoch=3)
    layout = "NCHW" if dtype == "float32" else "NHWC"
    loader = ddl.Loader(shards, split=split, batch_size=8, image_size=40, workers=2, seed=7,
                        dtype=dtype, layout=layout)
    got = collect(loader, epoch=3)
    assert [len(y) for _, y in got] == rows
    assert len(loader) == len(rows)
    assert np.array_equal(np.concatenate([x.numpy().ravel() for x, _ in got]), images)
    assert np.array_equal(np.concatenate([y.numpy() for _, y in got]), labels)


def test_pixels_equal_the_rust_pipeline_for_every_placement(
        shards: Path, uneven: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # rank 1 of 2 on one node (the launcher says so): both ranks share the node's shards.
    for k, v in {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
                 "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}.items():
        monkeypatch.setenv(k, v)
    shared = ddl.Loader(shards, batch_size=4, image_size=32, workers=1, seed=1)
    assert (shared.placement.node, shared.placement.nodes, shared.placement.local_rank) == (0, 1, 1)
    images, _, rows = rust_batches(shards, tmp_path / "a", "float32", batch=4, size=32, seed=1,
                                   rank_in_node=1, ranks_in_node=2)
    got = collect(shared)
    assert [len(y) for _, y in got] == rows
    assert np.array_equal(np.concatenate([x.numpy().ravel() for x, _ in got]), images)
    # rank 1 of 2 given explicitly, no launcher: a node of its own holding every second shard,
    # and on shards that do not divide evenly, 16 records of node 0's shards besides.
    monkeypatch.undo()
    for data in (shards, uneven):
        own = ddl.Loader(data, batch_size=4, image_size=32, workers=1, seed=1, rank=1,
                         world_size=2)
        assert (own.placement.node, own.placement.nodes) == (1, 2)
        images, _, rows = rust_batches(data, tmp_path / data.parent.name, "float32", batch=4,
                                       size=32, seed=1, node=1, nodes=2)
        got = collect(own)
        assert [len(y) for _, y in got] == rows == [4] * 12
        assert np.array_equal(np.concatenate([x.numpy().ravel() for x, _ in got]), images)


def test_slurm_variables_count_only_inside_a_job_step(
        shards: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k in [k for k in os.environ if k.startswith(("OMPI_", "PMIX_", "PMI_", "SLURM_"))]:
        monkeypatch.delenv(k)
    # The batch shell of `sbatch -n 2`, no srun: a world of one, serving every record.
    for k, v in {"SLURM_JOB_ID": "42", "SLURM_PROCID": "0", "SLURM_NTASKS": "2",
                 "SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "2"}.items():
        monkeypatch.setenv(k, v)
    with pytest.warns(RuntimeWarning, match="Slurm job 42, not in a job step of its 2 tasks"):
        shell = ddl.Loader(shards, batch_size=4, image_size=32, workers=1)
    assert shell.placement.world_size == 1
    assert len(shell.sampler) == len(shell.dataset)
    # A task that srun started: rank 1 of the step's 2 tasks, both on one node.
    for k, v in {"SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2",
                 "SLURM_LOCALID": "1", "SLURM_STEP_TASKS_PER_NODE": "2"}.items():
        monkeypatch.setenv(k, v)
    step = ddl.Loader(shards, batch_size=4, image_size=32, workers=1)
    place = step.placement
    assert (place.rank, place.world_size, place.local_rank, place.nodes) == (1, 2, 1, 1)
    assert len(step.sampler) <= (len(step.dataset) + 1) // 2


def test_batches_do_not_depend_on_workers_and_change_with_epoch(shards: Path) -> None:
    one = collect(ddl.Loader(shards, batch_size=8, image_size=32, workers=1))
    three = collect(ddl.Loader(shards, batch_size=8, image_size=32, workers=3, prefetch=4))
    assert len(one) == len(three) > 1
    for (x1, y1), (x3, y3) in zip(one, three):
        assert torch.equal(x1, x3) and torch.equal(y1, y3)
    other = collect(ddl.Loader(shards, batch_size=8, image_size=32, workers=1), epoch=1)
    assert not all(torch.equal(a[1], b[1]) for a, b in zip(one, other))


def test_state_dict_resumes_with_exactly_the_remaining_batches(shards: Path) -> None:
    full = collect(ddl.Loader(shards, batch_size=8, image_size=32, workers=2), epoch=2)
    loader = ddl.Loader(shards, batch_size=8, image_size=32, workers=2)
    loader.set_epoch(2)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    assert (state["epoch"], state["step"]) == (2, 3)
    restored = ddl.Loader(shards, batch_size=8, image_size=32, workers=1)
    restored.load_state_dict(state)
    restored.set_epoch(2)
    rest = [(x.clone(), y.clone()) for x, y in restored]
    assert len(rest) == len(full) - 3
    for (x, y), (fx, fy) in zip(rest, full[3:]):
        assert torch.equal(x, fx) and torch.equal(y, fy)
    # The epoch ended: its state says "the next epoch, from its first batch".
    assert (restored.state_dict()["epoch"], restored.state_dict()["step"]) == (3, 0)
    restored.set_epoch(3)
    assert len(list(restored)) == len(full)
    with pytest.raises(ValueError, match="batch_size"):
        ddl.Loader(shards, batch_size=4, image_size=32).load_state_dict(state)


def image_hashes(batches: Batches) -> List[str]:
    return [hashlib.sha1(x.numpy().tobytes()).hexdigest() for xs, _ in batches for x in xs]


@pytest.mark.parametrize("world", [2, 3])
def test_val_covers_every_record_once(shards: Path, world: int) -> None:
    single = image_hashes(collect(ddl.Loader(shards, split="val", batch_size=4, image_size=32)))
    assert len(single) == len(ddl.Shards(shards, "val"))
    parts = [image_hashes(collect(ddl.Loader(shards, split="val", batch_size=4, image_size=32,
                                             rank=r, world_size=world)))
             for r in range(world)]
    assert sorted(h for p in parts for h in p) == sorted(single)


def test_kept_tensors_keep_their_contents(shards: Path) -> None:
    loader = ddl.Loader(shards, batch_size=8, image_size=32, workers=2, prefetch=1)
    kept, copies = [], []
    for epoch in range(3):
        loader.set_epoch(epoch)
        for x, y in loader:
            kept.append((x, y))
            copies.append((x.clone(), y.clone()))
    # More batches are alive than the pipeline has buffers: none was recycled under them.
    assert len(kept) > 3 * (1 + 1) + 2
    for (x, y), (cx, cy) in zip(kept, copies):
        assert torch.equal(x, cx) and torch.equal(y, cy)
    del x, y
    kept.clear()
    assert loader._core.batches_alive() == 0


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_memory_stays_bounded_when_batches_are_dropped(shards: Path) -> None:
    loader = ddl.Loader(shards, batch_size=8, image_size=64, workers=2)
    batch_bytes = 8 * 3 * 64 * 64 * 4
    loader.set_epoch(0)
    for _ in loader:
        pass
    after_first = rss_bytes()
    for epoch in range(1, 11):
        loader.set_epoch(epoch)
        for x, y in loader:
            assert x.shape == (8, 3, 64, 64)
    growth = rss_bytes() - after_first
    # Ten epochs of ~30 batches each: a leak of one batch per step would be 30x this bound.
    assert growth < 10 * batch_bytes, f"RSS grew by {growth} bytes over 10 epochs"


def test_layouts_are_views_of_the_same_pixels(shards: Path) -> None:
    nhwc = collect(ddl.Loader(shards, batch_size=4, image_size=32, dtype="uint8", layout="NHWC"))
    nchw = collect(ddl.Loader(shards, batch_size=4, image_size=32, dtype="uint8", layout="NCHW"))
    assert nhwc[0][0].shape == (4, 32, 32, 3) and nchw[0][0].shape == (4, 3, 32, 32)
    assert nhwc[0][0].dtype == torch.uint8
    assert torch.equal(nhwc[0][0].permute(0, 3, 1, 2), nchw[0][0])


def test_metadata_and_stats(shards: Path) -> None:
    loader = ddl.Loader(shards, batch_size=8, image_size=32)
    assert loader.classes == ddl.Shards(shards).classes and loader.num_classes == 4
    n = sum(len(y) for _, y in loader)
    assert n == len(loader) * 8
    stats = loader.stats()
    assert stats["images"] == n and stats["images_per_s"] > 0 and stats["bad_records"] == []
    assert 0 <= stats["wait_fraction"] <= 1


@pytest.mark.parametrize("kwargs, error, names", [
    ({"split": "test"}, ValueError, "split"),
    ({"batch_size": 0}, ValueError, "batch_size"),
    ({"workers": -1}, ValueError, "workers"),
    ({"dtype": "int8"}, ValueError, "dtype"),
    ({"layout": "CHW"}, ValueError, "layout"),
    ({"on_bad_record": "ignore"}, ValueError, "on_bad_record"),
    ({"device": "tpu"}, ValueError, "device"),
    ({"rank": 2, "world_size": 2}, ValueError, "rank"),
    ({"rank": 0, "world_size": 9}, ValueError, "shards"),
    # FFCV's 0-255 scale: every input would be nearly constant.
    ({"mean": (123.7, 116.3, 103.5)}, ValueError, r"mean: .*0-255 scale.*0-1 scale.*divide"),
    ({"std": (58.4, 57.1, 57.4)}, ValueError, r"std: .*0-255 scale.*divide each value by 255"),
    ({"image_size": 32.0}, ValueError, r"image_size: must be an integer .*float"),
    ({"batch_size": True}, ValueError, r"batch_size: must be an integer, got the bool"),
    ({"seed": 2**64}, ValueError, r"seed: .* 0 to 2\*\*64 - 1, got 18446744073709551616"),
    ({"seed": -1}, ValueError, "seed"),
    ({"dtype": torch.int32}, ValueError, "dtype"),
    ({"memory_format": torch.preserve_format}, ValueError, "memory_format"),
    ({"layout": "NHWC", "memory_format": torch.channels_last}, ValueError, "memory_format"),
])
def test_bad_arguments_name_the_argument(shards: Path, kwargs: Dict[str, object],
                                         error: type, names: str) -> None:
    with pytest.raises(error, match=names):
        ddl.Loader(shards, **kwargs)


def test_missing_directory_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere"):
        ddl.Loader(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="manifest.json"):
        ddl.Loader(tmp_path)


def damaged_copy(shards: Path, dest: Path) -> Path:
    shutil.copytree(shards, dest)
    return dest


def test_truncated_shard_is_a_shard_error_naming_the_file(shards: Path, tmp_path: Path) -> None:
    copy = damaged_copy(shards, tmp_path / "shards")
    victim = copy / "train-00001.ddl"
    with open(victim, "r+b") as f:
        f.truncate(os.path.getsize(victim) // 2)
    with pytest.raises(ddl.ShardError, match="train-00001.ddl"):
        ddl.Loader(copy)
    with pytest.raises(ddl.ShardError, match="train-00001.ddl"):
        ddl.Shards(copy)


def corrupt_record(copy: Path, split: str, index: int) -> Tuple[str, int]:
    """Flips bytes inside record ``index``'s JPEG; returns (shard file, record in shard)."""
    records = ddl.Shards(copy, split)
    jpeg = records[index][0]
    for f in records.files:
        data = bytearray(Path(f).read_bytes())
        at = data.find(jpeg)
        if at >= 0:
            for k in range(at + len(jpeg) // 2, at + len(jpeg) // 2 + 16):
                data[k] ^= 0xFF
            Path(f).write_bytes(bytes(data))
            break
    bad = ddl.Shards(copy, split).verify()
    assert len(bad) == 1 and bad[0][0].endswith(".ddl"), bad
    return bad[0][0], bad[0][1]


def test_corrupt_record_is_reported_and_replaced_or_fails(shards: Path, tmp_path: Path) -> None:
    copy = damaged_copy(shards, tmp_path / "shards")
    file, record = corrupt_record(copy, "train", 5)
    loader = ddl.Loader(copy, batch_size=8, image_size=32, on_bad_record="replace")
    sizes = [len(y) for _, y in loader]
    assert sizes == [8] * len(loader)
    bad = loader.stats()["bad_records"]
    assert [(b[0], b[1]) for b in bad] == [(file, record)] and "checksum" in bad[0][2]
    with pytest.raises(ddl.DdlError, match=f"record {record}"):
        for _ in ddl.Loader(copy, batch_size=8, image_size=32, on_bad_record="fail"):
            pass
    with pytest.raises(ddl.ShardError, match=os.path.basename(file)):
        ddl.Shards(copy)[5]


def test_shard_replaced_between_epochs_is_a_shard_error(shards: Path, tmp_path: Path) -> None:
    copy = damaged_copy(shards, tmp_path / "shards")
    loader = ddl.Loader(copy, batch_size=8, image_size=32)
    assert len(list(loader)) == len(loader)
    victim = copy / "train-00002.ddl"
    data = victim.read_bytes()
    victim.unlink()
    victim.write_bytes(data)  # same bytes, another file: no longer the one mapped
    loader.set_epoch(1)
    with pytest.raises(ddl.ShardError, match="train-00002.ddl"):
        next(iter(loader))


#: Hard limit for the threading tests below: far above what they need, so only a deadlock
#: (the process hanging forever) reaches it.
THREAD_TIMEOUT = 120


def run_script(code: str, *args: object) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter (a deadlock would take this one down with it) and
    fails the test if it does not finish within THREAD_TIMEOUT."""
    try:
        return subprocess.run([sys.executable, "-c", code, *map(str, args)], text=True,
                              capture_output=True, timeout=THREAD_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"hung past {THREAD_TIMEOUT} s (deadlock):\n{e.stdout}\n{e.stderr}")


def test_stats_from_another_thread_while_iterating(shards: Path) -> None:
    code = """
import sys, threading, ddl
L = ddl.Loader(sys.argv[1], batch_size=4, image_size=32, workers=2)
stop, calls = threading.Event(), [0]
def log():
    while not stop.is_set():
        L.stats()
        calls[0] += 1
t = threading.Thread(target=log)
t.start()
batches = 0
for epoch in range(3):
    L.set_epoch(epoch)
    batches += sum(1 for _ in L)
stop.set()
t.join()
print("done", batches, len(L), calls[0], L.stats()["batches"])
"""
    job = run_script(code, shards)
    assert job.returncode == 0, job.stderr
    _, batches, per_epoch, calls, counted = job.stdout.split()
    assert int(batches) == int(counted) == 3 * int(per_epoch)
    assert int(calls) > 0


def test_a_second_iteration_on_another_thread_is_refused(shards: Path) -> None:
    code = """
import sys, threading, ddl
L = ddl.Loader(sys.argv[1], batch_size=4, image_size=32, workers=2)
first_batch, refused = threading.Event(), threading.Event()
seen = {}
def first():
    n = 0
    for _ in L:
        n += 1
        if n == 1:
            first_batch.set()
            refused.wait()
    seen["first"] = n
def second():
    first_batch.wait()
    try:
        next(iter(L))
        seen["second"] = "no error"
    except RuntimeError as e:
        seen["second"] = str(e)
    refused.set()
a, b = threading.Thread(target=first), threading.Thread(target=second)
a.start(); b.start(); a.join(); b.join()
print(seen["first"] == len(L))
print(seen["second"])
# Once the first iteration has ended, another thread may iterate.
after = []
t = threading.Thread(target=lambda: after.append(sum(1 for _ in L)))
t.start(); t.join()
print(after[0] == len(L))
# The same thread: a newer iterator supersedes the older one, which says so.
old = iter(L); next(old)
new = iter(L); next(new)
try:
    next(old)
    print("no error")
except RuntimeError as e:
    print(e)
"""
    job = run_script(code, shards)
    assert job.returncode == 0, job.stderr
    lines = job.stdout.splitlines()
    assert lines[0] == "True", job.stdout
    assert "another thread is iterating this loader" in lines[1], job.stdout
    assert lines[2] == "True", job.stdout
    assert "superseded by a newer iteration" in lines[3], job.stdout


def test_two_threads_iterating_at_once_never_hang(shards: Path) -> None:
    code = """
import sys, threading, ddl
L = ddl.Loader(sys.argv[1], batch_size=4, image_size=32, workers=2)
outcomes = []
def run():
    for _ in range(5):
        try:
            outcomes.append(sum(1 for _ in L))
        except RuntimeError as e:
            assert "another thread" in str(e), e
            outcomes.append("refused")
threads = [threading.Thread(target=run) for _ in range(2)]
for t in threads: t.start()
for t in threads: t.join()
print(all(o == "refused" or o == len(L) for o in outcomes), len(outcomes))
"""
    job = run_script(code, shards)
    assert job.returncode == 0, job.stderr
    assert job.stdout.split() == ["True", "10"], job.stdout


def test_absurd_arguments_are_refused_naming_the_limit(shards: Path) -> None:
    # In a fresh interpreter: before the limits, some of these hung or aborted the process.
    code = """
import json, sys, ddl
cases = [dict(workers=100000), dict(workers=10**6), dict(prefetch=10**6), dict(image_size=1),
         dict(image_size=7), dict(image_size=20000), dict(batch_size=100),
         dict(split="val", image_size=64, resize=32)]
out = []
for kw in cases:
    try:
        ddl.Loader(sys.argv[1], **kw)
        out.append("accepted")
    except ValueError as e:
        out.append(str(e))
print(json.dumps(out))
"""
    job = run_script(code, shards)
    assert job.returncode == 0, job.stderr
    errors = json.loads(job.stdout)
    expected = [("workers:", "above the limit of 1024"), ("workers:", "above the limit of 1024"),
                ("prefetch:", "above the limit of 1024"), ("image_size:", "below 16"),
                ("image_size:", "below 16"), ("image_size/batch_size/prefetch:", "MemAvailable"),
                ("batch_size:", "holds 96 records"), ("resize:", "below the image size 64")]
    for error, (name, limit) in zip(errors, expected):
        assert error.startswith(name) and limit in error, error
    # With the last batch wrapped around, a batch larger than the split is one step.
    assert len(ddl.Loader(shards, batch_size=100, drop_last=False)) == 1


# DataLoader habits -------------------------------------------------------------------------

def batches_of(loader: ddl.Loader) -> Batches:
    """One iteration, without set_epoch."""
    return [(x.clone(), y.clone()) for x, y in loader]


def test_iterating_again_runs_the_next_epoch_and_set_epoch_pins_it(shards: Path) -> None:
    """Without set_epoch a second iteration is epoch 1 (another order and other crops), as a
    shuffling DataLoader; it resumes exactly from state_dict mid-way; set_epoch still pins."""
    loader = ddl.Loader(shards, batch_size=8, image_size=32, workers=2)
    first, second = batches_of(loader), batches_of(loader)
    assert image_hashes(first) == image_hashes(collect(
        ddl.Loader(shards, batch_size=8, image_size=32, workers=1), epoch=0))
    expected_second = collect(ddl.Loader(shards, batch_size=8, image_size=32, workers=1), epoch=1)
    assert image_hashes(second) == image_hashes(expected_second)
    assert image_hashes(first) != image_hashes(second)
    assert loader.state_dict()["epoch"] == 2 and loader.state_dict()["step"] == 0
    # Broken off mid-way through the third epoch (no set_epoch), resumed in a new loader.
    it = iter(loader)
    for _ in range(2):
        next(it)
    state = loader.state_dict()
    assert (state["epoch"], state["step"]) == (2, 2)
    restored = ddl.Loader(shards, batch_size=8, image_size=32, workers=1)
    restored.load_state_dict(state)
    third = collect(ddl.Loader(shards, batch_size=8, image_size=32, workers=1), epoch=2)
    assert image_hashes(batches_of(restored)) == image_hashes(third[2:])
    # set_epoch pins: the same epoch twice.
    pinned = ddl.Loader(shards, batch_size=8, image_size=32, workers=1)
    assert image_hashes(collect(pinned, epoch=0)) == image_hashes(collect(pinned, epoch=0))


def test_dataloader_attributes(shards: Path) -> None:
    """dataset (len: records of the split), sampler (len: this rank's samples), batch_size,
    drop_last and num_workers, as a DataLoader + DistributedSampler script reads them."""
    train = ddl.Loader(shards, batch_size=8, image_size=32, num_workers=1)
    assert isinstance(train.dataset, ddl.Shards) and len(train.dataset) == 4 * 24
    assert train.batch_size == 8 and train.drop_last is True and train.num_workers == 1
    assert len(train.sampler) == len(train) * 8 == sum(len(y) for _, y in train)
    vals = [ddl.Loader(shards, split="val", batch_size=4, image_size=32, rank=r, world_size=3)
            for r in range(3)]
    assert all(len(v.dataset) == 4 * 7 and v.drop_last is False for v in vals)
    assert [len(v.sampler) for v in vals] == [sum(len(y) for _, y in v) for v in vals]
    assert sum(len(v.sampler) for v in vals) == 4 * 7


def test_arguments_after_path_are_keyword_only(shards: Path) -> None:
    with pytest.raises(TypeError, match="positional"):
        ddl.Loader(shards, "train")  # type: ignore[misc]
    with pytest.raises(ValueError, match="workers, num_workers"):
        ddl.Loader(shards, workers=1, num_workers=2)


def test_loader_is_stateful_for_torchdata(shards: Path) -> None:
    """torchdata's Stateful protocol (state_dict / load_state_dict), structurally: torchdata
    where installed, else the same runtime-checkable protocol."""
    try:
        from torchdata.stateful_dataloader import Stateful
    except ImportError:
        from typing import Protocol, runtime_checkable

        @runtime_checkable
        class Stateful(Protocol):  # type: ignore[no-redef]
            def state_dict(self) -> Dict[str, object]: ...

            def load_state_dict(self, state_dict: Dict[str, object]) -> None: ...

    loader = ddl.Loader(shards, batch_size=8, image_size=32, workers=1)
    assert isinstance(loader, Stateful)
    loader.load_state_dict(loader.state_dict())


def test_the_extension_has_stubs_for_every_name() -> None:
    """``_ddl.pyi`` declares what ``ddl._ddl`` exports, no more and no less; ``py.typed``
    marks the package typed."""
    import ast

    package = Path(ddl.__file__).parent
    assert (package / "py.typed").exists()
    tree = ast.parse((package / "_ddl.pyi").read_text())
    stubbed = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    stubbed |= {n.target.id for n in tree.body
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    exported = {n for n in dir(ddl._ddl) if not n.startswith("_")}
    assert stubbed == exported, (stubbed ^ exported)
    # And each class its methods and attributes (exceptions inherit theirs).
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        runtime = getattr(ddl._ddl, cls.name)
        if issubclass(runtime, BaseException):
            continue
        members = {f.name for f in cls.body if isinstance(f, ast.FunctionDef)}
        members |= {f.target.id for f in cls.body
                    if isinstance(f, ast.AnnAssign) and isinstance(f.target, ast.Name)}
        public = {m for m in members if not m.startswith("_")}
        actual = {m for m in dir(runtime) if not m.startswith("_")}
        assert public == actual, (cls.name, public ^ actual)


def split_records(loaders: List[ddl.Loader]) -> List[List[int]]:
    """Each loader's batch sizes over one val epoch, checking that it yields len() batches."""
    sizes = []
    for loader in loaders:
        got = [len(y) for x, y in loader]
        assert len(got) == len(loader)
        sizes.append(got)
    return sizes


@pytest.mark.parametrize("batch, world, on_one_node, sizes", [
    # 28 val records at a batch larger than the split, 2 ranks of one node: 14 each, where
    # whole batches left rank 1 without any (a DDP model in eval waited for it forever).
    (512, 2, True, [[14], [14]]),
    # 3 ranks of one node, batch 9: 27 records in full batches, the one left goes to rank 0;
    # the others take an empty last batch.
    (9, 3, True, [[9, 1], [9, 0], [9, 0]]),
    # 3 nodes holding 14, 7 and 7 records: the smaller nodes end with empty batches.
    (4, 3, False, [[4, 4, 4, 2], [4, 3, 0, 0], [4, 3, 0, 0]]),
    # 5 nodes, 4 val shards: the fifth node holds no records, and still takes the steps.
    (8, 5, False, [[7], [7], [7], [7], [0]]),
])
def test_val_gives_every_rank_the_same_number_of_batches(
        shards: Path, monkeypatch: pytest.MonkeyPatch, batch: int, world: int,
        on_one_node: bool, sizes: List[List[int]]) -> None:
    """Like DistributedSampler: len() and the batches yielded equal on every rank, every val
    record exactly once over all ranks (no padding), each rank floor or ceil of its node's
    records / ranks."""
    single = image_hashes(collect(ddl.Loader(shards, split="val", batch_size=4, image_size=32)))
    loaders = []
    for rank in range(world):
        if on_one_node:
            for k, v in {"OMPI_COMM_WORLD_RANK": rank, "OMPI_COMM_WORLD_SIZE": world,
                         "OMPI_COMM_WORLD_LOCAL_RANK": rank,
                         "OMPI_COMM_WORLD_LOCAL_SIZE": world}.items():
                monkeypatch.setenv(k, str(v))
            loaders.append(ddl.Loader(shards, split="val", batch_size=batch, image_size=32,
                                      workers=1))
        else:
            loaders.append(ddl.Loader(shards, split="val", batch_size=batch, image_size=32,
                                      workers=1, rank=rank, world_size=world))
    assert split_records(loaders) == sizes
    assert [len(v) for v in loaders] == [len(sizes[0])] * world
    assert [v.samples() for v in loaders] == [sum(s) for s in sizes]
    parts = [h for v in loaders for h in image_hashes(collect(v))]
    assert sorted(parts) == sorted(single)
    empty = [x for v in loaders for x, _ in v if len(x) == 0]
    assert all(x.shape == (0, 3, 32, 32) and x.dtype == torch.float32 for x in empty)


def test_a_forked_child_loads_with_new_threads(shards: Path) -> None:
    """A process that iterated a loader forks (os.fork mid-epoch, multiprocessing's fork
    context after a completed epoch): the child's iteration starts new threads and yields
    the batches the parent would have, where it used to block forever on its first batch."""
    code = """
import multiprocessing, os, sys, ddl
L = ddl.Loader(sys.argv[1], batch_size=4, image_size=32, workers=2)
epoch0 = [y.tolist() for _, y in L]
epoch1 = [y.tolist() for _, y in L]
L.set_epoch(0)
it = iter(L)
next(it), next(it)
pid = os.fork()
if pid == 0:  # the rest of epoch 0, where the parent was
    os._exit(0 if [y.tolist() for _, y in L] == epoch0[2:] else 1)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, "os.fork child"
assert [y.tolist() for _, y in it] == epoch0[2:]  # the parent goes on
def child_epoch(_):
    return [y.tolist() for _, y in L]
with multiprocessing.get_context("fork").Pool(1) as pool:
    assert pool.map(child_epoch, [0]) == [epoch1], "multiprocessing child"
print("ok")
"""
    done = run_script(code, shards)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_close_stops_the_threads_and_refuses_iteration(shards: Path) -> None:
    before = threads()
    loader = ddl.Loader(shards, batch_size=8, image_size=32, workers=4)
    images, labels = next(iter(loader))
    kept = images.clone()
    assert threads() >= before + 4
    loader.close()
    # The threads are joined by close(); the kernel drops their entries as they exit.
    deadline = time.monotonic() + 10
    while threads() > before and time.monotonic() < deadline:
        os.sched_yield()
    assert threads() == before
    assert torch.equal(images, kept)  # a batch handed out stays valid
    with pytest.raises(RuntimeError, match="closed"):
        iter(loader)
    loader.close()  # again: nothing
    assert "closed" in repr(loader)
    with ddl.Loader(shards, batch_size=8, image_size=32, workers=1) as scoped:
        assert sum(1 for _ in scoped) == len(scoped)
        unfinished = iter(scoped)
        next(unfinished)
    with pytest.raises(RuntimeError, match=r"closed .*with block"):
        next(iter(scoped))
    with pytest.raises(RuntimeError, match="ended"):  # the iterator open at the close
        next(unfinished)


def test_numpy_integers_are_integers(shards: Path) -> None:
    plain = ddl.Loader(shards, batch_size=8, image_size=32, workers=1, seed=3, rank=1,
                       world_size=2)
    numpy = ddl.Loader(shards, batch_size=np.int64(8), image_size=np.int32(32),
                       workers=np.uint8(1), seed=np.uint64(3), rank=np.int64(1),
                       world_size=np.int16(2), prefetch=np.int64(2), resize=np.int64(0))
    numpy.set_epoch(np.int64(1))
    numpy.set_image_size(np.int64(32))
    assert image_hashes(collect(plain, epoch=1)) == image_hashes(batches_of(numpy))


def test_out_of_range_epochs_and_seeds_are_refused_up_front(shards: Path) -> None:
    loader = ddl.Loader(shards, batch_size=8, image_size=32, workers=1, seed=2**64 - 1)
    with pytest.raises(ValueError, match=r"epoch: must be an integer from 0 to 2\*\*64 - 1"):
        loader.set_epoch(2**70)
    with pytest.raises(ValueError, match="epoch"):
        loader.set_epoch(-1)
    state = loader.state_dict()
    for bad, name in (({"epoch": -5}, "epoch"), ({"epoch": 2**64}, "epoch"),
                      ({"step": 10**6}, "step"), ({"epoch": 1.5}, "epoch")):
        with pytest.raises(ValueError, match=f"load_state_dict: {name}"):
            loader.load_state_dict({**state, **bad})
    # Nothing changed: the loader still runs its epoch 0.
    assert loader.state_dict() == state
    assert len(batches_of(loader)) == len(loader)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("memory_format", [torch.channels_last, torch.contiguous_format])
def test_output_dtype_and_memory_format(shards: Path, dtype: torch.dtype,
                                        memory_format: torch.memory_format) -> None:
    """The float32 NCHW batches rounded to ``dtype`` (as torch rounds them) in
    ``memory_format``, as autocast and a channels-last model take them."""
    reference = collect(ddl.Loader(shards, batch_size=8, image_size=32, workers=1))
    got = collect(ddl.Loader(shards, batch_size=8, image_size=32, workers=1, dtype=dtype,
                             memory_format=memory_format))
    assert len(got) == len(reference)
    for (x, y), (rx, ry) in zip(got, reference):
        assert x.dtype == dtype and x.shape == rx.shape
        assert x.is_contiguous(memory_format=memory_format)
        assert torch.equal(x.float(), rx.to(dtype).float()) and torch.equal(y, ry)
    # By name, too.
    named = ddl.Loader(shards, batch_size=8, image_size=32, workers=1, dtype="bfloat16")
    assert next(iter(named))[0].dtype == torch.bfloat16


def test_uint8_output_is_the_pixels_the_float_output_normalises(shards: Path) -> None:
    """dtype=torch.uint8 in channels-last NCHW is the decoded buffer itself (no copy): the
    pixels whose ``(x / 255 - mean) / std`` is the float32 output, batch by batch."""
    kw: Dict[str, Any] = dict(batch_size=8, image_size=32, workers=1)
    reference = collect(ddl.Loader(shards, **kw))
    raw = collect(ddl.Loader(shards, dtype=torch.uint8, memory_format=torch.channels_last, **kw))
    mean = torch.tensor(ddl.loader.IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(ddl.loader.IMAGENET_STD).view(1, 3, 1, 1)
    assert len(raw) == len(reference)
    for (x, y), (rx, ry) in zip(raw, reference):
        assert x.dtype == torch.uint8 and x.shape == rx.shape == (8, 3, 32, 32)
        assert x.is_contiguous(memory_format=torch.channels_last)
        assert torch.allclose((x.float() / 255 - mean) / std, rx, rtol=0, atol=1e-5)
        assert torch.equal(y, ry)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.uint8])
def test_output_dtype_and_memory_format_on_the_gpu(shards: Path, dtype: torch.dtype) -> None:
    """device="cuda": converted by the copy into pinned memory, the same values and layout
    (uint8: the same pixels)."""
    kw: Dict[str, object] = {"batch_size": 8, "image_size": 32, "workers": 1,
                             "dtype": dtype, "memory_format": torch.channels_last}
    on_cpu = collect(ddl.Loader(shards, **kw))  # type: ignore[arg-type]
    on_gpu = collect(ddl.Loader(shards, device="cuda", **kw))  # type: ignore[arg-type]
    assert len(on_gpu) == len(on_cpu)
    for (x, y), (cx, cy) in zip(on_gpu, on_cpu):
        assert x.is_cuda and x.dtype == dtype and x.shape == cx.shape
        assert x.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(x.cpu(), cx) and torch.equal(y.cpu(), cy)
