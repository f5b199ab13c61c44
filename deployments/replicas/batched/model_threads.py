"""The model's own threads: every forward pass runs on one, as does the start-up work on the
model (choosing its runtime, the warm-up batch, the memory probe), so the replica's event
loop keeps accepting and batching while the model works.

One thread runs one pass at a time. A runtime built to run passes side by side (its
`passes_in_flight`) gets as many threads, sharing the torch threads between them (`spread`).
Torch's thread count is per OS thread, so each thread sets its own as it starts.

A replica with a realtime lane (core/batching/priority_gate.py) has one thread more, with
few torch threads of its own, that runs only the realtime batches which find every other
thread busy; it calls the runtime's lane forward (backends/runtimes/lane.py).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

import torch

P = ParamSpec("P")
R = TypeVar("R")


class ModelThreads:
    def __init__(self, torch_threads: int) -> None:
        """`torch_threads`: the threads the model may use; 0 takes torch's default."""
        self.torch_threads = torch_threads or torch.get_num_threads()
        self.passes = 1  # forward passes that may run side by side
        self.native_ids: list[int] = []  # of the model threads, as they start
        self._executor = self._start(1, self.torch_threads)
        self._lane: ThreadPoolExecutor | None = None
        self.lane_native_id: int | None = None

    def _start(self, workers: int, torch_threads: int) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(
            max_workers=workers, initializer=self._thread_starts, initargs=(torch_threads,)
        )

    def _thread_starts(self, torch_threads: int) -> None:
        torch.set_num_threads(torch_threads)
        self.native_ids.append(threading.get_native_id())

    def call(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """`fn` on a model thread, waited for: the start-up work, before any request."""
        return self._executor.submit(fn, *args, **kwargs).result()

    async def run(self, fn: Callable[..., R], *args: Any, lane: bool = False) -> R:
        """`fn` on a model thread while the event loop goes on: a forward pass; on the
        realtime lane's thread where `lane`."""
        executor = self._lane if lane and self._lane is not None else self._executor
        return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)

    @property
    def has_lane(self) -> bool:
        return self._lane is not None

    def open_lane(self, torch_threads: int, on_start: Callable[[], None]) -> None:
        """Starts the realtime lane's thread, with `torch_threads` of torch's; `on_start`
        runs on it first (it points the thread at the lane's forward)."""

        def starts() -> None:
            torch.set_num_threads(max(1, torch_threads))
            self.lane_native_id = threading.get_native_id()
            on_start()

        self._lane = ThreadPoolExecutor(max_workers=1, initializer=starts)
        # Started now, so that a broken lane fails the replica's start, not a request.
        self._lane.submit(lambda: None).result()

    def spread(self, passes: int) -> None:
        """After the runtime is built for `passes` at once: as many model threads, sharing
        the torch threads. Before anything that reads `passes` (the batcher) is built."""
        if passes <= 1:
            return
        each = max(1, self.torch_threads // passes)
        single, self.native_ids = self._executor, []
        self._executor = self._start(passes, each)
        single.shutdown(wait=True)
        self.passes = passes

    def report(self) -> dict[str, Any]:
        """For bench/cost_budget.py, which tells the forward pass's CPU from the rest: the
        model threads, and every Python thread (a runtime's own pool is neither)."""
        return {
            "model": self.native_ids[0] if self.native_ids else None,
            "models": list(self.native_ids),
            "lane": self.lane_native_id,
            "python": sorted(t.native_id for t in threading.enumerate() if t.native_id),
        }
