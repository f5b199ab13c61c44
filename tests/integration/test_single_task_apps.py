"""An app of one task alone: a reranker only, or a generator only, answers over HTTP."""

from __future__ import annotations

import copy

import httpx

from deployments.http.server import HttpIngress
from tests.integration.test_generation_route import MODEL, FakeGenerator
from tests.integration.test_rerank_route import DOCS, QUERY, RERANK, FakeReranker, rerank_config


async def ready() -> str | None:
    return None


def client_of(ingress: HttpIngress) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=ingress.__serve_build_asgi_app__())
    return httpx.AsyncClient(transport=transport, base_url="http://ingress")


async def test_a_rerank_only_app() -> None:
    config = rerank_config()
    config.pop("embedding_models")
    ingress = HttpIngress(config, rerankers={RERANK: FakeReranker()}, readiness=ready)
    async with client_of(ingress) as client:
        models = (await client.get("/v1/models")).json()["data"]
        ranked = await client.post(
            "/v1/rerank", json={"model": RERANK, "query": QUERY, "documents": DOCS}
        )
        embedded = await client.post("/v1/embeddings", json={"model": RERANK, "input": "hi"})
        health = await client.get("/healthz")
    assert [(m["id"], m["task"]) for m in models] == [(RERANK, "rerank")]
    assert ranked.status_code == 200
    assert ranked.json()["results"][0]["index"] == 1
    assert embedded.status_code == 404
    assert health.status_code == 200


async def test_a_generation_only_app() -> None:
    config = copy.deepcopy(rerank_config())
    config.pop("embedding_models")
    config.pop("rerank_models")
    config["generation_models"] = [{"name": MODEL, "source": "demo:tiny-llama"}]
    fake = FakeGenerator()
    ingress = HttpIngress(config, generators={MODEL: fake}, readiness=ready)
    async with client_of(ingress) as client:
        models = (await client.get("/v1/models")).json()["data"]
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        answer = await client.post("/v1/chat/completions", json=body)
    assert [(m["id"], m["task"]) for m in models] == [(MODEL, "generation")]
    assert answer.status_code == 200
    assert answer.json()["choices"][0]["message"]["content"] == "hello world"
