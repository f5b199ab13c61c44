"""A process's figures as Linux reports them in /proc/<pid>/status."""

from __future__ import annotations

from pathlib import Path


def status_kib(field: str, pid: int | str = "self") -> int | None:
    """`field` (VmRSS, VmHWM, ...) of process `pid` in KiB; None where there is no such
    process or field (not Linux, or the process has ended)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None
