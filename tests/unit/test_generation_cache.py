"""The generation result cache's decisions, with fakes: which completions are cached,
what keys them (the model's version and settings included), the entry layout, and that a
completion is stored only once it has finished."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Sequence

import orjson
import pytest

from deployments.config import CacheConfig, GenerationModelConfig
from deployments.core.access.access import Tenant
from deployments.core.cache.cache_entries import GenerationEntry, pack_generation, unpack_generation
from deployments.core.cache.result_cache import MemoryStore
from deployments.core.generation_key import cacheable, is_greedy, job_content
from deployments.core.priority import Priority
from deployments.core.protocol import GenerationChunk, GenerationJob
from deployments.errors import ModelFailed
from deployments.ingress.api.dialects import OPENAI_CHAT, OPENAI_COMPLETIONS
from deployments.ingress.cache.generation_cache import CachedCompletion, Replay, cached_completion
from deployments.ingress.cache.item_cache import ItemCaches
from deployments.ingress.tasks.generation import Reply, sse

MODEL = GenerationModelConfig(name="llm", source="demo:tiny-llama")
GREEDY = GenerationJob(request_id="r1", max_tokens=8, prompt="the river", temperature=0.0)
DONE = ("hello world", GenerationChunk(" world", 3, 2, "length"))


def caches(**cache: object) -> ItemCaches:
    return ItemCaches(CacheConfig.model_validate({"enabled": True, "generation": True, **cache}))


def key_of(
    job: GenerationJob,
    model: GenerationModelConfig = MODEL,
    tenant: Tenant | None = None,
    where: ItemCaches | None = None,
) -> str:
    found = cached_completion(where or caches(), model, job, tenant, "normal")
    assert found is not None
    return found.key


@pytest.mark.parametrize(
    ("temperature", "greedy"),
    [(0.0, True), (1e-39, True), (9e-7, True), (float("nan"), True), (1e-6, False), (0.7, False)],
)
def test_greedy_is_the_engines_definition(temperature: float, greedy: bool) -> None:
    from deployments.backends.generation.sampling import SamplingParams

    assert is_greedy(temperature) is greedy
    assert SamplingParams(temperature).greedy is greedy  # one definition for both
    assert cacheable(dataclasses.replace(GREEDY, temperature=temperature)) is greedy


def test_only_fields_that_can_change_a_greedy_result_are_in_the_key() -> None:
    base = job_content(GREEDY)
    # The request id, and what only sampling reads, do not change a greedy answer.
    same = dataclasses.replace(GREEDY, request_id="r2", seed=7, top_p=0.1, temperature=1e-9)
    assert job_content(same) == base
    for changed in (
        dataclasses.replace(GREEDY, prompt="the river "),
        dataclasses.replace(GREEDY, max_tokens=9),
        dataclasses.replace(GREEDY, stop=["."]),
        dataclasses.replace(
            GREEDY, prompt=None, messages=[{"role": "user", "content": "the river"}]
        ),
    ):
        assert job_content(changed) != base
    one = dataclasses.replace(GREEDY, stop=[".", "!"])
    assert job_content(one) != job_content(dataclasses.replace(GREEDY, stop=["!", "."]))
    chat = dataclasses.replace(GREEDY, prompt=None, messages=[{"role": "user", "content": "a"}])
    system = dataclasses.replace(chat, messages=[{"role": "system", "content": "a"}])
    assert job_content(chat) != job_content(system)
    # A lone surrogate is valid JSON text; it must key, not raise.
    assert job_content(dataclasses.replace(GREEDY, prompt="\ud800"))


def test_what_is_not_cached() -> None:
    sampled = dataclasses.replace(GREEDY, temperature=0.7, seed=1)
    assert cached_completion(caches(), MODEL, sampled, None, "normal") is None
    assert cached_completion(caches(models=["other"]), MODEL, GREEDY, None, "normal") is None
    off = ItemCaches(CacheConfig(enabled=True))  # embeddings and rerank only
    assert cached_completion(off, MODEL, GREEDY, None, "normal") is None
    assert cached_completion(caches(models=["llm"]), MODEL, GREEDY, None, "normal") is not None


def test_generation_needs_the_cache_enabled() -> None:
    with pytest.raises(ValueError, match="generation: true needs enabled: true"):
        CacheConfig.model_validate({"generation": True})


def test_the_key_has_the_model_version_settings_and_scope() -> None:
    base = key_of(GREEDY)
    assert key_of(dataclasses.replace(GREEDY, request_id="other")) == base
    assert key_of(GREEDY, MODEL.model_copy(update={"version": "2"})) != base  # a new version
    assert key_of(GREEDY, MODEL.model_copy(update={"name": "llm2"})) != base
    for changed in ({"source": "/models/other"}, {"engine": "static"}, {"dtype": "bfloat16"}):
        assert key_of(GREEDY, MODEL.model_copy(update=changed)) != base
    # How much a replica holds does not change an answer.
    for same in ({"kv_cache_tokens": 4096}, {"max_num_seqs": 4}, {"default_max_tokens": 64}):
        assert key_of(GREEDY, MODEL.model_copy(update=same)) == base
    a = Tenant("a", Priority.NORMAL, None)
    b = Tenant("b", Priority.NORMAL, None)
    assert key_of(GREEDY, tenant=a) == key_of(GREEDY, tenant=b) == base  # global scope
    tenants = caches(scope="tenant")
    assert key_of(GREEDY, tenant=a, where=tenants) != key_of(GREEDY, tenant=b, where=tenants)


def test_entries_round_trip() -> None:
    entry = GenerationEntry("héllo \U0001f30a \ud800", 12, 34, "stop")
    assert unpack_generation(pack_generation(entry)) == entry
    empty = GenerationEntry("", 1, 0, "length")
    assert unpack_generation(pack_generation(empty)) == empty


def completion() -> CachedCompletion:
    cache = caches().of_generation("llm")
    assert cache is not None
    return CachedCompletion(cache, "k", "normal")


async def test_a_miss_computes_and_the_next_request_hits() -> None:
    entry = completion()
    calls = 0

    async def compute() -> tuple[str, GenerationChunk]:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.01)
        return DONE

    first, second = await asyncio.gather(entry.resolve(compute), entry.resolve(compute))
    assert calls == 1  # identical requests in flight: computed once
    assert first[0] == second[0] == ("hello world", GenerationChunk("hello world", 3, 2, "length"))
    (text, last), hits = await entry.resolve(compute)
    assert (calls, hits, text, last.finish_reason) == (1, 1, "hello world", "length")
    assert entry.cache.stats()["hits"] == 1 and entry.cache.stats()["deduplicated"] == 1


async def test_an_unfinished_or_failed_completion_is_not_stored() -> None:
    entry = completion()

    async def unfinished() -> tuple[str, GenerationChunk]:
        return "cut", GenerationChunk("cut", 3, 1, None)

    (text, _), hits = await entry.resolve(unfinished)
    assert (text, hits) == ("cut", 0)
    await entry.store("cut", GenerationChunk("cut", 3, 1, None))

    async def fails() -> tuple[str, GenerationChunk]:
        raise ModelFailed()

    with pytest.raises(ModelFailed):
        await entry.resolve(fails)
    assert await entry.lookup() is None
    assert entry.cache.stats()["entries"] == 0


class BrokenStore(MemoryStore):
    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        raise ConnectionError("redis is down")

    async def put_many(self, entries: Sequence[tuple[str, bytes]]) -> None:
        raise ConnectionError("redis is down")


async def test_a_store_fault_never_fails_the_request() -> None:
    broken = ItemCaches(
        CacheConfig(enabled=True, generation=True), store_for=lambda _: BrokenStore(4096)
    )
    entry = cached_completion(broken, MODEL, GREEDY, None, "normal")
    assert entry is not None

    async def compute() -> tuple[str, GenerationChunk]:
        return DONE

    assert (await entry.resolve(compute))[0][0] == "hello world"
    assert await entry.lookup() is None
    await entry.store(*DONE)
    assert entry.cache.stats()["errors"] == 4  # read and write, a read, a write


class Chunks:
    """A call's rest: chunks, then maybe a failure."""

    def __init__(self, chunks: list[GenerationChunk], fail: Exception | None = None) -> None:
        self._chunks = chunks
        self._fail = fail

    async def rest(self) -> AsyncIterator[GenerationChunk]:
        for chunk in self._chunks:
            yield chunk
        if self._fail is not None:
            raise self._fail

    def cancel(self) -> None:
        return None


FIRST = GenerationChunk("hello", 3, 1)
LAST = GenerationChunk(" world", 3, 2, "length")


async def streamed(rest: Chunks, leave_after: int | None = None) -> list[tuple[str, str]]:
    stored: list[tuple[str, str]] = []

    async def store(text: str, last: GenerationChunk) -> None:
        stored.append((text, str(last.finish_reason)))

    events = sse(rest, FIRST, Reply(OPENAI_COMPLETIONS, "llm"), True, lambda _: None, store)
    sent = 0
    async for _ in events:
        sent += 1
        if sent == leave_after:
            await events.aclose()  # the client went away
            break
    return stored


async def test_a_stream_is_stored_only_when_it_finished() -> None:
    assert await streamed(Chunks([LAST])) == [("hello world", "length")]
    assert await streamed(Chunks([], fail=ModelFailed())) == []  # broke mid-stream
    assert await streamed(Chunks([LAST]), leave_after=1) == []  # client left first
    assert await streamed(Chunks([GenerationChunk(" wor", 3, 2)])) == []  # no finish reason


async def test_a_replay_has_a_live_streams_shape() -> None:
    reply = Reply(OPENAI_CHAT, "llm")
    reply.cached_inputs = 1
    replay = Replay(GenerationEntry("hello world", 3, 2, "length"))
    events = [e async for e in sse(replay, replay.first, reply, True, lambda _: None)]
    bodies = [orjson.loads(e.removeprefix(b"data: ")) for e in events[:-1]]
    assert events[-1] == b"data: [DONE]\n\n"
    assert bodies[0]["choices"][0]["delta"] == {"role": "assistant", "content": "hello world"}
    assert bodies[0]["choices"][0]["finish_reason"] is None
    assert bodies[1]["choices"][0]["delta"] == {"content": ""}
    assert bodies[1]["choices"][0]["finish_reason"] == "length"
    assert bodies[2]["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "total_tokens": 5,
        "cached_inputs": 1,
    }
