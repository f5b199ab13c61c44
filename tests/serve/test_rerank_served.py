"""The rerankers in the real application: MiniLM through the bi-encoder (meaningful
ranking) and the session's tiny cross-encoder (the checkpoint-loading path)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import pytest

from deployments.backends.encoders.cross_encoder import CrossEncoderScorer
from deployments.core.relevance import to_relevance
from tests.serve.conftest import AUTH, CROSS_MODEL, RERANK_MODEL, Server

QUERY = "What is the capital of France?"
ANSWER = "Paris is the capital and largest city of France."
# About 5,000 words about something else: chunked, and must not outrank the answer.
LONG_IRRELEVANT = " ".join(
    ["Bananas grow in tropical plantations and are shipped green to keep them fresh."] * 400
)
DOCUMENTS = [
    "Berlin is the capital of Germany.",
    "The Eiffel Tower was finished in 1889.",
    LONG_IRRELEVANT,
    ANSWER,
    "France is famous for its cheese and wine.",
    "Madrid is the capital of Spain.",
]
ANSWER_INDEX = DOCUMENTS.index(ANSWER)


def post(server: Server, route: str, payload: dict) -> httpx.Response:
    response = httpx.post(f"{server.url}{route}", json=payload, headers=AUTH, timeout=120)
    assert response.status_code == 200, response.text
    return response


@pytest.mark.parametrize("route", ["/v1/rerank", "/v2/rerank"])
def test_cohere_and_jina_rank_the_answer_first(server: Server, route: str) -> None:
    body = post(
        server, route, {"model": RERANK_MODEL, "query": QUERY, "documents": DOCUMENTS}
    ).json()
    results = body["results"]
    assert results[0]["index"] == ANSWER_INDEX
    assert sorted(r["index"] for r in results) == list(range(len(DOCUMENTS)))
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
    # The long document was scored chunk by chunk, every chunk counted.
    assert body["usage"]["total_tokens"] > 4000


def test_a_rerank_answer_says_where_its_time_went(server: Server) -> None:
    response = post(
        server, "/v1/rerank", {"model": RERANK_MODEL, "query": QUERY, "documents": DOCUMENTS[:2]}
    )
    names = [part.split(";")[0].strip() for part in response.headers["server-timing"].split(",")]
    assert names == ["total", "tokenization", "queue", "inference"]
    assert int(response.headers["x-inference-time"]) >= 0
    assert int(response.headers["x-total-time"]) >= int(response.headers["x-inference-time"])


def test_tei_ranks_the_answer_first(server: Server) -> None:
    ranks = post(
        server, "/rerank", {"query": QUERY, "texts": DOCUMENTS, "return_text": True}
    ).json()
    assert ranks[0]["index"] == ANSWER_INDEX and ranks[0]["text"] == ANSWER
    raw = post(server, "/rerank", {"query": QUERY, "texts": DOCUMENTS, "raw_scores": True}).json()
    # Raw is the cosine; the default is its documented mapping (cos + 1) / 2.
    by_index = {r["index"]: r["score"] for r in raw}
    assert np.isclose(ranks[0]["score"], (by_index[ANSWER_INDEX] + 1) / 2, atol=1e-5)


def test_top_n_and_return_documents(server: Server) -> None:
    payload = {
        "model": RERANK_MODEL,
        "query": QUERY,
        "documents": [{"text": d} for d in DOCUMENTS],
        "top_n": 2,
        "return_documents": True,
    }
    results = post(server, "/v2/rerank", payload).json()["results"]
    assert len(results) == 2 and results[0]["document"] == {"text": ANSWER}
    payload["return_documents"] = False
    assert all("document" not in r for r in post(server, "/v2/rerank", payload).json()["results"])


def test_concurrent_clients_get_the_scores_of_one_at_a_time(server: Server) -> None:
    queries = [QUERY, "Which city is the capital of Germany?", "Tell me about fruit."]
    docs = DOCUMENTS[:2] + DOCUMENTS[3:]

    def payload(query: str) -> dict:
        return {"model": RERANK_MODEL, "query": query, "documents": docs, "raw_scores": True}

    def scores(body: dict) -> dict[int, float]:
        return {r["index"]: r["relevance_score"] for r in body["results"]}

    alone = [scores(post(server, "/v1/rerank", payload(q)).json()) for q in queries]

    async def together() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=24)
        async with httpx.AsyncClient(limits=limits, timeout=120, headers=AUTH) as client:
            return await asyncio.gather(
                *(
                    client.post(f"{server.url}/v1/rerank", json=payload(queries[i % 3]))
                    for i in range(24)
                )
            )

    for i, response in enumerate(asyncio.run(together())):
        assert response.status_code == 200, response.text
        got, expected = scores(response.json()), alone[i % 3]
        assert got.keys() == expected.keys()
        assert all(abs(got[k] - expected[k]) < 1e-4 for k in got)
    # The test server runs this reranker's passes two side by side (tests/serve/conftest.py):
    # the same scores as one at a time.
    replica = httpx.get(f"{server.url}/v1/stats", timeout=30).json()["models"][RERANK_MODEL]
    replica = replica["replica"]
    assert replica["passes_in_flight"] == 2 and replica["gate"]["capacity"] == 2
    assert replica["runtime"]["passes_in_flight"] == 2
    assert replica["gate"]["running"] == 0


def test_cross_encoder_is_served_from_its_saved_checkpoint(
    server: Server, cross_encoder_dir: Path
) -> None:
    docs = ["short one", ANSWER, " ".join(["long text"] * 300)]
    body = post(
        server,
        "/v1/rerank",
        {"model": CROSS_MODEL, "query": QUERY, "documents": docs, "raw_scores": True},
    ).json()
    served = {r["index"]: r["relevance_score"] for r in body["results"]}
    # The same checkpoint loaded here scores the short documents alike (one chunk each).
    local = CrossEncoderScorer(cross_encoder_dir)
    query, *tokens = local.tokenize([QUERY, *docs[:2]])
    expected = local.score([(query, d) for d in tokens])
    assert np.allclose([served[0], served[1]], expected, atol=1e-4)
    mapped = post(
        server, "/v2/rerank", {"model": CROSS_MODEL, "query": QUERY, "documents": docs}
    ).json()["results"]
    relevance = {r["index"]: r["relevance_score"] for r in mapped}
    assert np.isclose(relevance[1], to_relevance(np.array(served[1]), "logit"), atol=1e-5)


def test_chunk_passes_over_the_limit_are_413_before_any_scoring(server: Server) -> None:
    # 8 x LONG_IRRELEVANT: ~36 windows of MiniLM each, over the default app's 256.
    response = httpx.post(
        f"{server.url}/v2/rerank",
        json={"model": RERANK_MODEL, "query": QUERY, "documents": [LONG_IRRELEVANT] * 8},
        headers=AUTH,
        timeout=30,
    )
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["param"] == "documents" and "max_chunk_passes" in error["message"]
    # Truncated to each document's first window, the same request is 8 passes.
    truncated = httpx.post(
        f"{server.url}/rerank",
        json={"query": QUERY, "texts": [LONG_IRRELEVANT] * 8, "truncate": True},
        headers=AUTH,
        timeout=60,
    )
    assert truncated.status_code == 200, truncated.text
