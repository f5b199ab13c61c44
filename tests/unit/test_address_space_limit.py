"""The memory fence is re-based before every pass (replicas/memory.py): what the process
keeps between passes (threads' stacks, blocks held) does not eat the room `memory_limit_mib`
gives the next pass. Each case runs in a Python of its own, since the limit binds the whole
process."""

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
idle = [threading.Thread(target=stop.wait, daemon=True) for _ in range(4)]  # 32 MiB of stacks
[t.start() for t in idle]
kept = bytearray(30 * 2**20)  # held between passes, as a pinned heap or a JIT cache is
if sys.argv[1] == "rebase":
    fence.before_pass()
room = address_space()["room_bytes"] // 2**20
try:
    block = bytearray(60 * 2**20)  # the next pass
    fits = True
except MemoryError:
    fits = False
stop.set()
[t.join() for t in idle]
print(room, fits, fence.report()["kept_since_limit_bytes"] // 2**20)
"""


def _run(mode: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode],
        cwd=ROOT,
        # One arena, as a fenced replica has (config/allocator.py): no arena of a thread's
        # own takes room here, only the stacks and the block.
        env={"PATH": "/usr/bin:/bin", FENCED_ARENAS: str(FENCED_ARENA_MAX)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_what_is_kept_between_passes_leaves_the_next_pass_its_room() -> None:
    room_mib, fits, kept_mib = _run("rebase")
    assert int(room_mib) >= 99 and fits == "True", (room_mib, fits)
    assert int(kept_mib) >= 30 + 4 * 8, kept_mib


def test_a_limit_set_once_would_count_what_was_kept_as_spent() -> None:
    room_mib, fits, kept_mib = _run("once")
    assert int(room_mib) <= 100 - 30 - 4 * 8 and fits == "False", (room_mib, fits)
    assert kept_mib == "0"
