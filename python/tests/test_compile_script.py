"""ddl-train's compile script (``trainer/src/compiled/step.py``) remembers Inductor's probes of
the CPU's vector instructions: a probe that passed is not run again by a later compile, whose
verdicts stay those of the probes, and a probe that failed is not remembered; the processes it
starts die with it."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Longest the process may take: a few seconds here, so only a hang reaches it.
TIMEOUT = 300

#: Runs in a new Python with an empty Inductor cache: the verdict of Inductor's AVX2 probe through
#: the script's memo, and how many verdicts the memo then holds, three times: the probe replaced
#: by one that fails, the real probe, the failing one again.
PROBES = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
from torch._inductor import cpu_vec_isa
from torch._inductor.runtime.cache_dir_utils import cache_dir
import step
real = cpu_vec_isa.VecISA.check_build
memo = os.path.join(cache_dir(), "ddl-isa-probes.json")
seen = []
for probe in [lambda isa, code: False, real, lambda isa, code: False]:
    cpu_vec_isa.VecISA.check_build = probe
    step.remember_isa_probes()
    verdict = cpu_vec_isa.VecAVX2().check_build(cpu_vec_isa.VecISA._avx_code)
    seen.append([verdict, len(json.load(open(memo))) if os.path.exists(memo) else 0])
print(json.dumps(seen))
"""


def test_a_passed_probe_is_remembered_and_a_failed_one_is_not(tmp_path):
    run = subprocess.run(
        [sys.executable, "-c", PROBES, ROOT / "trainer/src/compiled"],
        capture_output=True, text=True, timeout=TIMEOUT,
        env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})
    assert run.returncode == 0, run.stderr[-3000:]
    failed, passed, remembered = json.loads(run.stdout.strip().splitlines()[-1])
    # A failed probe is not kept; the real one passes (every machine ddl runs on has AVX2) and
    # is kept; a probe that would fail now is not run: the verdict is the remembered one.
    assert failed == [False, 0]
    assert passed == [True, 1]
    assert remembered == [True, 1]


#: Imports the compile script, starts a long command through its ``spawn``, prints the child's
#: pid and is killed (SIGKILL), as a compile is when ddl-train is.
SPAWN = """
import os, signal, subprocess, sys
sys.path.insert(0, sys.argv[1])
import step
child = step.spawn(["sleep", "600"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(child.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_what_the_script_starts_dies_with_it() -> None:
    """The check and the CUDA graph library's compiler that the compile script starts are
    killed by the kernel when the script is (ddl-train has it killed when ddl-train ends)."""
    run = subprocess.run([sys.executable, "-c", SPAWN, ROOT / "trainer/src/compiled"],
                         capture_output=True, text=True, timeout=TIMEOUT)
    assert run.returncode == -signal.SIGKILL, run.stderr
    pid = int(run.stdout.split()[0])
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return  # gone already
    try:
        ended, _, _ = select.select([fd], [], [], 30)
        if not ended:
            os.kill(pid, signal.SIGKILL)
        assert ended, f"the script's child {pid} outlived it"
    finally:
        os.close(fd)
