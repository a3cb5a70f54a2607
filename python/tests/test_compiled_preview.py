"""ddl-train's compiled step, as Inductor generates it for an H100/H200, previewed without a GPU
(``tools/gpu/preview.py``): a channels-last bf16 step stays channels-last. Every 4-D
activation, gradient and weight copy Inductor allocates, and every output it expects from
cuDNN, is laid out NHWC, so that no layout conversion runs between the convolutions; each
forward convolution has its backward in the same step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Longest the preview may take: about 20 s here, so only a hang reaches it.
TIMEOUT = 300


def test_a_channels_last_bf16_step_keeps_every_buffer_channels_last(tmp_path):
    run = subprocess.run(
        [sys.executable, ROOT / "tools/gpu/preview.py", "--model", "resnet_small",
         "--classes", "4", "--batch", "8", "--image-size", "32", "--precision", "bf16",
         "--channels-last", "--out", tmp_path],
        capture_output=True, text=True, timeout=TIMEOUT,
        env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["off_layout_count"] == 0, seen["off_layout"]
    assert seen["layouts"]["nhwc"] > 30, seen["layouts"]
    # resnet_small's 15 convolutions, forward and backward, all on cuDNN.
    assert seen["externs"]["convolution"] == 15, seen["externs"]
    assert seen["externs"]["convolution_backward"] == 15, seen["externs"]
    assert "def call(" in (tmp_path / "wrapper.py").read_text()
