"""OpenVINO's oneDNN kernel cache is bounded before the first compile (runtimes/build.py),
and a capacity the user set stands."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from deployments.backends.runtimes.build import (
    ONEDNN_CACHE_VARIABLE,
    ONEDNN_KERNELS,
    openvino_forward,
)


def compile_missing(tmp_path: Path) -> None:
    # The variable is set before OpenVINO is touched; the compile then fails on no file.
    with pytest.raises(RuntimeError, match=r"missing\.onnx"):
        openvino_forward(tmp_path / "missing.onnx", "f32", threads=1)


def test_the_kernel_cache_is_bounded_before_the_first_compile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ONEDNN_CACHE_VARIABLE, raising=False)
    compile_missing(tmp_path)
    assert os.environ[ONEDNN_CACHE_VARIABLE] == str(ONEDNN_KERNELS)


def test_a_capacity_the_user_set_stands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ONEDNN_CACHE_VARIABLE, "1024")
    compile_missing(tmp_path)
    assert os.environ[ONEDNN_CACHE_VARIABLE] == "1024"
