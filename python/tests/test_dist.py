"""Tests of ``ddl.dist``: exact allreduce for every algorithm and dtype, broadcast, futures,
equivalence with torch DDP, the three ways to initialise, a rank killed mid-job, and the
exceptions for bad arguments.

Each case runs a script of ``tests/scripts`` (under ``mpirun``, or alone for a one-rank job),
which asserts inside and prints an ``ok`` line; the test checks the return code and parses
that line, or compares the weights the script saved.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Sequence, Tuple

import pytest
import torch

import ddl.dist as dist
from conftest import SCRIPTS, Job, launch, mpirun

#: Hang limit of the short jobs here (seconds): each needs well under half of it.
SHORT = 120


def alone(script: str, args: Sequence[str] = (), timeout: float = SHORT) -> Job:
    """Runs ``tests/scripts/<script>`` as a plain process (no mpirun: a one-rank MPI job)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_COMM_WORLD_", "PMIX_", "OMPI_MCA_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.run([sys.executable, str(SCRIPTS / script), *map(str, args)],
                              capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{script} hung past {timeout} s:\n{e.stdout}\n{e.stderr}")
    return Job(proc.returncode, proc.stdout, proc.stderr)


def ok_lines(job: Job, prefix: str) -> list:
    """The script's success lines (``PREFIX ok ...``, found wherever mpirun put them); fails
    with the job's output when the job did not succeed."""
    assert job.returncode == 0, f"exit code {job.returncode}:\n{job.output}"
    return re.findall(rf"{prefix} ok [^\n]*?(?=\n|{prefix} ok|$)", job.stdout)


def free_port() -> int:
    """A TCP port nobody listens on now (for torch.distributed's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launcher_env(**variables: object) -> Dict[str, str]:
    """This environment without any launcher's variables, plus ``variables``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_", "SLURM_", "TORCHELASTIC_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                         "MASTER_PORT", "GROUP_RANK")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update({k: str(v) for k, v in variables.items()})
    return env


def processes(code: str, envs: Sequence[Dict[str, str]],
              timeout: float = SHORT) -> "list[subprocess.CompletedProcess]":
    """Runs ``python -c code`` once per environment of ``envs``, all at once; fails the test
    if any runs past ``timeout`` seconds (all are killed)."""
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for env in envs]
    deadline = time.monotonic() + timeout
    done = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        outputs = [proc.communicate() for proc in procs]
        pytest.fail(f"hung past {timeout} s:\n{outputs}")
    return done


def last_line(proc: "subprocess.CompletedProcess") -> str:
    """The last line of a failed process's stderr (its exception)."""
    assert proc.returncode != 0, proc.stdout
    return proc.stderr.strip().splitlines()[-1]


# 1. allreduce_, allreduce_async_, broadcast_ ----------------------------------------------

def algorithm_count(launcher: str) -> int:
    """The algorithms the backend of ``launcher`` runs: all but ``mpi`` over TCP (torchrun)."""
    return len(dist.ALGORITHMS) - (launcher == "torchrun")


@pytest.fixture(scope="module", params=[(2, "mpirun"), (3, "mpirun"), (2, "torchrun"),
                                        (3, "torchrun")], ids=lambda w: f"{w[0]}-{w[1]}")
def suite(request: pytest.FixtureRequest) -> Tuple[int, str, Job]:
    """(ranks, launcher, job) of one dist_suite.py job per world size and launcher, which the
    tests below share: dist_disagree, dist_allreduce, dist_mismatch and nn_sharded in one
    launch (each rank's ``import torch`` is most of a short job's CPU)."""
    np_, launcher = request.param
    return np_, launcher, launch(launcher, np_, "dist_suite.py", timeout=2 * SHORT)


def test_collectives_exact_and_identical_on_every_rank(suite: Tuple[int, str, Job]) -> None:
    """Every algorithm x dtype x size (1, 7, 1001, 300001 elements), sum and mean, equals the
    exact result bitwise; non-contiguous tensors, futures and broadcasts from the first and
    last rank too; all ranks end with the same digest of every result. Under torchrun the same
    over ddl's TCP backend (every algorithm but ``mpi``)."""
    np_, launcher, job = suite
    lines = ok_lines(job, "dist_allreduce")
    parsed = [re.fullmatch(r"dist_allreduce ok rank=(\d+) size=(\d+) checks=(\d+) "
                           r"digest=([0-9a-f]{8})", line) for line in lines]
    assert all(parsed), lines
    assert sorted(int(m[1]) for m in parsed) == list(range(np_)), job.output
    assert {int(m[2]) for m in parsed} == {np_}
    # Every algorithm x 3 dtypes x 4 sizes x 2 (sum, mean); 3 algorithms x 3 dtypes x 2
    # shapes + 1 parameter non-contiguous; 5 futures; 2 roots x 6 broadcasts.
    algorithms = algorithm_count(launcher)
    assert {int(m[3]) for m in parsed} == {algorithms * 3 * 4 * 2 + 3 * 3 * 2 + 1 + 5 + 2 * 6}
    assert len({m[4] for m in parsed}) == 1, f"ranks disagree:\n{job.output}"


def test_sharded_head_matches_a_single_process_full_head(suite: Tuple[int, str, Job]) -> None:
    """all_gather_ and reduce_scatter_ exact on uneven rows (a rank owning none); the loss and
    the gradients of ddl.nn.ShardedLinearCrossEntropy (23 classes, uneven batches, label
    smoothing 0 and 0.1, grad 1 and 2.5) within 1e-5 of torch's cross-entropy over the whole
    head in one process; its target_rank gives the whole head's. Over MPI and over TCP."""
    np_, _, job = suite
    lines = ok_lines(job, "nn_sharded")
    ranks = sorted(int(re.search(r"rank=(\d+)", line)[1]) for line in lines)
    assert ranks == list(range(np_)), lines
    assert all(line.endswith("checks=12") for line in lines), lines


def test_mismatched_tensors_raise_on_every_rank(suite: Tuple[int, str, Job]) -> None:
    """The last rank passes another element count (10 / 1000, 1000 / 300000, 0 / 7) or dtype
    (float32 / float16): every algorithm raises DistError on every rank naming it, leaves the
    tensors untouched and then sums the next call (see dist_mismatch.py); under torchrun
    over the TCP backend too."""
    np_, launcher, job = suite
    lines = ok_lines(job, "dist_mismatch")
    cases = algorithm_count(launcher) * 4
    assert sorted(lines) == [f"dist_mismatch ok rank={r} cases={cases}"
                             for r in range(np_)], job.output


def test_disagreeing_ranks_raise_on_every_rank_at_once(suite: Tuple[int, str, Job]) -> None:
    """The last rank picks another algorithm (rhd / ring) for its first allreduce, broadcasts
    a tensor of another size, passes other row counts or element counts to all_gather_ and
    reduce_scatter_: every rank raises DistError at once naming each rank's choice or size
    (before: a 15 s timeout, the root returning while the others raised, or MPI_ERR_TRUNCATE),
    and the job goes on (see dist_disagree.py)."""
    np_, _, job = suite
    lines = ok_lines(job, "dist_disagree")
    assert sorted(lines) == [f"dist_disagree ok rank={r} cases=6" for r in range(np_)], job.output


# 2. DDP equivalence -----------------------------------------------------------------------

def _flat(state: Dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([v.reshape(-1).double() for v in state.values()])


def _relative(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> float:
    """max |a - b| / max |b| over all weights (same names required)."""
    assert sorted(a) == sorted(b), f"different weights: {sorted(a)} vs {sorted(b)}"
    fa, fb = _flat({k: a[k] for k in sorted(a)}), _flat({k: b[k] for k in sorted(b)})
    return float((fa - fb).abs().max() / fb.abs().max())


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Dict[str, torch.Tensor]]:
    """Final weights of the dist_ddp.py runs: torch DDP (gloo) with and without ddl's hook,
    and ddl's DistributedOptimizer (with and without averaging), 2 ranks, 5 SGD steps."""
    out = tmp_path_factory.mktemp("ddp")
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    for mode in ("torch", "ddl"):
        lines = ok_lines(mpirun(2, "dist_ddp.py", [mode, out], timeout=SHORT, env=env),
                         "dist_ddp")
        assert len(lines) == 2, lines
    return {p.stem: torch.load(p) for p in sorted(out.glob("*.pt"))}


@pytest.mark.parametrize("name", ["hook", "hook_direct", "ddl"])
def test_ddp_equivalence(trained: Dict[str, Dict[str, torch.Tensor]], name: str) -> None:
    """DDP + ddl.dist.allreduce_hook and DistributedOptimizer + broadcast_parameters end
    where torch DDP's own allreduce does, and averaging matters (no averaging ends far)."""
    ddp = trained["ddp"]
    assert _relative(trained[name], ddp) <= 1e-6
    assert _relative(trained["local"], ddp) > 1e-3, "averaging made no difference"


def test_distributed_optimizer_unused_parameters(
        trained: Dict[str, Dict[str, torch.Tensor]]) -> None:
    """A parameter no rank uses and one only the last rank uses: DistributedOptimizer does not
    hang and matches DDP(find_unused_parameters=True); the never-used one stays put."""
    ours, theirs = trained["ddl_unused"], trained["ddp_unused"]
    assert _relative(ours, theirs) <= 1e-6
    assert torch.equal(ours["never"], torch.full((40,), 0.5))
    assert not torch.equal(ours["sometimes"], torch.full((10,), 0.25))
    assert _relative(ours, trained["ddp"] | {"never": ours["never"],
                                             "sometimes": ours["sometimes"]}) > 1e-4


# 3. init() three ways ---------------------------------------------------------------------

def test_init_alone_is_one_rank_identity() -> None:
    """Without mpirun: rank 0 of 1, every allreduce is the identity; importing ddl and
    ddl.dist did not start MPI, init() did."""
    lines = ok_lines(alone("dist_init.py", ["alone"]), "dist_init")
    assert lines == ["dist_init ok mode=alone rank=0 size=1"]


@pytest.mark.parametrize("np_", [2, 3])
def test_init_under_torchrun_is_the_tcp_backend_at_the_launchers_ranks(
        np_: int, shards: Path) -> None:
    """torchrun: the TCP backend at torchrun's RANK / LOCAL_RANK, a Loader made before init()
    at the same position as one made after it, ``mpi`` refused, sums right."""
    job = launch("torchrun", np_, "dist_torchrun.py", [shards], timeout=SHORT)
    lines = ok_lines(job, "dist_torchrun")
    assert sorted(lines) == [f"dist_torchrun ok rank={r} size={np_} local={r}/{np_} "
                             "backend=tcp" for r in range(np_)], job.output


def test_tcp_start_up_drops_strangers_and_listens_on_loopback_only() -> None:
    """torchrun at 127.0.0.1: each rank's listener is bound on 127.0.0.1 (rank 0's refuses a
    connection to its port at 127.0.0.2: before, only the published address was checked), a
    port scanner's request, a silent connection and an unauthenticated greeting at rank 0's
    listener during start-up are dropped (before: rank 0 failed, waited out its timeout or
    took the greeting for rank 1's), the sums are right and the listener is closed once the
    ranks connect."""
    job = launch("torchrun", 2, "dist_tcp_listener.py", timeout=SHORT)
    lines = ok_lines(job, "dist_tcp_listener")
    assert sorted(lines) == [f"dist_tcp_listener ok rank={r} host=127.0.0.1"
                             for r in range(2)], job.output


def test_a_contradictory_launch_environment_is_refused_naming_both(shards: Path) -> None:
    """MPI's variables say 1 rank, torchrun's say 2: init() and a Loader refuse, naming both
    (before: each process trained alone, or a Loader made before init() took another rank)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))}
    env.update(OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_SIZE="1", RANK="1", WORLD_SIZE="2",
               LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()))
    for call in ("import ddl.dist as dd; dd.init()",
                 f"import ddl; ddl.Loader({str(shards)!r}, batch_size=4, image_size=32)"):
        proc = subprocess.run([sys.executable, "-c", call], env=env, capture_output=True,
                              text=True, timeout=SHORT)
        assert proc.returncode != 0, proc.stdout
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("ValueError: contradictory launch environment: Open MPI says "
                               "rank 0 of 1 ranks, torchrun's RANK / WORLD_SIZE say rank 1 of "
                               "2"), proc.stderr


def test_init_after_spawn_joins_torch_distributed_world() -> None:
    """FFCV's launch: torch.multiprocessing.spawn of 2 processes, init_process_group(rank=,
    world_size=2), then ddl.dist.init(): ddl.dist takes torch.distributed's 2 ranks and its
    store, and sums over both (before: two 1-rank worlds, each summing alone)."""
    lines = ok_lines(alone("dist_spawn.py", [free_port()]), "dist_spawn")
    assert sorted(lines) == [f"dist_spawn ok rank={r} size=2 sum=3" for r in range(2)]


def test_a_loader_refuses_a_ddl_dist_world_other_than_torch_distributed(shards: Path) -> None:
    """torch.multiprocessing.spawn of 2 processes calling ddl.dist.init() before
    init_process_group(rank=, world_size=2): ddl.dist is a world of one in each, and a
    ddl.Loader raises ValueError naming both worlds (before: each process trained on the
    whole split)."""
    lines = ok_lines(alone("dist_spawn_early.py", [free_port(), shards]), "dist_spawn_early")
    assert sorted(lines) == [f"dist_spawn_early ok rank={r}" for r in range(2)]


def test_a_launch_disagreeing_with_torch_distributed_is_refused_naming_both() -> None:
    """torchrun's variables say 2 ranks, torch.distributed was initialised with 1: init()
    raises ValueError naming both at once (before: it waited for a second rank that never
    came)."""
    code = ("import torch.distributed as td, ddl.dist as dd\n"
            f"td.init_process_group('gloo', rank=0, world_size=1, "
            f"init_method='tcp://127.0.0.1:{free_port()}')\n"
            "dd.init(timeout=60)")
    env = launcher_env(RANK=0, WORLD_SIZE=2, LOCAL_RANK=0, LOCAL_WORLD_SIZE=2,
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port())
    start = time.monotonic()
    [proc] = processes(code, [env])
    # (torch prefixes the lines of a process in a group with "[rank0]: ")
    assert ("ValueError: torch.distributed is initialised as rank 0 of 1 ranks but torchrun "
            "launched this process as rank 0 of 2 ranks") in last_line(proc), proc.stderr
    assert time.monotonic() - start < 30


def test_an_mpi_world_disagreeing_with_torch_distributed_is_refused(tmp_path: Path) -> None:
    """Under an MPI launcher ddl does not recognise (Open MPI's per-rank variables hidden),
    each process with a 1-rank torch.distributed: init() forms MPI's 2 ranks and raises
    DistError naming both sizes (see dist_unknown_launcher.py) instead of going on."""
    job = mpirun(2, "dist_unknown_launcher.py", [tmp_path], timeout=SHORT)
    lines = ok_lines(job, "dist_unknown_launcher")
    assert sorted(lines) == [f"dist_unknown_launcher ok rank={r}" for r in range(2)], job.output


def test_ranks_started_with_different_world_sizes_raise_naming_both() -> None:
    """Rank 0 has WORLD_SIZE=2, rank 1 WORLD_SIZE=3: both raise ValueError naming the variable
    and both values well within init()'s timeout (before: both timed out, saying only that a
    rank did not publish its address)."""
    port = free_port()
    envs = [launcher_env(RANK=r, WORLD_SIZE=n, LOCAL_RANK=r, LOCAL_WORLD_SIZE=n,
                         MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
            for r, n in ((0, 2), (1, 3))]
    start = time.monotonic()
    zero, one = processes("import ddl.dist as dd; dd.init(timeout=60)", envs)
    assert last_line(zero).endswith(
        "ddl.dist.init on rank 0: WORLD_SIZE is 2 here but 3 on rank 1: start every rank with "
        "the same WORLD_SIZE"), zero.stderr
    assert last_line(one).endswith(
        "ddl.dist.init on rank 1: WORLD_SIZE is 3 here but 2 on rank 0: start every rank with "
        "the same WORLD_SIZE"), one.stderr
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("addr,port,needle", [
    ("127.0.0.1", "abc", "MASTER_PORT='abc' is not a TCP port: expected an integer from 1 to "
                         "65535"),
    ("127.0.0.1", "70000", "MASTER_PORT='70000' is not a TCP port"),
    ("no-such-host.invalid", "29500", "MASTER_ADDR='no-such-host.invalid' does not resolve"),
])
def test_a_bad_rendezvous_address_is_refused_naming_the_variable(
        addr: str, port: str, needle: str) -> None:
    """MASTER_ADDR that does not resolve, MASTER_PORT not a port: ValueError naming the
    variable, its value and the form expected (before: socket.gaierror, "invalid literal for
    int()", OverflowError)."""
    env = launcher_env(RANK=0, WORLD_SIZE=1, LOCAL_RANK=0, LOCAL_WORLD_SIZE=1,
                       MASTER_ADDR=addr, MASTER_PORT=port)
    [proc] = processes("import ddl.dist as dd; dd.init(timeout=10)", [env])
    line = last_line(proc)
    assert line.startswith("ValueError: " + needle), proc.stderr


def test_a_store_port_that_never_answers_fails_within_the_timeout() -> None:
    """MASTER_PORT held by a process that accepts connections and never answers: rank 1's
    init(timeout=3) raises DistError naming MASTER_ADDR:MASTER_PORT within seconds (before:
    it stayed in torch's TCPStore constructor for minutes)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes the connections; nobody ever answers
        port = silent.getsockname()[1]
        env = launcher_env(RANK=1, WORLD_SIZE=2, LOCAL_RANK=1, LOCAL_WORLD_SIZE=2,
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        start = time.monotonic()
        [proc] = processes("import ddl.dist as dd; dd.init(timeout=3)", [env], timeout=60)
        elapsed = time.monotonic() - start
    assert last_line(proc).startswith(
        "_ddl.DistError: ddl.dist.init on rank 1: the rendezvous store at MASTER_ADDR:MASTER_PORT"
        f" = 127.0.0.1:{port} did not answer within 3 s"), proc.stderr
    assert elapsed < 20, f"took {elapsed:.0f} s"


@pytest.mark.parametrize("mode", ["mpirun", "mpi4py"])
def test_init_under_mpirun(mode: str) -> None:
    """Under mpirun (alone, or after mpi4py initialised MPI): ranks and sums agree with the
    launcher's and mpi4py's, and every interpreter exits cleanly."""
    job = mpirun(2, "dist_init.py", [mode], timeout=SHORT)
    lines = ok_lines(job, "dist_init")
    assert sorted(lines) == [f"dist_init ok mode={mode} rank={r} size=2" for r in range(2)]
    assert "MPI_ERR" not in job.output and "Traceback" not in job.output, job.output


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one CPU: nothing for mpirun to withhold")
def test_loader_warns_once_when_mpirun_binds_the_rank_to_one_core(shards: Path) -> None:
    """Under Open MPI's ``--bind-to core`` a one-rank job has one CPU for 2 decode workers and
    training while the machine has more: the first loader warns, naming the fix, the second
    does not repeat it; unbound, neither warns."""
    job = mpirun(1, "dist_binding.py", [shards], timeout=SHORT, bind="core")
    bound = ok_lines(job, "dist_binding")
    assert bound == ["dist_binding ok rank=0 warnings=1 cpus=1"], job.output
    warning = re.search(r"warning: ([^\n]*)", job.stdout)
    assert warning is not None, job.output
    assert warning.group(1).startswith("ddl.Loader: the launcher bound this node's 1 rank(s) "
                                       "to 1 of its"), warning.group(1)
    assert "3 busy threads" in warning.group(1) and "--map-by slot:PE=N" in warning.group(1)
    unbound = ok_lines(mpirun(1, "dist_binding.py", [shards], timeout=SHORT), "dist_binding")
    assert unbound == [f"dist_binding ok rank=0 warnings=0 cpus={len(os.sched_getaffinity(0))}"]


def test_auto_follows_a_calibrated_cost_model(tmp_path: Path) -> None:
    """init(cost_model=FILE): auto runs, per size, the algorithm the file measured fastest
    in this layout (mpi among them), not the formulas' pick; a missing file is a ValueError
    naming it, before MPI starts."""
    def tier(name: str) -> dict:
        return {"name": name, "alpha": 1e-6, "beta": 1e-9, "gamma": 1e-10}

    sizes = [4 << 10, 64 << 10, 1 << 20, 16 << 20]
    times = {  # seconds per call at each size; the fastest: ring, ring, mpi, rhd
        "ring": [1e-5, 2e-5, 9e-4, 9e-3],
        "rhd": [3e-5, 4e-5, 8e-4, 5e-3],
        "multiring": [4e-5, 5e-5, 8e-4, 6e-3],
        "multicolor:4:1048576": [5e-5, 6e-5, 9e-4, 7e-3],
        "shm": [6e-5, 7e-5, 9e-4, 8e-3],
        "mpi": [2e-5, 3e-5, 5e-4, 9e-3],
    }
    model = {
        "intra": tier("intra"), "inter": tier("inter"), "source": "test", "copy": 0.0,
        "shm_sync": 0.0,
        "measured": [{"algorithm": a, "nodes": 1, "ranks_per_node": 2,
                      "points": [[b, t] for b, t in zip(sizes, ts)]} for a, ts in times.items()],
    }
    path = tmp_path / "model.json"
    path.write_text(json.dumps(model))
    job = mpirun(2, "dist_cost_model.py", [path, tmp_path / "missing.json"], timeout=SHORT)
    lines = ok_lines(job, "dist_cost_model")
    assert len(lines) == 2, job.output


# 4. a rank dies ---------------------------------------------------------------------------

@pytest.mark.parametrize("np_,algorithm", [(3, "auto"), (2, "mpi")])
def test_killed_rank_ends_the_job(np_: int, algorithm: str) -> None:
    """Rank 1 exits with code 3 in the middle of a loop of allreduces: mpirun ends the job at
    once (survivors included, even ones blocked in MPI_Allreduce) with that code and names the
    process."""
    start = time.monotonic()
    job = mpirun(np_, "dist_kill.py", [algorithm, 1, 5], timeout=SHORT)
    elapsed = time.monotonic() - start
    assert job.returncode == 3, f"exit code {job.returncode}:\n{job.output}"
    assert "victim rank 1 exits at iteration 10" in job.stdout
    assert "finished" not in job.stdout, job.output
    assert re.search(r"Process name: \[\[\d+,\d+\],1\]\s+Exit code:\s+3", job.output), job.output
    assert elapsed < SHORT / 2, f"took {elapsed:.0f} s"


def test_killed_rank_raises_dist_error_in_survivors() -> None:
    """With mpirun told not to end the job (orte_abort_on_non_zero_status=0), each survivor
    raises ddl.DistError within init(timeout=5), naming the operation, itself and the dead
    peer, instead of hanging. (Open MPI 4.1's mpirun then exits 0 whatever the ranks' codes,
    so the survivors' lines are the evidence.)"""
    start = time.monotonic()
    job = mpirun(3, "dist_kill.py", ["ring", 1, 5], timeout=SHORT,
                 env={"OMPI_MCA_orte_abort_on_non_zero_status": "0"})
    elapsed = time.monotonic() - start
    assert "victim rank 1 exits at iteration 10" in job.stdout, job.output
    assert "finished" not in job.stdout, job.output
    for r in (0, 2):
        assert re.search(rf"survivor rank {r}: DistError: \w+ on rank {r}: timed out after 5s "
                         r"waiting for peer 1", job.stdout), job.output
    assert elapsed < SHORT / 2, f"took {elapsed:.0f} s"


def test_killed_rank_under_shm_is_named_at_once() -> None:
    """Under the shared-memory algorithm (auto's pick on one node) with init(timeout=60), the
    survivors of a rank that exits raise DistError naming it within seconds (before: only
    after the whole 60 s, where TCP names it at once)."""
    start = time.monotonic()
    job = mpirun(3, "dist_kill.py", ["shm", 1, 60], timeout=SHORT,
                 env={"OMPI_MCA_orte_abort_on_non_zero_status": "0"})
    elapsed = time.monotonic() - start
    assert "victim rank 1 exits at iteration 10" in job.stdout, job.output
    assert "finished" not in job.stdout, job.output
    for r in (0, 2):
        assert re.search(rf"survivor rank {r}: DistError: shm allreduce on rank {r}: peer 1's "
                         r"process exited", job.stdout), job.output
    assert elapsed < 30, f"took {elapsed:.0f} s"


# 5. bad arguments -------------------------------------------------------------------------

def test_the_algorithms_and_their_help_come_from_the_registry() -> None:
    """ALGORITHMS, ALGORITHM_HELP and allreduce_'s docstring list every algorithm of comm's
    registry, shm and hierarchical included, each with its syntax and help line."""
    assert dist.ALGORITHMS[0] == "auto"
    assert [name for name, _, _ in dist.ALGORITHM_HELP] == list(dist.ALGORITHMS)
    assert {"ring", "rhd", "multicolor", "multiring", "shm", "hierarchical", "mpi"} <= set(
        dist.ALGORITHMS)
    for name, syntax, text in dist.ALGORITHM_HELP:
        assert syntax.startswith(name) and text, (name, syntax, text)
        assert f"``{syntax}``: {text}" in dist.allreduce_.__doc__, name


def test_bad_arguments_raise_clear_errors() -> None:
    """Not initialised -> RuntimeError saying to call init(); int64 and other dtypes ->
    TypeError naming the dtype; unknown algorithm -> ValueError naming it; broadcast root out
    of range -> ValueError; after the shutdown at interpreter exit -> RuntimeError saying it
    was shut down, not to call init() (see dist_errors.py for every case)."""
    lines = ok_lines(alone("dist_errors.py"), "dist_errors")
    assert len(lines) == 1
    assert int(lines[0].split("cases=")[1]) >= 25, lines


# 6. the priority order --------------------------------------------------------------------

def test_priority_order_gives_the_weights_of_fifo() -> None:
    """DistributedOptimizer(comm_order="priority") defers each update to the next forward and
    ends bitwise where "fifo" does on 2 ranks (see dist_priority.py)."""
    lines = ok_lines(mpirun(2, "dist_priority.py", [], timeout=SHORT), "dist_priority")
    assert len(lines) == 2, lines
