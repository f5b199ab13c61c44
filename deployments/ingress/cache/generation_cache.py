"""The result cache's seam for generation (`cache: {generation: true}`): a greedy
completion, whole or streamed, is one entry in its model's cache, beside the embedding and
rerank items (the same stores, counts, metrics and /v1/stats row). Which requests qualify
and what keys them: core/generation_key.py; the model's name, version and settings and the
scope (global or tenant) come from `ItemCaches.namespace`, as for every item.

- Whole answers go through `ModelCache.resolve`: identical greedy requests in flight at
  once (in one priority class) are computed once, the others wait for that answer.
- A streamed request looks up; a hit is replayed as a live stream's shape (one content
  chunk, then the final chunk with the finish reason); a miss streams live and is stored
  only once its last chunk has gone out (`sse`'s `on_complete`): not when it broke, was
  cancelled or its client left. A streamed request never waits for another in flight.

A store fault is counted and the request goes on uncached (core/cache/model_cache.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from deployments.config import ModelConfig
from deployments.core.access.access import Tenant
from deployments.core.cache.cache_entries import GenerationEntry, pack_generation, unpack_generation
from deployments.core.cache.model_cache import ModelCache
from deployments.core.cache.result_cache import item_key
from deployments.core.generation_key import GENERATION_KEY_FORMAT, cacheable, job_content
from deployments.core.protocol import GenerationChunk, GenerationJob
from deployments.ingress.cache.item_cache import ItemCaches
from deployments.ingress.tasks.generation import LiveGeneration, Reply, sse, started

Completion = tuple[str, GenerationChunk]  # the whole text and the last chunk (usage, reason)


def cached_completion(
    caches: ItemCaches,
    model: ModelConfig,
    job: GenerationJob,
    tenant: Tenant | None,
    lane: str,
) -> CachedCompletion | None:
    """The request's entry, or None when it is not cached: the cache is off for
    generation or for this model, or the request samples (temperature above 0)."""
    if not cacheable(job):
        return None
    cache = caches.of_generation(model.name)
    if cache is None:
        return None
    namespace = caches.namespace(model, tenant, (GENERATION_KEY_FORMAT,))
    return CachedCompletion(cache, item_key(namespace, job_content(job)), lane)


async def stream_answer(
    cached: CachedCompletion | None,
    reply: Reply,
    include_usage: bool,
    start: Callable[[], Awaitable[LiveGeneration]],
) -> AsyncIterator[bytes]:
    """A streamed request's events: a hit replayed, else the live stream, stored when it
    finishes. `start` raises a refusal before any event, as without the cache."""
    if cached is not None:
        reply.cached_inputs = 0
        hit = await cached.lookup()
        if hit is not None:
            reply.cached_inputs = 1
            replay = Replay(hit)
            return sse(replay, replay.first, reply, include_usage, _nothing_to_settle)
    live = await start()
    store = None if cached is None else cached.store
    return await started(sse(live.call, live.first, reply, include_usage, live.settle, store))


async def whole_answer(
    cached: CachedCompletion | None,
    reply: Reply,
    compute: Callable[[], Awaitable[Completion]],
) -> dict[str, Any]:
    """A whole answer's body, from the cache or from `compute`."""
    if cached is None:
        text, last = await compute()
    else:
        (text, last), reply.cached_inputs = await cached.resolve(compute)
    return reply.whole(text, last)


class CachedCompletion:
    def __init__(self, cache: ModelCache, key: str, lane: str) -> None:
        self.cache = cache
        self.key = key
        self.lane = lane

    async def lookup(self) -> GenerationEntry | None:
        """The stored completion (a hit), or None (a miss); counted either way."""
        found, _ = await self.cache.lookup([self.key])
        value = found.get(self.key)
        return None if value is None else unpack_generation(value)

    async def resolve(self, compute: Callable[[], Awaitable[Completion]]) -> tuple[Completion, int]:
        """The completion, from the cache or from `compute` (once for every identical
        request in flight), and whether it hit (1) or not (0)."""

        async def fill(owned: list[str]) -> dict[str, bytes]:
            text, last = await compute()
            entry = _entry(text, last)
            if entry is None:
                raise _Unfinished(text, last)
            return {self.key: pack_generation(entry)}

        try:
            values, hits = await self.cache.resolve([self.key], fill, self.lane)
        except _Unfinished as unfinished:
            return (unfinished.text, unfinished.last), 0
        entry = unpack_generation(values[self.key])
        return (entry.text, _final_chunk(entry, entry.text)), hits

    async def store(self, text: str, last: GenerationChunk) -> None:
        """Keeps a streamed completion that ended normally (never raises)."""
        entry = _entry(text, last)
        if entry is not None:
            await self.cache.keep([(self.key, pack_generation(entry))])


class Replay:
    """A stored completion as a call's rest (`generation.ChunkSource`): after the content
    chunk, the final chunk; nothing to cancel."""

    def __init__(self, entry: GenerationEntry) -> None:
        self.first = GenerationChunk(entry.text, entry.prompt_tokens, entry.completion_tokens)
        self._last = _final_chunk(entry, "")

    async def rest(self) -> AsyncIterator[GenerationChunk]:
        yield self._last

    def cancel(self) -> None:
        return None


class _Unfinished(Exception):
    """A completion with no finish reason: answered, never stored. Raised through the
    in-flight table so that requests waiting for it get the same answer."""

    def __init__(self, text: str, last: GenerationChunk) -> None:
        super().__init__("a completion without a finish reason")
        self.text = text
        self.last = last


def _nothing_to_settle(last: GenerationChunk | None) -> None:
    return None  # an answer from the cache costs the tenant no tokens


def _entry(text: str, last: GenerationChunk) -> GenerationEntry | None:
    if last.finish_reason is None:
        return None
    return GenerationEntry(text, last.prompt_tokens, last.completion_tokens, last.finish_reason)


def _final_chunk(entry: GenerationEntry, text: str) -> GenerationChunk:
    return GenerationChunk(text, entry.prompt_tokens, entry.completion_tokens, entry.finish_reason)
