"""Waiting in tests for a state, not for a time."""

from __future__ import annotations

import asyncio
import time
from typing import Any


async def until(ready: Any, timeout_s: float = 10.0) -> None:
    """Waits for `ready()` (a plain or an async predicate) to hold: a loaded machine must
    not turn a test's fixed sleep into a failure."""
    deadline = time.monotonic() + timeout_s
    while True:
        held = ready()
        if asyncio.iscoroutine(held):
            held = await held
        if held:
            return
        assert time.monotonic() < deadline, "the awaited state never came"
        await asyncio.sleep(0.005)
