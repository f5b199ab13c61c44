"""The hot routes' front (http/hot_routes.py) answers byte for byte what the FastAPI app
behind it answers: status, headers in order and body, for every dialect, encoding and
error, on the same ingress with the same fake models."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI, Request
from starlette.responses import Response

from deployments.core.access.keys import digest
from deployments.http.hot_routes import HOT_PATHS, HotRouteFront
from deployments.http.server import answer_exception
from tests.integration.full_app import EMBEDDER, FullApp
from tests.integration.test_rerank_route import RERANK

KEY = "trib-hot-route-key-for-tests"
TENANTS = [{"name": "t", "tier": "realtime", "key_sha256": [digest(KEY)]}]
AUTH = {"Authorization": f"Bearer {KEY}"}
# Cohere's and the rerank answers carry a fresh random id each; the rest must match.
RANDOM_ID = re.compile(rb'"id":"[0-9a-f]{32}"')
DOCS = ["Paris is the capital of France.", "Berlin is in Germany.", "A cat."]

# (path, body: JSON-able, or bytes sent as they are, extra headers)
CASES: list[tuple[str, Any, dict[str, str]]] = [
    # Each embedding dialect and encoding.
    ("/v1/embeddings", {"model": EMBEDDER, "input": "one text"}, {}),
    ("/v1/embeddings", {"model": EMBEDDER, "input": ["a b", "c d e"]}, {}),
    ("/v1/embeddings", {"model": EMBEDDER, "input": ["a"], "encoding_format": "base64"}, {}),
    ("/v1/embeddings", {"model": EMBEDDER, "input": "a LONG text", "dimensions": 4}, {}),
    ("/v1/embeddings", {"model": EMBEDDER, "input": [[1, 2, 3]]}, {}),
    ("/v1/embed", {"model": EMBEDDER, "texts": ["a", "b"], "input_type": "search_query"}, {}),
    (
        "/v2/embed",
        {
            "model": EMBEDDER,
            "texts": ["a"],
            "input_type": "classification",
            "embedding_types": ["float", "int8", "ubinary", "base64"],
        },
        {},
    ),
    ("/embed", {"inputs": "one"}, {}),
    ("/embed", {"inputs": ["one", "two"], "normalize": False}, {}),
    ("/", {"inputs": "root route"}, {}),
    # Each rerank dialect.
    ("/v1/rerank", {"model": RERANK, "query": "capital", "documents": DOCS}, {}),
    (
        "/v2/rerank",
        {"model": RERANK, "query": "q", "documents": [{"text": d} for d in DOCS], "top_n": 1},
        {},
    ),
    ("/rerank", {"query": "q", "texts": DOCS, "return_text": True, "raw_scores": True}, {}),
    # Headers that change the answer.
    ("/v1/embeddings", {"model": EMBEDDER, "input": "x"}, {"X-Priority": "batch"}),
    ("/v1/rerank", {"model": RERANK, "query": "q", "documents": DOCS}, {"X-Priority": "normal"}),
    # Errors: the body, the headers, the model, the key.
    ("/v1/embeddings", b"{not json", {}),
    ("/v1/embeddings", b"", {}),
    ("/v1/embeddings", {"model": EMBEDDER}, {}),
    ("/v1/embeddings", {"model": EMBEDDER, "input": 7}, {}),
    ("/v1/embeddings", {"model": "nope", "input": "x"}, {}),
    ("/v1/embeddings", {"model": EMBEDDER, "input": ["x"] * 11}, {}),
    ("/v1/embeddings", {"model": EMBEDDER, "input": "x" * 5000}, {}),
    ("/v1/embeddings", {"model": EMBEDDER, "input": "x"}, {"X-Priority": "urgent"}),
    ("/v1/embeddings", {"model": EMBEDDER, "input": "x"}, {"X-Request-Timeout": "soon"}),
    ("/v1/embeddings", {"model": EMBEDDER, "input": "x", "encoding_format": "hex"}, {}),
    ("/v1/embed", {"model": EMBEDDER, "texts": "not a list"}, {}),
    ("/v2/embed", {"model": EMBEDDER, "texts": ["a"]}, {}),
    ("/embed", {"inputs": []}, {}),
    ("/v1/rerank", {"model": RERANK, "query": "q", "documents": ["d"] * 6}, {}),
    ("/v2/rerank", {"model": RERANK, "documents": DOCS}, {}),
    ("/rerank", {"query": "q", "texts": "not a list"}, {}),
    ("/v1/rerank", {"model": "nope", "query": "q", "documents": DOCS}, {}),
]


def _requests() -> list[tuple[str, bytes, dict[str, str]]]:
    sent = []
    for i, (path, body, headers) in enumerate(CASES):
        raw = body if isinstance(body, bytes) else orjson.dumps(body)
        sent.append((path, raw, {**AUTH, "X-Request-ID": f"case-{i}", **headers}))
    return sent


async def _answers(
    app: Any, requests: list[tuple[str, bytes, dict[str, str]]]
) -> list[tuple[int, list[tuple[bytes, bytes]], bytes]]:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    answers = []
    async with httpx.AsyncClient(transport=transport, base_url="http://ingress") as client:
        for path, body, headers in requests:
            response = await client.post(path, content=body, headers=headers)
            body = RANDOM_ID.sub(b'"id":"<random>"', response.content)
            answers.append((response.status_code, _timings_masked(response.headers.raw), body))
    return answers


# Measured per answer (ingress/api/timing_headers.py): the names must match, not the values.
TIMING_HEADERS = {
    b"x-total-time",
    b"x-tokenization-time",
    b"x-queue-time",
    b"x-inference-time",
    b"server-timing",
}


def _timings_masked(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(k, b"<measured>" if k.lower() in TIMING_HEADERS else v) for k, v in headers]


def without_shares(
    answers: list[tuple[int, list[tuple[bytes, bytes]], bytes]],
) -> list[tuple[int, list[tuple[bytes, bytes]], bytes]]:
    """The answers less the share HAProxy should refuse, which the front adds to FastAPI's
    answer (http/front_shedding.py) and HAProxy removes before a client sees it."""
    return [
        (status, [h for h in headers if not h[0].startswith(b"x-tributary-shed")], body)
        for status, headers, body in answers
    ]


def test_the_front_takes_every_hot_route_and_no_other() -> None:
    front = FullApp(tenants=TENANTS).app
    assert isinstance(front, HotRouteFront)
    assert front.hot_paths == HOT_PATHS


async def test_the_front_answers_byte_for_byte_what_fastapi_answers() -> None:
    requests = _requests()
    # One app per side, so each side's fakes see the same sequence of calls.
    front = FullApp(tenants=TENANTS).app
    plain = FullApp(tenants=TENANTS).app.app
    fast, general = await _answers(front, requests), await _answers(plain, requests)
    statuses = {status for status, _, _ in general}
    assert {200, 400, 404, 413} <= statuses, statuses  # the cases reach every kind
    for (path, _, sent), (_, headers, _) in zip(requests, fast, strict=True):
        keyed = sent.get("X-Priority", "normal") in ("normal", "batch")
        names = [b"x-tributary-shed", b"x-tributary-shed-retry"] if keyed else []
        assert [k for k, _ in headers if k.startswith(b"x-tributary-shed")] == names, path
    for (path, _, _), got, expected in zip(requests, without_shares(fast), general, strict=True):
        assert got == expected, path


@pytest.mark.parametrize("key", [None, "trib-wrong-key"])
async def test_a_missing_or_wrong_key_is_the_same_401(key: str | None) -> None:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    request = [("/v1/embeddings", orjson.dumps({"model": EMBEDDER, "input": "x"}), headers)]
    fast = without_shares(await _answers(FullApp(tenants=TENANTS).app, request))
    general = await _answers(FullApp(tenants=TENANTS).app.app, request)
    assert fast == general
    assert fast[0][0] == 401


async def test_a_model_failure_is_the_same_answer_on_both() -> None:
    apps = [FullApp(tenants=TENANTS), FullApp(tenants=TENANTS)]
    for app in apps:
        app.embedder.fail = RuntimeError("the model broke: secret detail")
    request = [("/v1/embeddings", orjson.dumps({"model": EMBEDDER, "input": "x"}), AUTH)]
    fast = without_shares(await _answers(apps[0].app, request))
    general = await _answers(apps[1].app.app, request)
    assert fast == general
    assert fast[0][0] >= 500 and b"secret detail" not in fast[0][2]


async def test_other_routes_and_methods_go_to_the_app() -> None:
    front = FullApp(tenants=TENANTS).app
    transport = httpx.ASGITransport(app=front, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://ingress") as client:
        models = await client.get("/v1/models", headers=AUTH)
        wrong_method = await client.get("/v1/embeddings", headers=AUTH)
        missing = await client.post("/v1/nothing", headers=AUTH)
    assert models.status_code == 200
    assert wrong_method.status_code == 405
    assert missing.status_code == 404 and b"The routes are" in missing.content


async def test_a_cancellation_nobody_asked_for_is_a_json_503_not_a_bare_500() -> None:
    """The client is still there (its handler was not cancelled), so it gets an answer it
    can act on: the API's 503 with Retry-After."""
    app = FastAPI()

    @app.post("/v1/embeddings")
    async def embed(request: Request) -> Response:
        raise asyncio.CancelledError()

    front = HotRouteFront(app, answer_exception)
    transport = httpx.ASGITransport(app=front)
    async with httpx.AsyncClient(transport=transport, base_url="http://ingress") as client:
        answer = await client.post("/v1/embeddings", json={})
    assert answer.status_code == 503 and answer.headers["retry-after"]
    assert answer.json()["error"]["code"] == "not_ready"
