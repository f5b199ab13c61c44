"""Hands the C allocator's free pages back to the system, now and then, in a serving process.

In a 15-minute soak the ingress's RSS grew ~2.5 MiB a minute while the Python memory it
traced stayed flat (docs/operations.md, "Finding what grows"). Its memory map put the growth
in glibc's per-thread arenas (15 of them, one for each thread that ever allocated: Ray's
gRPC and event threads, the loop, the executors): a chunk freed inside an arena stays
mapped until the arena's top is free, so under a load that interleaves long- and short-lived
allocations an arena only grows. `malloc_trim(0)` gives every whole free page of every arena
back (`madvise`); the pages are mapped again on their next use. It takes milliseconds and
releases the GIL, so once every TRIM_EVERY_S costs the process nothing it would notice.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Callable, Mapping

logger = logging.getLogger(__name__)

TRIM_EVERY_S = 30.0
_started = threading.Event()


def malloc_trim() -> Callable[[], bool] | None:
    """glibc's `malloc_trim(0)` (True when it gave memory back), or None where the C
    library has none (musl, macOS)."""
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: bool(trim(0))


def trim_every_s(environ: Mapping[str, str]) -> float:
    """`TRIBUTARY_HEAP_TRIM_S` in the environment the cluster started with, else
    TRIM_EVERY_S; 0 turns the trimming off, and what is not a number is ignored."""
    try:
        asked = float(environ.get("TRIBUTARY_HEAP_TRIM_S", TRIM_EVERY_S))
    except ValueError:
        return TRIM_EVERY_S
    return asked if asked >= 0 else TRIM_EVERY_S


def start_heap_trimmer() -> threading.Thread | None:
    """Starts the process's trimming thread, once (later calls return None), unless it is
    off or the C library cannot trim."""
    every_s, trim = trim_every_s(os.environ), malloc_trim()
    if every_s == 0 or trim is None or _started.is_set():
        return None
    _started.set()
    thread = threading.Thread(
        target=trim_until,
        args=(trim, every_s, threading.Event()),  # never set: it lives as long as the process
        name="native-heap-trim",
        daemon=True,
    )
    thread.start()
    return thread


def trim_until(trim: Callable[[], bool], every_s: float, stop: threading.Event) -> int:
    """Trims every `every_s` until `stop` is set; returns how many trims gave memory back."""
    gave_back = 0
    while not stop.wait(every_s):
        try:
            gave_back += trim()
        except Exception:  # a trim that fails must not end the thread or the process
            logger.exception("malloc_trim failed")
    return gave_back
