"""Tables left by Ray nodes that are gone: each start of a node makes a table file of its
own (with a wake socket per slot), and nothing else removes them.

A table is stale when none of its slots is held by a live process and it has not been
touched for a while; it is removed under its own lock, with its sockets. The age guard
covers a node whose first replica has created the file and not yet claimed a slot in it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from deployments.core.device_turns.table import (
    FILE_SIZE,
    FREE,
    HEADER,
    HEADER_SIZE,
    LAYOUT_VERSION,
    MAGIC,
    PID,
    SLOT,
    SLOTS,
    STATE,
)

logger = logging.getLogger(__name__)

STALE_AFTER_S = 300.0


def live_holders(data: bytes, is_alive: Callable[[int], bool]) -> list[int] | None:
    """The live pids with a slot in the table `data`; None when it is not a table of
    this layout (left alone: another release's, or not ours to judge)."""
    if len(data) != FILE_SIZE:
        return None
    magic, version, *_ = HEADER.unpack_from(data, 0)
    if magic != MAGIC or version != LAYOUT_VERSION:
        return None
    rows = SLOT.iter_unpack(data[HEADER_SIZE : HEADER_SIZE + SLOTS * SLOT.size])
    return [int(r[PID]) for r in rows if r[STATE] != FREE and is_alive(int(r[PID]))]


def sweep_tables(
    directory: Path,
    keep: Path,
    is_alive: Callable[[int], bool],
    now: float | None = None,
    stale_after_s: float = STALE_AFTER_S,
) -> list[Path]:
    """Removes the stale tables in `directory` (never `keep`); returns those removed."""
    now = time.time() if now is None else now
    removed: list[Path] = []
    for path in sorted(directory.glob("*.turns")):
        if path == keep:
            continue
        try:
            if now - path.stat().st_mtime < stale_after_s:
                continue
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue  # gone meanwhile, or not ours
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            holders = live_holders(os.pread(fd, FILE_SIZE, 0), is_alive)
            if holders == []:
                for socket_file in directory.glob(f"{path.name}.*.sock"):
                    socket_file.unlink(missing_ok=True)
                path.unlink(missing_ok=True)
                removed.append(path)
        except OSError as exc:
            logger.info("could not sweep %s: %s", path, exc)
        finally:
            os.close(fd)
    return removed
