"""The memory fence follows the threads started after it (replicas/memory.py): their stacks
get room of their own, so the passes keep the room `memory_limit_mib` gave them. Each case
runs in a Python of its own, since the limit binds the whole process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from deployments.config.allocator import FENCED_ARENA_MAX, FENCED_ARENAS

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS")

SCRIPT = """
import sys, threading
from deployments.replicas.memory import apply_memory_limit, address_space
fence = apply_memory_limit(100)
stop = threading.Event()
idle = [threading.Thread(target=stop.wait, daemon=True) for _ in range(6)]  # 48 MiB of stacks
[t.start() for t in idle]
if sys.argv[1] == "follow":
    fence.follow_threads()
room = address_space()["room_bytes"] // 2**20
try:
    block = bytearray(60 * 2**20)
    fits = True
except MemoryError:
    fits = False
stop.set()
[t.join() for t in idle]
print(room, fits, fence.report()["threads_since"])
"""


def _run(mode: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode],
        cwd=ROOT,
        # One arena, as a fenced replica has (config/allocator.py): no arena of a thread's
        # own takes room here, only the stacks.
        env={"PATH": "/usr/bin:/bin", FENCED_ARENAS: str(FENCED_ARENA_MAX)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_threads_started_after_the_fence_get_their_stacks_and_the_passes_keep_their_room() -> None:
    room_mib, fits, since = _run("follow")
    assert int(room_mib) >= 90 and fits == "True", (room_mib, fits)
    assert int(since) >= 6


def test_without_following_the_threads_their_stacks_would_eat_the_room() -> None:
    room_mib, fits, since = _run("stay")
    assert int(room_mib) <= 100 - 6 * 8 and fits == "False", (room_mib, fits)
    assert since == "0"
