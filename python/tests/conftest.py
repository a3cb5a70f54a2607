"""Shared fixtures of the ddl Python tests: real JPEG datasets packed by the built binaries,
and a launcher for scripts under ``mpirun``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional, Sequence

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / "target" / "release"
SCRIPTS = Path(__file__).resolve().parent / "scripts"
#: Longest any launched job may run: far above what each needs, so only a hang reaches it.
JOB_TIMEOUT = 300


def binary(name: str) -> Path:
    """A workspace binary; fails the test with a hint when it was not built."""
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{path} not built: run `make build` first")
    return path


def pack(out: Path, classes: int, per_class: int, val_per_class: int, shards: int,
         seed: int = 0, side: int = 96) -> Path:
    """Writes a ddl-synth tree of real JPEGs under ``out`` and packs it; returns the shards."""
    tree, packed = out / "imagenet", out / "shards"
    subprocess.run(
        [binary("ddl-synth"), tree, "--classes", str(classes), "--per-class", str(per_class),
         "--val-per-class", str(val_per_class), "--seed", str(seed), "--min-side", "48",
         "--max-side", "128"],
        check=True, capture_output=True)
    subprocess.run(
        [binary("ddl-pack"), tree, "-o", packed, "--shards", str(shards),
         "--max-short-side", str(side)],
        check=True, capture_output=True)
    return packed


@pytest.fixture(scope="session")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 classes x 24 train + 7 val images in 4 train shards (val: one shard per 7 images)."""
    return pack(tmp_path_factory.mktemp("data"), classes=4, per_class=24, val_per_class=7,
                shards=4)


@pytest.fixture(scope="session")
def uneven(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The images of ``shards`` packed into 3 train shards of 32, which do not divide evenly
    over 2 nodes: 64 and 32 records at home, 48 held by each."""
    return pack(tmp_path_factory.mktemp("uneven"), classes=4, per_class=24, val_per_class=7,
                shards=3)


class Job:
    """The outcome of a launched job."""

    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def torchrun(np: int, script: str, args: Sequence[str] = (), timeout: float = JOB_TIMEOUT,
             env: Optional[dict] = None) -> Job:
    """Runs ``tests/scripts/<script>`` with ``np`` ranks under torchrun (one node, the venv's
    torchrun, no MPI variables in sight), in a session of its own, and returns its outcome."""
    with socket.socket() as s:  # torchrun's agent serves its store on a port given to it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torchrun_bin = Path(sys.executable).parent / "torchrun"
    full_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("OMPI_", "PMIX_", "PMI_", "SLURM_"))}
    full_env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    full_env.update(env or {})
    # Without --log-dir, torchrun's agent keeps its logs in a /tmp/torchelastic_* folder that
    # nothing removes.
    with tempfile.TemporaryDirectory(prefix="ddl-torchrun-") as logs:
        cmd = [str(torchrun_bin), "--nproc_per_node", str(np), "--master_addr", "127.0.0.1",
               "--master_port", str(port), "--log-dir", logs, str(SCRIPTS / script),
               *map(str, args)]
        return _run(cmd, full_env, timeout, f"torchrun --nproc_per_node {np} {script}")


def torchrun_nodes(nodes: int, np: int, script: str, args: Sequence[str] = (),
                   timeout: float = JOB_TIMEOUT) -> Job:
    """Runs ``tests/scripts/<script>`` on ``nodes`` emulated nodes of ``np`` ranks each: one
    torchrun agent per node on this machine (``--nnodes``, ``--node_rank``, one static
    rendezvous), whose ranks ``ddl.dist`` groups into nodes by torchrun's ``GROUP_RANK``, as on
    a cluster. The agents' outputs are joined in node order."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torchrun_bin = Path(sys.executable).parent / "torchrun"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_", "SLURM_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    with tempfile.TemporaryDirectory(prefix="ddl-torchrun-") as logs:
        procs = [subprocess.Popen(
            [str(torchrun_bin), "--nnodes", str(nodes), "--node_rank", str(n),
             "--nproc_per_node", str(np), "--master_addr", "127.0.0.1", "--master_port",
             str(port), "--log-dir", logs, str(SCRIPTS / script), *map(str, args)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            start_new_session=True) for n in range(nodes)]
        outs = []
        deadline = time.monotonic() + timeout
        try:
            for proc in procs:
                outs.append(proc.communicate(timeout=max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            for proc in procs:
                os.killpg(proc.pid, signal.SIGKILL)
            outs = [proc.communicate() for proc in procs]
            pytest.fail(f"{nodes} x torchrun --nproc_per_node {np} {script} hung past "
                        f"{timeout} s:\n{outs}")
    code = next((proc.returncode for proc in procs if proc.returncode), 0)
    return Job(code, "".join(o for o, _ in outs), "".join(e for _, e in outs))


def launch(launcher: str, np: int, script: str, args: Sequence[str] = (),
           timeout: float = JOB_TIMEOUT, env: Optional[dict] = None) -> Job:
    """``script`` on ``np`` ranks under ``launcher`` (``"mpirun"`` or ``"torchrun"``)."""
    if launcher == "torchrun":
        return torchrun(np, script, args, timeout=timeout, env=env)
    return mpirun(np, script, args, timeout=timeout, env=env)


def _run(cmd: List[str], env: dict, timeout: float, what: str) -> Job:
    """Runs ``cmd`` in a session of its own, killing the whole session if it hangs."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{what} hung past {timeout} s:\n{out}\n{err}")
    return Job(proc.returncode, out, err)


def mpirun(np: int, script: str, args: Sequence[str] = (), timeout: float = JOB_TIMEOUT,
           env: Optional[dict] = None, bind: str = "none") -> Job:
    """Runs ``tests/scripts/<script>`` with ``np`` ranks under mpirun (``--bind-to bind``), in
    a session of its own (so the whole job can be killed if it hangs), and returns its
    outcome."""
    cmd: List[str] = ["mpirun", "--oversubscribe", "--bind-to", bind, "-np", str(np)]
    if os.getuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += [sys.executable, str(SCRIPTS / script), *map(str, args)]
    full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    full_env.update(env or {})
    return _run(cmd, full_env, timeout, f"mpirun -np {np} {script}")
