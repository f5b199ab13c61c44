"""The dispatcher's scenarios (tests/unit/test_batch_dispatcher.py) on the shared store:
a real redis-server on a free port and a file directory, as a cluster would run them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.exceptions import TimeoutError as RedisTimeoutError

from deployments.core.batch_jobs.records import BatchRecord
from deployments.ingress.batches import redis_store
from deployments.ingress.batches.redis_store import RedisBatchStore
from tests.parts.test_result_cache_redis import RedisProcess, redis_server
from tests.unit.batch_support import new_batch
from tests.unit.test_batch_dispatcher import (
    test_a_batch_runs_every_line_once_and_writes_its_files,
    test_a_crashed_dispatcher_is_resumed_without_running_a_line_twice,
    test_a_dispatcher_that_lost_its_lease_stops,
    test_a_missing_input_file_fails_the_batch,
    test_an_expired_batch_keeps_its_finished_lines,
    test_refusals_shrink_the_window_and_lines_are_sent_again,
)

__all__ = [
    "redis_server",
    "test_a_batch_runs_every_line_once_and_writes_its_files",
    "test_a_crashed_dispatcher_is_resumed_without_running_a_line_twice",
    "test_a_dispatcher_that_lost_its_lease_stops",
    "test_a_missing_input_file_fails_the_batch",
    "test_an_expired_batch_keeps_its_finished_lines",
    "test_refusals_shrink_the_window_and_lines_are_sent_again",
]


@pytest.fixture
async def store(redis_server: RedisProcess, tmp_path: Path) -> AsyncIterator[RedisBatchStore]:
    store = RedisBatchStore(redis_server.url, tmp_path / "shared")
    yield store
    await store.close()


async def test_listing_pages_and_open_counts(store: RedisBatchStore) -> None:
    for i in range(3):
        await new_batch(store, b"", 1, batch_id=f"batch_{i}")
    assert await store.open_batches("t") == 3
    first = await store.list_batches("t", None, 2)
    assert [b.id for b in first] == ["batch_2", "batch_1"]
    assert [b.id for b in await store.list_batches("t", "batch_1", 5)] == ["batch_0"]
    record = first[0]
    record.move_to("cancelled", 0)
    assert not await store.save(record, {"in_progress"})  # its status is validating
    assert await store.save(record, {"validating"})
    assert await store.open_batches("t") == 2
    assert isinstance(await store.get_batch("batch_2"), BatchRecord)


async def test_a_line_is_kept_once(store: RedisBatchStore) -> None:
    await new_batch(store, b"", 2)
    assert await store.record("batch_1", 0, True, b'{"a": 1}')
    assert not await store.record("batch_1", 0, False, b'{"a": 2}')
    assert [x async for x in store.results("batch_1")] == [(0, True, b'{"a": 1}')]
    done = await store.get_batch("batch_1")
    assert done is not None and (done.completed, done.failed) == (1, 0)


async def test_a_silent_server_fails_the_call_instead_of_hanging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listener that accepts and never answers, as a taken port would be."""
    monkeypatch.setattr(redis_store, "SOCKET_TIMEOUT_S", 0.2)
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    store = RedisBatchStore(f"redis://127.0.0.1:{port}/0", tmp_path / "shared")
    try:
        with pytest.raises(RedisTimeoutError):
            await asyncio.wait_for(store.open_batches("t"), 5)
    finally:
        await store.close()
        server.close()
