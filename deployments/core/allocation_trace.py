"""Where a serving process's Python memory grows, for finding a leak in a long run.

With TRIBUTARY_TRACE_ALLOCATIONS set to a directory, each serving process (the ingress, every
model replica) traces its allocations (`tracemalloc`, ~2x slower: never in production) and,
every TRIBUTARY_TRACE_EVERY_S seconds (60), writes `<name>-<pid>.txt` there: the lines whose
live memory grew most since its first write, with their callers. A leak shows as a line
that grows at every write; a cache or a window filling up stops growing once full. Each
write also adds a line to `<name>-<pid>.log`: the minutes since the start, the Python memory
traced and the process's RSS, in MiB. Where the RSS grows and the traced memory does not,
what grows is outside Python's objects (native libraries, the allocator's free lists).

    TRIBUTARY_TRACE_ALLOCATIONS=/tmp/trace SOAK_MINUTES=15 python -m tests.reliability.soak
"""

from __future__ import annotations

import linecache
import os
import threading
import time
import tracemalloc
from pathlib import Path

from deployments.core.process_status import status_kib

DIRECTORY_VARIABLE = "TRIBUTARY_TRACE_ALLOCATIONS"
EVERY_VARIABLE = "TRIBUTARY_TRACE_EVERY_S"
FRAMES = 6  # callers kept per allocation: enough to tell who holds it
TOP = 25


def trace_allocations(name: str) -> bool:
    """Starts tracing for this process when the variable asks for it; True if it did."""
    directory = os.environ.get(DIRECTORY_VARIABLE)
    if not directory or tracemalloc.is_tracing():
        return False
    every_s = float(os.environ.get(EVERY_VARIABLE) or 60)
    path = Path(directory) / f"{_safe(name)}-{os.getpid()}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    tracemalloc.start(FRAMES)
    thread = threading.Thread(
        target=_write_every, args=(path, every_s), name="tributary-allocation-trace", daemon=True
    )
    thread.start()
    return True


def _write_every(path: Path, every_s: float) -> None:
    started = time.monotonic()
    first: tracemalloc.Snapshot | None = None
    while True:
        time.sleep(every_s)
        if not tracemalloc.is_tracing():
            return  # someone stopped it (a test): nothing more to write
        snapshot = tracemalloc.take_snapshot().filter_traces(
            # What the report's own reading of source lines holds is not the process's.
            [
                tracemalloc.Filter(False, tracemalloc.__file__),
                tracemalloc.Filter(False, linecache.__file__),
            ]
        )
        if first is None:
            first = snapshot
            continue
        minutes = (time.monotonic() - started) / 60
        traced_mib = tracemalloc.get_traced_memory()[0] / 2**20
        with path.with_suffix(".log").open("a") as log:
            log.write(f"{minutes:.1f} min  traced {traced_mib:.1f} MiB  rss {_rss_mib()} MiB\n")
        # Whole or not at all: a reader never sees half a report.
        partial = path.with_suffix(".partial")
        partial.write_text(growth_report(first, snapshot, minutes))
        partial.replace(path)


def growth_report(first: tracemalloc.Snapshot, now: tracemalloc.Snapshot, minutes: float) -> str:
    """The lines whose live memory grew most between the two snapshots, with callers."""
    total = sum(stat.size for stat in now.statistics("filename")) / 2**20
    lines = [f"after {minutes:.1f} min: {total:.1f} MiB traced; growth since the first write:"]
    for stat in now.compare_to(first, "traceback")[:TOP]:
        lines.append(
            f"\n{stat.size_diff / 2**10:+.0f} KiB ({stat.count_diff:+d} blocks), "
            f"now {stat.size / 2**10:.0f} KiB"
        )
        lines.extend(f"    {line}" for line in stat.traceback.format()[-2 * FRAMES :])
    return "\n".join(lines) + "\n"


def _rss_mib() -> str:
    kib = status_kib("VmRSS")
    return "?" if kib is None else f"{kib / 1024:.1f}"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
