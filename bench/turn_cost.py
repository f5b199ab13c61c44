"""What a turn at a shared device costs (core/device_turns; docs/operations.md, "Sharing a
device"): the issue's goal is <= 50 us per turn, far below a forward pass.

  uncontended: take and give back a turn with nobody waiting, on a thread and on an event
      loop, with other replicas' slots in the table (they are scanned);
  hand-over: one process gives the turn back while another waits for it: the time from
      the release to the waiter running (the datagram, the wake-up, the lock).

    .venv/bin/python -m bench.turn_cost
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from deployments.core.device_turns.table import TurnTable
from deployments.core.device_turns.turns import DeviceTurns, TurnSettings

REALTIME, BATCH = 0, 2


def uncontended_us(path: Path, turns: int, replicas: int) -> tuple[float, float]:
    """(thread, event loop) microseconds per turn, taken and given back."""
    others = [
        DeviceTurns(TurnTable(path, 2, 2.0), f"other-{i}", TurnSettings(min_share=0.05))
        for i in range(replicas - 1)
    ]
    me = DeviceTurns(TurnTable(path, 2, 2.0), "me", TurnSettings(weight=2, min_share=0.05))
    start = time.perf_counter()
    for _ in range(turns):
        turn = me.acquire_blocking(REALTIME)
        me.release(turn)
    thread_us = (time.perf_counter() - start) / turns * 1e6

    async def on_loop() -> float:
        begin = time.perf_counter()
        for _ in range(turns):
            turn = await me.acquire(REALTIME)
            me.release(turn)
        return (time.perf_counter() - begin) / turns * 1e6

    loop_us = asyncio.run(on_loop())
    for turns_of in (me, *others):
        turns_of.close()
    return thread_us, loop_us


def _holder(path: str, rounds: int, ready: Any, out: Any) -> None:
    """Holds the turn, lets the waiter queue up, then gives it back and notes when."""
    turns = DeviceTurns(TurnTable(Path(path), 1, 2.0), "holder", TurnSettings())
    for _ in range(rounds):
        turn = turns.acquire_blocking(BATCH)
        ready.set()
        time.sleep(0.005)  # the waiter is asleep on its socket by now
        released = time.monotonic()
        turns.release(turn)
        out.put(released)
        time.sleep(0.005)  # the waiter takes and gives back its turn
    turns.close()


def hand_over_us(path: Path, rounds: int) -> list[float]:
    ctx = multiprocessing.get_context("spawn")
    ready, out = ctx.Event(), ctx.Queue()
    holder = ctx.Process(target=_holder, args=(str(path), rounds, ready, out))
    holder.start()
    waiter = DeviceTurns(TurnTable(path, 1, 2.0), "waiter", TurnSettings())
    gaps = []
    for _ in range(rounds):
        ready.wait(30)
        ready.clear()
        time.sleep(0.001)
        turn = waiter.acquire_blocking(REALTIME)
        granted = time.monotonic()
        waiter.release(turn)
        gaps.append((granted - out.get(timeout=30)) * 1e6)
    holder.join(30)
    waiter.close()
    return gaps


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=20000)
    parser.add_argument("--replicas", type=int, default=4, help="slots in the table")
    parser.add_argument("--rounds", type=int, default=5, help="repeats, median reported")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tributary-turns-") as tmp:
        thread, loop = [], []
        for n in range(args.rounds):
            t, a = uncontended_us(Path(tmp) / f"u{n}.turns", args.turns, args.replicas)
            thread.append(t)
            loop.append(a)
        gaps = hand_over_us(Path(tmp) / "h.turns", 200)
    print(
        f"uncontended turn, {args.replicas} replicas in the table, median of {args.rounds} x "
        f"{args.turns}: thread {statistics.median(thread):.1f} us, event loop "
        f"{statistics.median(loop):.1f} us"
    )
    gaps.sort()
    print(
        f"hand-over to a waiting process, 200 turns: median {statistics.median(gaps):.0f} us, "
        f"p90 {gaps[int(0.9 * len(gaps))]:.0f} us"
    )


if __name__ == "__main__":
    main()
