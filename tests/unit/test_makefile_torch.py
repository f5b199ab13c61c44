"""The Makefile's TORCH variable: which pip command installs torch for each value, read from
`make -n` (nothing is run) with the venv pointed at a directory that does not exist."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def torch_install_line(tmp_path: Path, *variables: str) -> str:
    result = subprocess.run(
        ["make", "-n", "install", f"VENV={tmp_path / 'venv'}", *variables],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    lines = [line for line in result.stdout.splitlines() if '"torch==' in line]
    assert len(lines) == 1, result.stdout
    return lines[0]


def test_the_default_is_a_plain_pip_install_from_pips_own_index(tmp_path: Path) -> None:
    line = torch_install_line(tmp_path)
    assert "--index-url" not in line
    assert line.endswith('pip install --quiet  "torch==2.13.0"')


def test_cpu_installs_from_pytorchs_cpu_index(tmp_path: Path) -> None:
    line = torch_install_line(tmp_path, "TORCH=cpu")
    assert '--index-url https://download.pytorch.org/whl/cpu "torch==2.13.0"' in line


def test_a_cuda_version_installs_from_its_own_index(tmp_path: Path) -> None:
    line = torch_install_line(tmp_path, "TORCH=cu126", "TORCH_SPEC=torch==2.13.0")
    assert '--index-url https://download.pytorch.org/whl/cu126 "torch==2.13.0"' in line


def test_an_unknown_value_stops_before_anything_is_installed(tmp_path: Path) -> None:
    result = subprocess.run(
        ["make", "install", "TORCH=gpu", f"VENV={tmp_path / 'venv'}", "PYTHON=false"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode != 0
    assert "TORCH=gpu: use default, cpu or cuXYZ" in result.stdout
    assert not (tmp_path / "venv").exists()
