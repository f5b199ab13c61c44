"""The result cache's seam in the ingress: per item lookup before a job is queued, a job of
only the misses (none at all when everything hit: no queue slot, no Ray hop), the outcome
merged back in the caller's order, the new results stored.

`Ingress.embed` and `Ingress.rerank` wrap their one `self._run(...)` call in `cached_run`;
everything else about the request (parsing, admission of the misses, the response shape
after the cache: `dimensions`, encodings, sorting) is untouched, so one entry serves every
shape of answer.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from deployments.config import (
    CacheConfig,
    ModelConfig,
    RerankModelConfig,
)
from deployments.config.output_neutral import output_neutral_fields
from deployments.core.access.access import Tenant
from deployments.core.cache.cache_entries import (
    ENTRY_FORMAT,
    EmbedEntry,
    RerankEntry,
    pack_embed,
    pack_rerank,
    unpack_embed,
    unpack_rerank,
)
from deployments.core.cache.model_cache import ModelCache
from deployments.core.cache.result_cache import CacheStore, KeyPart, MemoryStore, item_key
from deployments.core.metrics.metrics import TributaryMetrics
from deployments.core.protocol import (
    BatchedResult,
    EmbedJob,
    EmbedResult,
    JobTiming,
    RerankJob,
    RerankResult,
)
from deployments.errors import TributaryError
from deployments.ingress.cache.redis_store import RedisStore
from deployments.ingress.calls.observe import note_request
from deployments.ingress.tasks.rerank import estimated_chunk_passes

Job = TypeVar("Job", EmbedJob, RerankJob)
# Refusals of bad input, whose messages may name an input by its index.
NAMES_AN_INPUT = frozenset({400, 413})


class ItemCaches:
    """Per cached model, its `ModelCache`; built once per ingress replica from `cache:`."""

    def __init__(
        self,
        config: CacheConfig,
        metrics: TributaryMetrics | None = None,
        store_for: Callable[[CacheConfig], CacheStore] | None = None,
    ) -> None:
        self.config = config
        self._chosen = set(config.models) if config.models is not None else None
        self._make = store_for or build_store
        self._metrics = metrics
        self._caches: dict[str, ModelCache] = {}
        self._settings: dict[int, tuple[ModelConfig, str]] = {}

    def of(self, model: str) -> ModelCache | None:
        """The model's cache, made on its first request: a model may come with a version
        served by an application of its own, after this replica started."""
        cache = self._caches.get(model)
        if cache is None and self.config.enabled:
            if self._chosen is not None and model not in self._chosen:
                return None
            metrics = self._metrics
            observer = None if metrics is None else _MetricsObserver(metrics, model)
            cache = self._caches[model] = ModelCache(model, self._make(self.config), observer)
        return cache

    def of_generation(self, model: str) -> ModelCache | None:
        """A generation model's cache: only with `generation: true` (greedy requests)."""
        return self.of(model) if self.config.generation else None

    def stats(self) -> dict[str, Any]:
        return {name: cache.stats() for name, cache in self._caches.items()}

    def namespace(
        self, model: ModelConfig, tenant: Tenant | None, params: Sequence[KeyPart]
    ) -> tuple[KeyPart, ...]:
        scope = tenant.name if self.config.scope == "tenant" and tenant is not None else ""
        fingerprint = self._fingerprint(model)
        return (ENTRY_FORMAT, model.name, model.version, fingerprint, scope, *params)

    def _fingerprint(self, model: ModelConfig) -> str:
        # By identity: a config object is immutable; the stored reference keeps its id unique.
        known = self._settings.get(id(model))
        if known is None or known[0] is not model:
            if len(self._settings) >= 256:  # configs made per request must not pile up
                self._settings.clear()
            # Every setting but those marked output-neutral (config/output_neutral.py), so
            # a field added later misses rather than serves a stale result.
            dumped = model.model_dump_json(exclude=output_neutral_fields(model))
            known = (model, hashlib.sha256(dumped.encode()).hexdigest())
            self._settings[id(model)] = known
        return known[1]


def build_store(config: CacheConfig) -> CacheStore:
    if config.backend == "redis":
        assert config.url is not None  # the config's validator insists
        return RedisStore(config.url, config.ttl_s, config.timeout_s)
    return MemoryStore(config.max_bytes, config.ttl_s)


class _MetricsObserver:
    """One model's cache events onto the metrics (core's `CacheObserver`)."""

    def __init__(self, metrics: TributaryMetrics, model: str) -> None:
        self._metrics = metrics
        self._model = model

    def lookups(self, hits: int, misses: int) -> None:
        self._metrics.cache_lookups(self._model, hits, misses)

    def stored(self, used_bytes: int, new_evictions: int) -> None:
        self._metrics.cache_store(self._model, used_bytes, new_evictions)

    def fault(self, operation: str) -> None:
        self._metrics.cache_error(self._model, operation)


async def cached_run(
    caches: ItemCaches,
    model: ModelConfig,
    job: Job,
    tenant: Tenant | None,
    priority: str,
    run: Callable[[Job], Awaitable[BatchedResult]],
) -> tuple[BatchedResult, int | None]:
    """`run(job)`'s outcome, computed for the cache's misses only; and how many inputs hit
    (None when this model has no cache). `run` raises for a refused job; the failure
    reaches every request waiting on its items and nothing of it is stored."""
    cache = caches.of(model.name)
    if cache is None:
        return await run(job), None
    outcome: EmbedResult | RerankResult
    hits: int | None
    try:
        if isinstance(job, EmbedJob):
            outcome, hits = await _embed(cache, caches, model, job, tenant, priority, run)
        else:
            assert isinstance(model, RerankModelConfig)
            outcome, hits = await _rerank(cache, caches, model, job, tenant, priority, run)
    except TributaryError as exc:
        if exc.status not in NAMES_AN_INPUT:
            raise
        # The model refused a job of misses only, so its message counts inputs of that job
        # ("Input 0 has ..."). Sent whole, uncached, the refusal names the caller's own.
        outcome, hits = await run(job), None
    # `run` labelled the request with its misses only, or not at all when all hit.
    note_request(priority=priority, items=len(job))
    return outcome, hits


async def _embed(
    cache: ModelCache,
    caches: ItemCaches,
    model: ModelConfig,
    job: EmbedJob,
    tenant: Tenant | None,
    lane: str,
    run: Callable[[Any], Awaitable[Any]],
) -> tuple[EmbedResult, int]:
    kind = "text" if job.texts is not None else "ids"
    inputs: list[Any] = list(job.texts if job.texts is not None else job.token_ids or [])
    params = (
        "embed",
        kind,
        job.truncate,
        repr(job.prompt_names),
        job.prompt_optional,
        job.normalize,
    )
    namespace = caches.namespace(model, tenant, params)
    keys = [item_key(namespace, _content(item)) for item in inputs]
    first = _first_positions(keys)

    computed: list[JobTiming | None] = []  # the timing of the misses' job, if it ran here

    async def compute(owned: list[str]) -> dict[str, bytes]:
        chosen = [inputs[first[key]] for key in owned]
        if job.texts is not None:
            sub = dataclasses.replace(job, texts=chosen)
        else:
            sub = dataclasses.replace(job, token_ids=chosen)
        result: EmbedResult = await run(sub)
        computed.append(result.timing)
        cut = set(result.truncated)
        return {
            key: pack_embed(EmbedEntry(result.vectors[i], result.token_counts[i], i in cut))
            for i, key in enumerate(owned)
        }

    values, hits = await cache.resolve(keys, compute, lane)
    entries = [unpack_embed(values[key]) for key in keys]
    merged = EmbedResult(
        vectors=np.stack([entry.vector for entry in entries]),
        token_counts=[entry.tokens for entry in entries],
        truncated=[i for i, entry in enumerate(entries) if entry.truncated],
        timing=computed[0] if computed else None,
    )
    return merged, hits


async def _rerank(
    cache: ModelCache,
    caches: ItemCaches,
    model: RerankModelConfig,
    job: RerankJob,
    tenant: Tenant | None,
    lane: str,
    run: Callable[[Any], Awaitable[Any]],
) -> tuple[RerankResult, int]:
    params = ("rerank", job.max_tokens_per_doc, job.first_chunk_only)
    namespace = (*caches.namespace(model, tenant, params), job.query)
    keys = [item_key(namespace, doc.encode()) for doc in job.documents]
    first = _first_positions(keys)

    computed: list[JobTiming | None] = []  # the timing of the misses' job, if it ran here

    async def compute(owned: list[str]) -> dict[str, bytes]:
        docs = [job.documents[first[key]] for key in owned]
        sub = dataclasses.replace(job, documents=docs)
        # Admission counts chunk passes: only the misses' are still to score.
        sub = dataclasses.replace(sub, chunk_passes=estimated_chunk_passes(sub, model))
        result: RerankResult = await run(sub)
        computed.append(result.timing)
        cut = set(result.truncated)
        return {
            key: pack_rerank(
                RerankEntry(
                    float(result.raw[i]),
                    float(result.relevance[i]),
                    result.token_counts[i],
                    result.chunks[i],
                    i in cut,
                )
            )
            for i, key in enumerate(owned)
        }

    values, hits = await cache.resolve(keys, compute, lane)
    entries = [unpack_rerank(values[key]) for key in keys]
    merged = RerankResult(
        # The replica's own dtypes: float32 raw scores, float64 relevance.
        raw=np.array([entry.raw for entry in entries], dtype=np.float32),
        relevance=np.array([entry.relevance for entry in entries], dtype=np.float64),
        token_counts=[entry.tokens for entry in entries],
        chunks=[entry.chunks for entry in entries],
        truncated=[i for i, entry in enumerate(entries) if entry.truncated],
        timing=computed[0] if computed else None,
    )
    return merged, hits


def _content(item: str | list[int]) -> bytes:
    if isinstance(item, str):
        return item.encode()
    return np.asarray(item, dtype=np.int64).tobytes()


def _first_positions(keys: list[str]) -> dict[str, int]:
    first: dict[str, int] = {}
    for i, key in enumerate(keys):
        first.setdefault(key, i)
    return first


def with_cached_inputs(body: Any, hits: int | None) -> Any:
    """Says in the response's usage how many inputs were answered from the cache: `usage`
    (OpenAI, Jina/Cohere rerank) or Cohere embed's `meta`. TEI's bare arrays have no room."""
    if hits is None or not isinstance(body, dict):
        return body
    for field in ("usage", "meta"):
        section = body.get(field)
        if isinstance(section, dict):
            section["cached_inputs"] = hits
            break
    return body
