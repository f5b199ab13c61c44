"""A request held open on one chosen replica of a model, seen from the replicas' CPU time.

Serve picks the replica of every call, so a test cannot send a request to a node. It can
make one land there and then check: a long request of the batch class goes out while the
model is idle, and the replica that starts burning CPU (read from /proc: every node of the
local cluster is a process group on this machine) is the one computing it. The replicas'
own `info()` cannot say it: Serve routes each `info()` to the less busy replica, which is
never the one holding the request. If the request landed on the wrong replica, the next
goes out while the first still runs: Serve's router then prefers the other, idle replica.

The held request is long: every text fills the model's window, the batch class's token
budget admits one such text per forward pass, and it has `HELD_TEXTS` of them, each a pass
of tens of milliseconds on one core; tens of seconds in all, longer than any test waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.cluster.traffic import Outcome, embed

HELD_TEXTS = 512  # within the batch class's admission bound (1024 queued items)
LONG_TEXT = " ".join(f"tributary{i}" for i in range(300))  # > 256 tokens: truncated to them
HELD_CLASS = "batch"
SAMPLE_S = 1.0
# A replica computing a held request burns most of a core; an idle one next to nothing.
# Half a core leaves room for a loaded machine that gives the replica less than all of one.
BUSY_SHARE = 0.3
IDLE_SHARE = 0.1


@dataclass
class Held:
    """One held request: its client task, and the pid of the replica computing it."""

    task: asyncio.Task[Outcome]
    pid: int


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks


async def cpu_shares(pids: list[int], seconds: float = SAMPLE_S) -> dict[int, float]:
    """The share of one core each process used over the next `seconds`."""
    before = {pid: cpu_seconds(pid) for pid in pids}
    await asyncio.sleep(seconds)
    return {pid: (cpu_seconds(pid) - before[pid]) / seconds for pid in pids}


async def computing(pid: int, timeout_s: float = 20) -> bool:
    """Whether the process burns CPU like a replica running forward passes, within
    `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (await cpu_shares([pid]))[pid] >= BUSY_SHARE:
            return True
    return False


async def hold_on_replica(
    client: httpx.AsyncClient,
    url: str,
    model: str,
    target: int,
    other: int,
    timeout_s: float,
    attempts: int = 2,
) -> tuple[Held, list[Held]]:
    """A request held on replica `target` (and those that landed on `other` meanwhile).

    Call it while the model has no other traffic, so that a busy replica is busy with a
    held request."""
    body = {"model": model, "input": [LONG_TEXT] * HELD_TEXTS, "priority": HELD_CLASS}
    missed: list[Held] = []
    for _ in range(attempts):
        task = asyncio.create_task(embed(client, url, body, timeout_s))
        pid = await landed(target, other, len(missed), task)
        held = Held(task, pid)
        if pid == target:
            return held, missed
        missed.append(held)
    for held in missed:
        await cancel(held)
    raise AssertionError(f"Serve routed {attempts} held requests away from replica {target}")


async def landed(
    target: int, other: int, held_on_other: int, task: asyncio.Task[Outcome], timeout_s: float = 30
) -> int:
    """The replica that started computing the new request: `target` once it burns CPU; `other`
    once it does while `target` stays idle (when `other` already computes older held
    requests, only a busy `target` tells)."""
    deadline = time.monotonic() + timeout_s
    shares: dict[int, float] = {}
    while time.monotonic() < deadline:
        if task.done():
            raise AssertionError(f"the held request ended before it was held: {task.result()}")
        shares = await cpu_shares([target, other])
        if shares[target] >= BUSY_SHARE:
            return target
        if not held_on_other and shares[other] >= BUSY_SHARE and shares[target] < IDLE_SHARE:
            return other
    raise AssertionError(f"no replica computed the held request in {timeout_s}s: {shares}")


async def cancel(held: Held) -> None:
    """The client goes away; the ingress cancels the call and the replica drops its items."""
    held.task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await held.task
