"""A model replica's turns at the device it shares with other models' replicas: which
table (one per device of a node), its capacity and this replica's weight, and the turn
around each forward pass, recorded in the metrics (core/device_turns has the mechanism).

On a CPU the device's capacity is its cores and a pass weighs its torch threads, so on a
small machine where every model uses every core one pass runs at a time, and on a large
one passes of models with few threads each run side by side. On a GPU passes of separate
processes only time-slice the card, so one runs at a time.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from deployments.config.base import ModelDeploymentConfig
from deployments.core.device_turns.table import TurnTable
from deployments.core.device_turns.turns import DeviceTurns, Turn, TurnSettings, table_path
from deployments.core.metrics.metrics import TributaryMetrics
from deployments.core.priority import Priority

logger = logging.getLogger("ray.serve")

# How often the share gauge is refreshed: reading every slot's share is cheap, not free.
SHARE_EVERY_S = 1.0


class ReplicaTurns:
    def __init__(self, turns: DeviceTurns, metrics: TributaryMetrics) -> None:
        self.turns = turns
        self._model = turns.model
        self._metrics = metrics
        self._step: Turn | None = None  # the engine step's turn, on the engine's thread
        self._share_at = 0.0

    @asynccontextmanager
    async def turn(self, priority: Priority, urgent_at: float = math.inf) -> AsyncIterator[None]:
        """Holds the device for one forward pass of the class; waits on the loop."""
        turn = await self.turns.acquire(int(priority), urgent_at)
        try:
            yield
        finally:
            self._give_back(turn)

    def before_step(self, priority: Priority) -> None:
        """On the engine's thread, before a step: waits there for the turn."""
        if self._step is not None:  # the last step failed before after_step
            self._give_back(self._step)
        self._step = self.turns.acquire_blocking(int(priority))

    def after_step(self) -> None:
        if self._step is not None:
            turn, self._step = self._step, None
            self._give_back(turn)

    def _give_back(self, turn: Turn) -> None:
        held_from = time.monotonic()
        self.turns.release(turn)
        label = Priority(turn.klass).label
        self._metrics.device_turn(self._model, label, turn.waited_s, held_from - turn.granted_at)
        if held_from - self._share_at >= SHARE_EVERY_S:
            self._share_at = held_from
            self._metrics.device_share(self._model, self.turns.my_share())

    def report(self) -> dict[str, Any]:
        """For /v1/stats: the device's table, this model's share and its turns per class."""
        report = self.turns.report()
        by_class = report.pop("by_class")
        assert isinstance(by_class, dict)
        report["by_class"] = {Priority(k).label: v for k, v in by_class.items()}
        return report

    def close(self) -> None:
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
        capacity = 1 if gpu else os.cpu_count() or 1
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
    try:
        table = TurnTable(path, capacity, arbiter.share_window_s)
        turns = DeviceTurns(table, config.name, settings, passes=passes)
    except OSError as exc:
        logger.warning("%s: no device turns (%s): passes run as if alone", config.name, exc)
        return None
    logger.info(
        "%s: device turns on %s (capacity %d, weight %d, priority %d, min_share %g)",
        config.name,
        path,
        capacity,
        weight,
        settings.priority,
        settings.min_share,
    )
    return ReplicaTurns(turns, metrics)


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
