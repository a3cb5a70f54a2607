"""ddl-train's compile script (``trainer/src/compiled/step.py``) remembers Inductor's probes of
the CPU's vector instructions: a probe that passed is not run again by a later compile, whose
verdicts stay those of the probes, and a probe that failed is not remembered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Longest one process may take: a few seconds here, so only a hang reaches it.
TIMEOUT = 300

#: Runs in a new Python: the verdict of Inductor's AVX2 probe, through the script's memo; with
#: argv[1] == "fail", the probes themselves are replaced by one that always fails.
VERDICTS = """
import json, sys
sys.path.insert(0, sys.argv[2])
from torch._inductor import cpu_vec_isa
import step
if sys.argv[1] == "fail":
    cpu_vec_isa.VecISA.check_build = lambda isa, code: False
step.remember_isa_probes()
print(json.dumps(cpu_vec_isa.VecAVX2().check_build(cpu_vec_isa.VecISA._avx_code)))
"""


def avx2_verdict(probes: str, cache: Path) -> bool:
    run = subprocess.run(
        [sys.executable, "-c", VERDICTS, probes, ROOT / "trainer/src/compiled"],
        capture_output=True, text=True, timeout=TIMEOUT,
        env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)})
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_a_passed_probe_is_remembered_and_a_failed_one_is_not(tmp_path):
    cache = tmp_path / "inductor"
    memo = cache / "ddl-isa-probes.json"
    # Nothing remembered and the probe fails: the failure is not kept.
    assert avx2_verdict("fail", cache) is False
    assert not memo.exists()
    # The real probe (every machine ddl runs on has AVX2), remembered.
    assert avx2_verdict("real", cache) is True
    assert len(json.loads(memo.read_text())) == 1
    # A probe that would fail now is not run: the verdict is the remembered one.
    assert avx2_verdict("fail", cache) is True
