"""The soak's split of a process's resident memory by kind of mapping
(tests/reliability/memory_map.py), read from this process's own /proc."""

from __future__ import annotations

import os
import sys

import pytest

from deployments.core.process_status import status_kib
from tests.reliability.memory_map import KINDS, rss_by_kind

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_the_kinds_add_up_to_the_resident_size() -> None:
    kinds = rss_by_kind(os.getpid())
    rss_kib = status_kib("VmRSS")
    assert kinds is not None and rss_kib is not None
    assert set(kinds) == set(KINDS)
    assert kinds["files"] > 1  # the interpreter and its libraries
    # Read a moment apart, so allow the test's own allocations between them.
    assert abs(sum(kinds.values()) - rss_kib / 1024) < 16


def test_a_large_block_shows_as_mapped_on_its_own() -> None:
    before = rss_by_kind(os.getpid())
    block = bytes(range(256)) * (256 * 1024)  # 64 MiB, written: resident
    after = rss_by_kind(os.getpid())
    assert before is not None and after is not None
    grown = after["other anonymous"] - before["other anonymous"]
    assert 60 < grown < 80, f"{grown} MiB"
    assert len(block) == 64 << 20


def test_a_process_that_is_gone_has_no_figures() -> None:
    assert rss_by_kind(2**22 + 1) is None  # above Linux's pid_max limit
