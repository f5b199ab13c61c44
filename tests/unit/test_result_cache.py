"""The result cache's core: keys, the byte-bounded LRU, in-flight de-duplication, faults."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import pytest

from deployments.core.cache.cache_entries import (
    EmbedEntry,
    RerankEntry,
    pack_embed,
    pack_rerank,
    unpack_embed,
    unpack_rerank,
)
from deployments.core.cache.model_cache import MAX_PENDING_WRITES, ModelCache
from deployments.core.cache.result_cache import ByteLRU, MemoryStore, item_key


def test_keys_differ_by_every_part() -> None:
    base = item_key(("m", "1", "end"), b"text")
    assert base == item_key(("m", "1", "end"), b"text")
    assert base != item_key(("m", "2", "end"), b"text")  # a new version misses
    assert base != item_key(("m", "1", "start"), b"text")
    assert base != item_key(("m", "1", "end"), b"text!")
    # Length prefixes: moving a boundary between parts changes the key.
    assert item_key(("ab", "c"), b"") != item_key(("a", "bc"), b"")


def test_entries_round_trip_bitwise() -> None:
    vector = np.random.default_rng(0).standard_normal(384).astype(np.float32)
    back = unpack_embed(pack_embed(EmbedEntry(vector, 7, True)))
    assert back.vector.dtype == np.float32
    assert back.vector.tobytes() == vector.tobytes()
    assert (back.tokens, back.truncated) == (7, True)
    raw = float(np.float32(1.2345678))
    entry = RerankEntry(raw, 1 / 3, 12, 2, False)
    assert unpack_rerank(pack_rerank(entry)) == entry


def test_lru_bound_holds_under_a_flood() -> None:
    lru = ByteLRU(max_bytes=50_000)
    value = bytes(1540)  # a 384-dim float32 vector and its header
    for i in range(2_000):
        lru.put(f"{i:064x}", value)
        assert lru.used_bytes <= lru.max_bytes
    assert 0 < len(lru) < 2_000
    assert lru.evictions == 2_000 - len(lru)
    assert lru.get(f"{1999:064x}") == value  # the newest stay
    assert lru.get(f"{0:064x}") is None


def test_lru_evicts_least_recently_used() -> None:
    lru = ByteLRU(max_bytes=3 * (1 + 10 + 200))
    for key in "abc":
        lru.put(key, bytes(10))
    assert lru.get("a") is not None  # a is now the most recent
    lru.put("d", bytes(10))
    assert lru.get("b") is None
    assert lru.get("a") is not None


def test_lru_ttl_expires() -> None:
    now = [0.0]
    lru = ByteLRU(max_bytes=10_000, ttl_s=5.0, clock=lambda: now[0])
    lru.put("k", b"v")
    now[0] = 4.9
    assert lru.get("k") == b"v"
    now[0] = 5.0
    assert lru.get("k") is None
    assert lru.used_bytes == 0


class CountingCompute:
    def __init__(self, fail: bool = False, gate: asyncio.Event | None = None) -> None:
        self.calls: list[list[str]] = []
        self.fail = fail
        self.gate = gate

    async def __call__(self, keys: list[str]) -> dict[str, bytes]:
        self.calls.append(keys)
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise RuntimeError("model failed")
        return {key: key.encode() for key in keys}


async def test_hit_after_miss_and_duplicates_in_one_request() -> None:
    cache = ModelCache("m", MemoryStore(1 << 20))
    compute = CountingCompute()
    values, hits = await cache.resolve(["a", "b", "a"], compute)
    assert hits == 0
    assert compute.calls == [["a", "b"]]  # "a" twice in one request: computed once
    assert values == {"a": b"a", "b": b"b"}
    values, hits = await cache.resolve(["a", "c"], compute)
    assert hits == 1
    assert compute.calls[-1] == ["c"]
    assert cache.stats()["hits"] == 1


async def test_concurrent_identical_items_computed_once() -> None:
    cache = ModelCache("m", MemoryStore(1 << 20))
    gate = asyncio.Event()
    compute = CountingCompute(gate=gate)
    first = asyncio.create_task(cache.resolve(["x", "y"], compute))
    await asyncio.sleep(0)
    second = asyncio.create_task(cache.resolve(["y", "z"], compute))
    await asyncio.sleep(0)
    gate.set()
    (one, _), (two, _) = await asyncio.gather(first, second)
    assert sorted(map(sorted, compute.calls)) == [["x", "y"], ["z"]]
    assert one["y"] == two["y"] == b"y"
    assert cache.counts.deduplicated == 1


async def test_failure_reaches_waiters_and_is_not_cached() -> None:
    cache = ModelCache("m", MemoryStore(1 << 20))
    gate = asyncio.Event()
    failing = CountingCompute(fail=True, gate=gate)
    first = asyncio.create_task(cache.resolve(["x"], failing))
    await asyncio.sleep(0)
    second = asyncio.create_task(cache.resolve(["x"], CountingCompute()))
    await asyncio.sleep(0)
    gate.set()
    for task in (first, second):
        with pytest.raises(RuntimeError):
            await task
    healthy = CountingCompute()
    values, hits = await cache.resolve(["x"], healthy)
    assert (values, hits, healthy.calls) == ({"x": b"x"}, 0, [["x"]])
    assert cache.in_flight() == 0


async def test_a_cancelled_owner_lets_the_waiter_compute() -> None:
    cache = ModelCache("m", MemoryStore(1 << 20))
    owner = asyncio.create_task(cache.resolve(["x"], CountingCompute(gate=asyncio.Event())))
    await asyncio.sleep(0)
    compute = CountingCompute()
    waiter = asyncio.create_task(cache.resolve(["x"], compute))
    await asyncio.sleep(0)
    owner.cancel()
    values, _ = await waiter
    assert values == {"x": b"x"} and compute.calls == [["x"]]


class BrokenStore:
    writes_behind = False

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        raise ConnectionError("down")

    async def put_many(self, entries: Sequence[tuple[str, bytes]]) -> None:
        raise ConnectionError("down")

    def usage(self) -> dict[str, int]:
        return {}


async def test_a_store_fault_serves_without_the_cache() -> None:
    cache = ModelCache("m", BrokenStore())
    values, hits = await cache.resolve(["a"], CountingCompute())
    assert values == {"a": b"a"} and hits == 0
    assert cache.counts.errors == 2  # the read and the write


async def test_lanes_keep_a_class_from_waiting_behind_another() -> None:
    cache = ModelCache("m", MemoryStore(1 << 20))
    slow = CountingCompute(gate=asyncio.Event())
    batch = asyncio.create_task(cache.resolve(["x"], slow, lane="batch"))
    await asyncio.sleep(0)
    fast = CountingCompute()
    values, _ = await asyncio.wait_for(cache.resolve(["x"], fast, lane="realtime"), 1)
    assert values == {"x": b"x"} and fast.calls == [["x"]]
    assert slow.gate is not None
    slow.gate.set()
    await batch


class SlowWritingStore(MemoryStore):
    """A remote store's shape: writes take a round trip that the answer need not wait for."""

    writes_behind = True

    def __init__(self) -> None:
        super().__init__(1 << 20)
        self.write_gate = asyncio.Event()
        self.reads: list[list[str]] = []

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        self.reads.append(list(keys))
        return await super().get_many(keys)

    async def put_many(self, entries: Sequence[tuple[str, bytes]]) -> None:
        await self.write_gate.wait()
        await super().put_many(entries)


async def test_a_store_that_writes_behind_answers_before_its_write_lands() -> None:
    store = SlowWritingStore()
    cache = ModelCache("m", store)
    values, hits = await asyncio.wait_for(cache.resolve(["a", "b"], CountingCompute()), 1)
    assert values == {"a": b"a", "b": b"b"} and hits == 0
    assert len(store.lru) == 0  # the write is still held
    # Read-your-writes meanwhile: the next request hits without asking the store.
    store.reads.clear()
    again, hits = await cache.resolve(["a", "b"], CountingCompute())
    assert again == values and hits == 2 and store.reads == []
    store.write_gate.set()
    await cache.flush()
    assert len(store.lru) == 2
    assert await cache.resolve(["a"], CountingCompute()) == ({"a": b"a"}, 1)
    assert store.reads == [["a"]]  # landed: read from the store again


async def test_writes_behind_are_bounded() -> None:
    store = SlowWritingStore()
    cache = ModelCache("m", store)
    for i in range(MAX_PENDING_WRITES):
        await cache.resolve([f"k{i}"], CountingCompute())
    # One more would exceed the bound: that request waits for its own write.
    late = asyncio.create_task(cache.resolve(["last"], CountingCompute()))
    await asyncio.sleep(0.05)
    assert not late.done()
    store.write_gate.set()
    assert (await late)[0] == {"last": b"last"}
    await cache.flush()
    assert len(store.lru) == MAX_PENDING_WRITES + 1


async def test_a_write_behind_that_fails_is_counted_and_forgotten() -> None:
    class FailingWrites(SlowWritingStore):
        async def put_many(self, entries: Sequence[tuple[str, bytes]]) -> None:
            raise ConnectionError("down")

    cache = ModelCache("m", FailingWrites())
    assert (await cache.resolve(["a"], CountingCompute()))[1] == 0
    await cache.flush()
    assert cache.counts.errors == 1
    assert (await cache.resolve(["a"], CountingCompute()))[1] == 0  # not kept after the fault


class CrossWiredStore(MemoryStore):
    """Answers every lookup with the value stored under another key."""

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        others = [key for key in self.lru._entries if key not in keys]
        return [self.lru.get(others[0]) if others else None for _ in keys]


async def test_a_value_under_the_wrong_key_is_a_miss_not_a_wrong_answer() -> None:
    cache = ModelCache("m", CrossWiredStore(1 << 20))
    await cache.resolve(["aaaaaaaa-1"], CountingCompute())
    values, hits = await cache.resolve(["bbbbbbbb-2"], CountingCompute())
    assert values == {"bbbbbbbb-2": b"bbbbbbbb-2"} and hits == 0
    assert cache.counts.errors == 1
