"""Giving the C allocator's free pages back (core/native_heap.py)."""

from __future__ import annotations

import os
import platform
import threading

import pytest

from deployments.core.native_heap import TRIM_EVERY_S, malloc_trim, trim_every_s, trim_until


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_glibc_gives_the_pages_freed_inside_its_heap_back() -> None:
    trim = malloc_trim()
    if platform.libc_ver()[0] != "glibc":
        assert trim is None
        return
    assert trim is not None
    # 64 KiB blocks: under glibc's mmap threshold, so they live in the heap; every other
    # one freed leaves holes that free() itself never returns (the heap's top is in use).
    blocks = [bytearray(64 * 1024) for _ in range(1024)]
    del blocks[::2]
    before = rss_mib()
    assert trim() is True
    assert before - rss_mib() > 16  # of the 32 MiB freed in holes
    assert len(blocks) == 512


def test_the_trimmer_runs_on_its_period_and_outlives_a_failing_trim() -> None:
    calls: list[int] = []
    stop = threading.Event()

    def trim() -> bool:
        calls.append(1)
        if len(calls) == 2:
            raise OSError("a trim that fails")
        if len(calls) == 4:
            stop.set()
        return True

    assert trim_until(trim, 0.001, stop) == 3
    assert len(calls) == 4


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, TRIM_EVERY_S), ("5", 5.0), ("0", 0.0), ("-1", TRIM_EVERY_S), ("x", TRIM_EVERY_S)],
)
def test_the_environment_sets_the_period_or_turns_it_off(
    value: str | None, expected: float
) -> None:
    environ = {} if value is None else {"TRIBUTARY_HEAP_TRIM_S": value}
    assert trim_every_s(environ) == expected
