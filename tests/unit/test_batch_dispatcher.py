"""The Batch API's dispatcher on the real SQLite store with a fake line runner: each line
answered exactly once through crashes and lost leases, pacing, expiry, malformed lines."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from deployments.core.metrics.metric_series import BATCH_JOB_LINES
from deployments.core.metrics.metrics import MemoryRecorder, TributaryMetrics
from deployments.ingress.batches.dispatcher import Dispatcher
from deployments.ingress.batches.service import BatchService
from deployments.ingress.batches.sqlite_store import SqliteStore
from tests.unit.batch_support import (
    DyingStore,
    FakeRunner,
    config,
    input_file,
    new_batch,
    output_ids,
)
from tests.waiting import until


@pytest.fixture
async def store(tmp_path: Path):
    store = SqliteStore(tmp_path)
    yield store
    await store.close()


async def test_a_batch_runs_every_line_once_and_writes_its_files(store: SqliteStore) -> None:
    runner = FakeRunner()
    recorder = MemoryRecorder()
    await new_batch(store, input_file(30, extra=b"not json\n"), 31)
    dispatcher = Dispatcher(store, runner, config(), TributaryMetrics(recorder))
    assert await dispatcher.run_once()
    done = await store.get_batch("batch_1")
    assert done is not None and done.status == "completed"
    assert (done.completed, done.failed) == (30, 1)
    assert output_ids(store, done.output_file_id) == [f"c{i}" for i in range(30)]
    assert output_ids(store, done.error_file_id) == [None]
    assert sorted(runner.sent) == sorted(set(runner.sent))
    assert sum(recorder.values(BATCH_JOB_LINES, result="completed")) == 30
    assert not await dispatcher.run_once()  # nothing left to claim


async def test_a_crashed_dispatcher_is_resumed_without_running_a_line_twice(
    store: SqliteStore,
) -> None:
    first = FakeRunner()
    await new_batch(store, input_file(100), 100)
    dying = DyingStore(store)
    crashed = Dispatcher(dying, first, config(max_in_flight_lines=8))  # type: ignore[arg-type]
    first.gate.clear()
    task = asyncio.create_task(crashed.run_once())
    for _ in range(5):  # a few rounds of lines answered, then some in flight when it dies
        await until(lambda: first.in_flight > 0)
        first.gate.set()
        first.gate.clear()

    async def some_answered() -> bool:
        return len(await store.answered("batch_1")) > 0

    await until(some_answered)
    await until(lambda: first.in_flight > 0)
    assert len(await store.answered("batch_1")) < 100
    dying.dead = True  # the process dies: no release, no finalize
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, RuntimeError):
        await task
    answered_before = await store.answered("batch_1")
    second = FakeRunner()
    resumed = Dispatcher(store, second, config())
    assert not await resumed.run_once()  # the dead one's lease still holds
    await asyncio.sleep(0.35)
    assert await resumed.run_once()
    done = await store.get_batch("batch_1")
    assert done is not None and done.status == "completed"
    ids = output_ids(store, done.output_file_id)
    assert sorted(ids) == sorted(f"c{i}" for i in range(100))  # each custom_id once
    resent = {int(r.rsplit("_", 1)[1]) for r in second.sent}
    assert not resent & answered_before


async def test_a_dispatcher_that_lost_its_lease_stops(store: SqliteStore) -> None:
    runner = FakeRunner()
    runner.gate.clear()
    await new_batch(store, input_file(10), 10)
    slow = Dispatcher(store, runner, config())
    task = asyncio.create_task(slow.run_once())
    await until(lambda: runner.in_flight > 0)
    # Another dispatcher takes the batch over (as after a stall longer than the lease).
    await store.release("batch_1", slow.owner)
    other = FakeRunner()
    assert await Dispatcher(store, other, config()).run_once()
    await asyncio.wait_for(task, 2)  # the first learns at its heartbeat and stops
    runner.gate.set()
    done = await store.get_batch("batch_1")
    assert done is not None and done.status == "completed"
    assert sorted(output_ids(store, done.output_file_id)) == sorted(f"c{i}" for i in range(10))


async def test_refusals_shrink_the_window_and_lines_are_sent_again(store: SqliteStore) -> None:
    runner = FakeRunner()
    runner.refuse = 5
    await new_batch(store, input_file(20), 20)
    assert await Dispatcher(store, runner, config(max_in_flight_lines=4)).run_once()
    done = await store.get_batch("batch_1")
    assert done is not None and (done.completed, done.failed) == (20, 0)
    assert len(runner.sent) == 25


async def test_no_line_starts_while_higher_classes_wait(store: SqliteStore) -> None:
    runner = FakeRunner()
    runner.busy = "queued"
    await new_batch(store, input_file(5), 5)
    task = asyncio.create_task(Dispatcher(store, runner, config()).run_once())
    await asyncio.sleep(0.2)
    assert runner.sent == []
    runner.busy = "idle"
    await asyncio.wait_for(task, 2)
    assert len(runner.sent) == 5


async def test_in_flight_lines_stay_within_the_ceiling(store: SqliteStore) -> None:
    runner = FakeRunner()
    runner.gate.clear()
    await new_batch(store, input_file(50), 50)
    task = asyncio.create_task(Dispatcher(store, runner, config(max_in_flight_lines=3)).run_once())
    await until(lambda: runner.in_flight == 3)
    await asyncio.sleep(0.05)  # room to start a fourth, were the ceiling not kept
    assert runner.in_flight == 3
    runner.gate.set()
    assert await asyncio.wait_for(task, 2)
    assert runner.most_in_flight == 3


async def test_an_expired_batch_keeps_its_finished_lines(store: SqliteStore) -> None:
    runner = FakeRunner()
    await new_batch(store, input_file(6), 6)
    dispatcher = Dispatcher(store, runner, config(max_in_flight_lines=2))
    runner.gate.clear()
    task = asyncio.create_task(dispatcher.run_once())
    await until(lambda: runner.in_flight == 2)
    dispatcher.clock = lambda: 10**10  # the completion window has passed
    runner.gate.set()
    await asyncio.wait_for(task, 2)
    done = await store.get_batch("batch_1")
    assert done is not None and done.status == "expired"
    finished = output_ids(store, done.output_file_id)
    expired = output_ids(store, done.error_file_id)
    assert finished and sorted(finished + expired) == sorted(f"c{i}" for i in range(6))


async def test_a_missing_input_file_fails_the_batch(store: SqliteStore) -> None:
    record = await new_batch(store, input_file(2), 2)
    store.files.remove(record.input_file_id)
    assert await Dispatcher(store, FakeRunner(), config()).run_once()
    done = await store.get_batch("batch_1")
    assert done is not None and done.status == "failed"
    assert done.errors and done.errors[0]["code"] == "input_file_missing"


async def test_a_store_that_fails_a_write_stops_the_turn_and_the_next_goes_on(
    store: SqliteStore,
) -> None:
    await new_batch(store, input_file(10), 10)
    dying = DyingStore(store)
    runner = FakeRunner()
    calls = 0
    original = store.record

    async def flaky(*args: object) -> bool:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise RuntimeError("disk full")
        return await original(*args)  # type: ignore[arg-type]

    dying.record = flaky  # type: ignore[method-assign]
    assert await Dispatcher(dying, runner, config()).run_once()  # type: ignore[arg-type]
    unfinished = await store.get_batch("batch_1")
    assert unfinished is not None and unfinished.status == "in_progress"
    assert await Dispatcher(store, FakeRunner(), config()).run_once()
    done = await store.get_batch("batch_1")
    assert done is not None and done.status == "completed"
    assert sorted(output_ids(store, done.output_file_id)) == sorted(f"c{i}" for i in range(10))


async def test_stop_ends_a_dispatcher_whose_first_cancel_was_swallowed(tmp_path: Path) -> None:
    service = BatchService(config(), lambda: SqliteStore(tmp_path), FakeRunner())
    cancels = 0

    async def swallows_one_cancel() -> None:
        nonlocal cancels
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancels += 1
                if cancels > 1:
                    raise

    service.dispatcher.run_forever = swallows_one_cancel  # type: ignore[method-assign]
    service.start()
    await asyncio.sleep(0)
    stopping = asyncio.create_task(service.stop())
    await asyncio.wait({stopping}, timeout=10)
    if not stopping.done():  # the defect: stop waits for a task that goes on
        stopping.cancel()
        await asyncio.gather(stopping, return_exceptions=True)
        pytest.fail("stop() still waiting 10 s after it first cancelled the dispatcher")
    assert cancels == 2
