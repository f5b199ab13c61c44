"""A batched replica's memory: the fence and the limit it runs under, the warm-up probe that
finds the padded tokens a pass may hold (core/memory/token_ceiling.py), the passes that ran
out of memory anyway, and the device's figures for the gauges and the replica's info."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from deployments.config import EncoderModelConfig
from deployments.core.memory.split_retry import SplitReport
from deployments.core.memory.token_ceiling import TokenCeiling
from deployments.core.metrics.metrics import TributaryMetrics
from deployments.replicas.batched.model_threads import ModelThreads
from deployments.replicas.device_memory import DeviceMemory
from deployments.replicas.memory import AddressSpaceLimit, apply_memory_limit

logger = logging.getLogger("ray.serve")

# The device's gauges are read at most this often on the pass path (mem_get_info is a
# device call; a figure a second old is fresh enough for a dashboard).
DEVICE_EVERY_S = 1.0


class ReplicaMemory:
    def __init__(
        self,
        config: EncoderModelConfig,
        device: DeviceMemory,
        metrics: TributaryMetrics,
        fence: str | None = None,
    ) -> None:
        """`fence`: what `apply_memory_fence` set before the model loaded."""
        self._config = config
        self.device = device
        self._metrics = metrics
        self._report: dict[str, Any] = {
            "out_of_memory": 0,
            "split_retries": 0,
            "failed_alone": 0,
            "fence": fence,
            "limit": None,
            "probe": None,
        }
        self._device_read = 0.0
        self._limit: AddressSpaceLimit | None = None

    def probe(
        self,
        threads: ModelThreads,
        run_rows: Callable[[int], object],
        window: int,
        largest_tokens: int,
    ) -> TokenCeiling | None:
        """After the warm-up batch, on a model thread: passes of growing size (`run_rows(rows)`
        runs `rows` full rows of `window` padded tokens, up to `largest_tokens`) until the
        memory the config allows. None when the config allows no figure to probe against."""
        config = self._config
        allowance = self.device.allowance(
            config.probe_memory_fraction, config.memory_budget_mib, config.gpu_memory_fraction
        )
        if allowance is None:
            return None
        started = time.monotonic()
        ceiling = threads.call(
            self.device.probe,
            run_rows,
            window,
            largest_tokens,
            # Passes side by side share the allowance: each may take its part.
            allowance[0] // threads.passes,
        )
        self._report["probe"] = {
            **ceiling.report(),
            "allowed_from": allowance[1],
            "seconds": round(time.monotonic() - started, 3),
        }
        logger.info(
            "%s: memory probe over %s padded tokens: ceiling %s tokens (%s)",
            config.name,
            [p.padded_tokens for p in ceiling.points],
            ceiling.tokens,
            ceiling.why,
        )
        return ceiling

    def limit(self) -> None:
        """After warm-up: the address space the replica may still add, if configured."""
        self._limit = apply_memory_limit(self._config.memory_limit_mib)
        self._report["limit"] = None if self._limit is None else self._limit.describe()

    def before_pass(self) -> None:
        """Under a limit: the pass gets its `memory_limit_mib` over what is held now."""
        if self._limit is not None:
            self._limit.before_pass()

    def faulted(self, report: SplitReport) -> None:
        """A pass ran out of memory and was split (core/memory/split_retry.py)."""
        self._report["out_of_memory"] += report.faults
        self._report["split_retries"] += report.splits
        self._report["failed_alone"] += report.failed_alone
        name = self._config.name
        self._metrics.memory_faults(name, "out_of_memory", report.faults)
        self._metrics.memory_faults(name, "split_retry", report.splits)
        self._metrics.memory_faults(name, "failed_alone", report.failed_alone)

    def read_device(self, token_ceiling: int | None, force: bool = False) -> dict[str, Any] | None:
        """The device's figures into the gauges, at most every DEVICE_EVERY_S unless forced;
        returns them, or None when it was too soon."""
        now = time.monotonic()
        if not force and now - self._device_read < DEVICE_EVERY_S:
            return None
        self._device_read = now
        snapshot = self.device.snapshot()
        self._metrics.device(
            self._config.name,
            {k: snapshot.get(f"{k}_bytes") for k in ("total", "free", "process")},
            snapshot.get("utilization_percent"),
            token_ceiling,
        )
        return snapshot

    def report(self) -> dict[str, Any]:
        """Faults, fence, limit and probe, for the replica's info; under a limit, its
        address space then and now."""
        report = dict(self._report)
        if self._limit is not None:
            report["address_space"] = self._limit.report()
        return report
