"""The suite's hang watchdog (tests/hang_watchdog.py) ends a run whose test hangs where
pytest-timeout cannot reach: in a teardown after the timeout has already fired."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

HANGS_AFTER_ITS_TIMEOUT = """
import time
import pytest

@pytest.fixture
def stuck_teardown():
    yield
    time.sleep(600)  # a teardown that waits on what the failed test left behind

@pytest.mark.timeout(1)
def test_times_out_then_hangs(stuck_teardown):
    time.sleep(30)

def test_never_reached():
    pass
"""


def test_a_hang_past_the_timeout_ends_the_run_with_its_stack(tmp_path: Path) -> None:
    (tmp_path / "test_hangs.py").write_text(HANGS_AFTER_ITS_TIMEOUT)
    env = {**os.environ, "TRIBUTARY_TEST_HARD_LIMIT_S": "4"}
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = str(root)
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.hang_watchdog",
            "-p",
            "no:cacheprovider",
            "-o",
            "timeout_method=signal",
            str(tmp_path / "test_hangs.py"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert time.monotonic() - started < 60
    assert done.returncode != 0
    assert "Timeout" in done.stderr
    assert "stuck_teardown" in done.stderr  # the stack says where it hung
    assert "test_never_reached" not in done.stdout
