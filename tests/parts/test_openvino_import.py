"""OpenVINO in a process like a replica's: Ray's jemalloc preloaded (config/allocator.py).

Before `import_openvino`, the first compile aborted there on an Intel Xeon with AMX (TBB's
hwloc freed jemalloc's strings with glibc's free), and the import forked a process to send
a usage event. Each check runs in a fresh Python, since a preload takes effect only at a
process's start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from deployments.backends.runtimes.build import installed
from deployments.config.allocator import PRELOAD, jemalloc_path

ROOT = Path(__file__).resolve().parents[2]

COMPILE_ON_JEMALLOC = """
import os
import numpy as np
forks = []
os.register_at_fork(before=lambda: forks.append(1))
os.environ.pop("CI", None)
from deployments.backends.runtimes.openvino_import import import_openvino
ov = import_openvino()
from openvino import opset8 as ops
x = ops.parameter([2, 3], np.float32, name="x")
model = ov.Model([ops.multiply(x, ops.constant(np.float32(2)))], [x])
compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": 2})
out = compiled.create_infer_request().infer({"x": np.ones((2, 3), np.float32)})
print(float(np.asarray(out[compiled.output(0)]).sum()), len(forks), "CI" in os.environ)
"""


def test_openvino_compiles_and_runs_with_jemalloc_preloaded_and_forks_nothing(
    tmp_path: Path,
) -> None:
    if not installed("openvino"):
        pytest.skip("the openvino extra is not installed")
    path = jemalloc_path()
    if path is None:
        pytest.skip("Ray's wheel carries no jemalloc on this platform")
    env = {PRELOAD: str(path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # no opt-out of ours
    out = subprocess.run(
        [sys.executable, "-c", COMPILE_ON_JEMALLOC],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    total, forks, ci_left = out.stdout.split()
    assert float(total) == 12.0
    assert forks == "0"  # no usage event sent from a forked copy
    assert ci_left == "False"  # the import's switch is put back
