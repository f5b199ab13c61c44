"""A model replica's turns at the device it shares with other models' replicas: which
table (one per device of a node), its capacity and this replica's weight, and the turn
around each forward pass, recorded in the metrics (core/device_turns has the mechanism).

On a CPU the device's capacity is its cores and a pass weighs its torch threads, so on a
small machine where every model uses every core one pass runs at a time, and on a large
one passes of models with few threads each run side by side. On a GPU `GPU_PASSES_AT_ONCE`
run side by side: measured on an H200 with the three default models on one card, one at a
time left the card idle while each pass's host-side work ran (the reranker fell to 0.12x
of its throughput, realtime p99 rose from 94 to 164 ms; docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

from deployments.config.base import ModelDeploymentConfig
from deployments.core.device_turns.sweep import sweep_tables
from deployments.core.device_turns.table import TurnTable
from deployments.core.device_turns.turns import (
    DeviceTurns,
    Turn,
    TurnSettings,
    pid_alive,
    table_path,
)
from deployments.core.metrics.metrics import TributaryMetrics
from deployments.core.priority import Priority

logger = logging.getLogger("ray.serve")

# Passes side by side on one GPU under `passes_at_once: auto`: small models' passes leave
# most of a card idle, so several run at once and turns order only what is beyond them.
GPU_PASSES_AT_ONCE = 4

# How often the share gauge is refreshed: reading every slot's share is cheap, not free.
SHARE_EVERY_S = 1.0


# How long a turn kept for a replica's next pass waits to be taken up: the next batch of
# the replica's own gate starts on the next turns of its event loop (or the engine's next
# step on its thread); past this, waiters take the device back.
KEPT_LEASE_S = 0.05

# The next pass a replica has ready when one ends: its class and when it falls due.
NextPass = Callable[[], tuple[Priority, float] | None]


class ReplicaTurns:
    def __init__(
        self, turns: DeviceTurns, metrics: TributaryMetrics, pause_for_realtime: bool = False
    ) -> None:
        """`pause_for_realtime`: a realtime pass stops the other processes that hold the
        device for lower classes while it runs (core/device_turns/pause.py; CPUs only)."""
        self.turns = turns
        self._pause_for_realtime = pause_for_realtime
        self._model = turns.model
        self._metrics = metrics
        # A turn kept at the end of a pass for the replica's next one, not yet taken up.
        self._kept: Turn | None = None
        self._kept_lock = threading.Lock()
        self._step: Turn | None = None  # the engine step's turn, on the engine's thread
        self._share_at = 0.0

    @asynccontextmanager
    async def turn(
        self,
        priority: Priority,
        urgent_at: float = math.inf,
        next_pass: NextPass | None = None,
        behind: Callable[[], Priority | None] | None = None,
        nudge: asyncio.Event | None = None,
        taken: Turn | None = None,
    ) -> AsyncIterator[None]:
        """Holds the device for one forward pass of the class; waits on the loop. With
        `next_pass`, a replica whose next pass is ready when this one ends keeps the
        device for it where that pass ranks first. `behind`: the most urgent class
        waiting in the replica behind this pass (looked at again when `nudge` is set):
        the turn is asked for at that class where it is higher. `taken`: a turn
        `take_now` already got for this pass."""
        turn = taken or self._take_kept(priority)
        if turn is None:
            inherit = None if behind is None else lambda: _klass(behind())
            turn = await self.turns.acquire(int(priority), urgent_at, inherit, nudge)
        try:
            yield
        finally:
            following = None if next_pass is None else next_pass()
            if following is None or not self._keep(turn, *following):
                self._give_back(turn)
            else:
                asyncio.get_running_loop().call_later(KEPT_LEASE_S, self._drop_kept, turn)

    @contextmanager
    def first_on_the_cores(self, priority: Priority) -> Iterator[None]:
        """Around a pass of the class: a realtime one has the cores to itself while it
        runs, the other models' passes of lower classes stopped (not this process's own:
        its gate keeps them from starting)."""
        if not self._pause_for_realtime or priority is not Priority.REALTIME:
            yield
            return
        stop = self.turns.pause_lower(int(priority))
        try:
            yield
        finally:
            seconds = self.turns.resume(stop)
            if stop.slots:
                self._metrics.device_paused(self._model, len(stop.slots), seconds)

    def take_now(self, priority: Priority, urgent_at: float = math.inf) -> Turn | None:
        """A turn if the device has one free this moment (or kept one for this replica),
        for `turn(taken=...)`; else None, and nothing is left waiting in the table."""
        turn = self._take_kept(priority)
        if turn is not None:
            return turn
        turn, granted = self.turns.try_acquire(int(priority), urgent_at)
        if granted:
            return turn
        self.turns.withdraw(turn)
        return None

    def before_step(self, priority: Priority) -> None:
        """On the engine's thread, before a step: waits there for the turn."""
        if self._step is not None:  # the last step failed before after_step
            self._give_back(self._step)
        self._step = self._take_kept(priority) or self.turns.acquire_blocking(int(priority))

    def after_step(self, following: Priority | None = None) -> None:
        """After the step's forward pass; `following`: the class of the next step, where
        sequences remain to step."""
        if self._step is None:
            return
        turn, self._step = self._step, None
        if following is None or not self._keep(turn, following, math.inf):
            self._give_back(turn)

    def drop_kept(self) -> None:
        """No next pass will come (the engine ran out of sequences): the kept turn goes."""
        with self._kept_lock:
            turn, self._kept = self._kept, None
        if turn is not None:
            self._give_back(turn)

    def _keep(self, turn: Turn, priority: Priority, urgent_at: float) -> bool:
        held_from, label, waited = turn.granted_at, Priority(turn.klass).label, turn.waited_s
        kept = self.turns.keep(turn, int(priority), urgent_at, KEPT_LEASE_S)
        self._record(label, waited, held_from)
        if kept:
            with self._kept_lock:
                self._kept = turn
        return kept

    def _take_kept(self, priority: Priority) -> Turn | None:
        with self._kept_lock:
            turn, self._kept = self._kept, None
        if turn is not None and not self.turns.take_up(turn, int(priority)):
            return None  # taken back after its lease: the pass asks afresh
        return turn

    def _drop_kept(self, turn: Turn) -> None:
        with self._kept_lock:
            if self._kept is not turn:
                return  # taken up
            self._kept = None
        self._give_back(turn)

    def _give_back(self, turn: Turn) -> None:
        held_from = turn.granted_at
        self.turns.release(turn)
        self._record(Priority(turn.klass).label, turn.waited_s, held_from)

    def _record(self, label: str, waited_s: float, held_from: float) -> None:
        now = time.monotonic()
        self._metrics.device_turn(self._model, label, waited_s, now - held_from)
        if now - self._share_at >= SHARE_EVERY_S:
            self._share_at = now
            self._metrics.device_share(self._model, self.turns.my_share())

    def report(self) -> dict[str, Any]:
        """For /v1/stats: the device's table, this model's share and its turns per class."""
        report = self.turns.report()
        by_class = report.pop("by_class")
        assert isinstance(by_class, dict)
        report["by_class"] = {Priority(k).label: v for k, v in by_class.items()}
        return report

    def close(self) -> None:
        self.drop_kept()
        self.turns.close()


def open_turns(
    config: ModelDeploymentConfig,
    device: str,
    torch_threads: int,
    passes: int,
    metrics: TributaryMetrics,
) -> ReplicaTurns | None:
    """The replica's turns at its device, or None with the arbiter off (each pass runs
    when it comes, as if the model were alone) or when the table cannot be opened (said
    in the log; the replica serves without turns rather than not at all)."""
    arbiter = config.device_arbiter
    if not arbiter.enabled:
        return None
    gpu = device.startswith("cuda")
    if arbiter.passes_at_once == "auto":
        capacity = GPU_PASSES_AT_ONCE if gpu else os.cpu_count() or 1
        weight = 1 if gpu else max(1, min(torch_threads, capacity))
    else:
        capacity, weight = arbiter.passes_at_once, 1
    settings = TurnSettings(
        priority=config.device_turns.priority,
        min_share=config.device_turns.min_share,
        weight=weight,
        max_hold_s=arbiter.max_hold_s,
    )
    path = table_path(_table_dir(), _node_key(), _device_key(device))
    # A GPU runs its queued kernels whatever the host process does: stopping one gains
    # nothing there.
    pause = arbiter.pause_for_realtime and not gpu
    with contextlib.suppress(OSError):
        sweep_tables(path.parent, keep=path, is_alive=pid_alive)
    try:
        table = TurnTable(path, capacity, arbiter.share_window_s)
        turns = DeviceTurns(table, config.name, settings, passes=passes)
    except OSError as exc:
        logger.warning("%s: no device turns (%s): passes run as if alone", config.name, exc)
        return None
    logger.info(
        "%s: device turns on %s (capacity %d, weight %d, priority %d, min_share %g%s)",
        config.name,
        path,
        capacity,
        weight,
        settings.priority,
        settings.min_share,
        ", realtime passes pause lower ones" if pause else "",
    )
    return ReplicaTurns(turns, metrics, pause_for_realtime=pause)


def _table_dir() -> Path:
    """The user's own folder, in shared memory where the system has it: two users' (or
    two instances') replicas never share or block on one another's files."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    return base / f"tributary-{os.getuid()}"


def _node_key() -> str:
    """This Ray node (a cluster started again gets a new one); the process's own outside Ray."""
    try:
        import ray

        if ray.is_initialized():
            return ray.get_runtime_context().get_node_id()[:16]
    except Exception:  # no Ray context
        pass
    # Outside Ray (tests, benches in one process): a table of the process's own.
    return f"pid{os.getpid()}"


def _device_key(device: str) -> str:
    if not device.startswith("cuda"):
        return "cpu"
    try:
        import ray

        if ray.is_initialized() and ray.get_gpu_ids():
            return f"gpu{ray.get_gpu_ids()[0]}"
    except Exception:  # outside a Ray worker
        pass
    return f"gpu{os.environ.get('CUDA_VISIBLE_DEVICES', '0').split(',')[0]}"


def _klass(priority: Priority | None) -> int | None:
    return None if priority is None else int(priority)
