"""Request validation over HTTP on every model route: strict types (a bool is never a
number, a string never a number), integer bounds, finite floats, empty prompts. Every
refusal is a 400 in the OpenAI error shape naming the field, and reaches no model."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.integration.full_app import EMBEDDER, LLM, RERANK, FullApp

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def embed(**extra: Any) -> tuple[str, dict[str, Any]]:
    return "/v1/embeddings", {"model": EMBEDDER, "input": "hello", **extra}


def rerank(path: str = "/v2/rerank", **extra: Any) -> tuple[str, dict[str, Any]]:
    return path, {"model": RERANK, "query": "capital", "documents": ["Paris", "Rome"], **extra}


def tei(**extra: Any) -> tuple[str, dict[str, Any]]:
    return "/rerank", {"query": "capital", "texts": ["Paris", "Rome"], **extra}


def chat(**extra: Any) -> tuple[str, dict[str, Any]]:
    messages = [{"role": "user", "content": "hi"}]
    return "/v1/chat/completions", {"model": LLM, "messages": messages, **extra}


def complete(**extra: Any) -> tuple[str, dict[str, Any]]:
    return "/v1/completions", {"model": LLM, "prompt": "hi", **extra}


REFUSED = [
    # embeddings
    (embed(dimensions="8"), "dimensions", "valid integer"),
    (embed(dimensions=True), "dimensions", "valid integer"),
    (embed(dimensions=4.0), "dimensions", "valid integer"),
    (embed(dimensions=2**31), "dimensions", str(INT32_MAX)),
    (embed(input=[-1, 2]), "input", "token ids"),
    (embed(input=[2**31]), "input", "token ids"),
    (embed(input=[[1], [True]]), "input", "token ids"),
    (embed(input=["a", ""]), "input", "non-empty"),
    (embed(input=""), "input", "must not be empty"),
    (embed(user=3), "user", "valid string"),
    # Cohere / Jina rerank
    (rerank(top_n=True), "top_n", "valid integer"),
    (rerank(top_n="2"), "top_n", "valid integer"),
    (rerank(top_n=0), "top_n", "greater than or equal to 1"),
    (rerank("/v1/rerank", max_tokens_per_doc="64"), "max_tokens_per_doc", "valid integer"),
    (rerank("/v1/rerank", max_tokens_per_doc=2**31), "max_tokens_per_doc", str(INT32_MAX)),
    (rerank(return_documents="yes"), "return_documents", "valid boolean"),
    (rerank(raw_scores=1), "raw_scores", "valid boolean"),
    (rerank(query=""), "query", "must not be empty"),
    (rerank(documents=[]), "documents", "must not be empty"),
    # TEI rerank
    (tei(truncate="yes"), "truncate", "valid boolean"),
    (tei(return_text=1), "return_text", "valid boolean"),
    (tei(raw_scores="true"), "raw_scores", "valid boolean"),
    (tei(texts=[]), "texts", "must not be empty"),
    # chat completions
    (chat(max_tokens="5"), "max_tokens", "valid integer"),
    (chat(max_tokens=True), "max_tokens", "valid integer"),
    (chat(max_tokens=0), "max_tokens", "greater than or equal to 1"),
    (chat(max_tokens=2**31), "max_tokens", str(INT32_MAX)),
    (chat(max_completion_tokens="5"), "max_completion_tokens", "valid integer"),
    (chat(max_completion_tokens=0), "max_completion_tokens", "greater than or equal to 1"),
    (chat(temperature="0.5"), "temperature", "valid number"),
    (chat(temperature=True), "temperature", "valid number"),
    (chat(temperature=2.5), "temperature", "less than or equal to 2"),
    (chat(temperature=-0.1), "temperature", "greater than or equal to 0"),
    (chat(top_p=0), "top_p", "greater than 0"),
    (chat(top_p=1.5), "top_p", "less than or equal to 1"),
    (chat(top_p="1"), "top_p", "valid number"),
    (chat(seed=2**64), "seed", str(INT64_MAX)),
    (chat(seed=-(2**63) - 1), "seed", str(-(2**63))),
    (chat(seed="7"), "seed", "valid integer"),
    (chat(seed=True), "seed", "valid integer"),
    (chat(seed=1.5), "seed", "valid integer"),
    (chat(stream="yes"), "stream", "valid boolean"),
    (chat(stream=1), "stream", "valid boolean"),
    (chat(stream=True, stream_options={"include_usage": "yes"}), "stream_options", "include_usage"),
    (chat(n=True), "n", "valid integer"),
    (chat(n=0), "n", "greater than or equal to 1"),
    (chat(presence_penalty="0"), "presence_penalty", "valid number"),
    (chat(frequency_penalty=3), "frequency_penalty", "less than or equal to 2"),
    (chat(logprobs="no"), "logprobs", "valid"),
    (chat(messages=[{"role": "user", "content": "hi", "name": 5}]), "messages", "messages"),
    # text completions
    (complete(prompt=""), "prompt", "'prompt' must not be empty"),
    (complete(prompt=[""]), "prompt", "non-empty"),
    (complete(max_tokens="5"), "max_tokens", "valid integer"),
    (complete(best_of=True), "best_of", "valid integer"),
    (complete(best_of=0), "best_of", "greater than or equal to 1"),
    (complete(echo="no"), "echo", "valid boolean"),
    (complete(seed=2**64), "seed", str(INT64_MAX)),
]


async def send(client: httpx.AsyncClient, request: tuple[str, dict[str, Any]]) -> httpx.Response:
    path, body = request
    return await client.post(path, json=body)


def assert_400(response: httpx.Response, param: str, says: str) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert says in error["message"], error["message"]
    return error


@pytest.mark.parametrize(("request_", "param", "says"), REFUSED)
async def test_a_wrong_type_or_a_value_out_of_range_is_a_400_naming_the_field(
    request_: tuple[str, dict[str, Any]], param: str, says: str
) -> None:
    app = FullApp()
    path, body = request_
    async with app.client() as client:
        assert_400(await client.post(path, json=body), param, says)
    assert app.model_calls() == 0


@pytest.mark.parametrize(
    ("path", "raw", "param"),
    [
        ("/v1/chat/completions", b'"temperature": 1e999', "temperature"),
        ("/v1/chat/completions", b'"temperature": -1e999', "temperature"),
        ("/v1/completions", b'"top_p": NaN', "top_p"),
        ("/v1/completions", b'"presence_penalty": Infinity', "presence_penalty"),
    ],
)
async def test_infinities_and_nan_are_refused(path: str, raw: bytes, param: str) -> None:
    # JSON has no inf or NaN, but 1e999 parses to inf, and the parser reads NaN/Infinity.
    head = (
        b'"messages": [{"role": "user", "content": "hi"}]' if "chat" in path else b'"prompt": "x"'
    )
    body = b'{"model": "' + LLM.encode() + b'", ' + head + b", " + raw + b"}"
    app = FullApp()
    async with app.client() as client:
        response = await client.post(path, content=body)
    assert_400(response, param, "finite number")
    assert app.model_calls() == 0


async def test_logprobs_zero_is_not_taken_for_false() -> None:
    app = FullApp()
    async with app.client() as client:
        zero = await send(client, complete(logprobs=0))
        false = await send(client, chat(logprobs=False))
    assert assert_400(zero, "logprobs", "not supported")["code"] == "unsupported"
    assert false.status_code == 200


async def test_max_completion_tokens_over_the_model_limit_names_itself() -> None:
    app = FullApp()
    async with app.client() as client:
        response = await send(client, chat(max_completion_tokens=9999))
    error = assert_400(response, "max_completion_tokens", "at most 512")
    assert error["code"] == "max_tokens_exceeded"


async def test_edge_values_the_schema_admits_reach_the_model_intact() -> None:
    """Tiny temperatures and top_p, int-valued floats, the seed range's ends, a whitespace
    prompt, empty chat content: valid, passed on exactly (the engine makes them safe)."""
    app = FullApp()
    async with app.client() as client:
        sent = [
            chat(temperature=1e-39, top_p=1e-300, seed=INT64_MAX),
            chat(temperature=1, top_p=1, seed=-(2**63), max_completion_tokens=3),
            complete(prompt="   ", seed=0, max_tokens=1),
            chat(messages=[{"role": "user", "content": ""}], stream=True),
        ]
        for path, body in sent:
            response = await client.post(path, json=body)
            assert response.status_code == 200, response.text
    jobs = [job for _, job, _, _ in app.generator.calls]
    assert (jobs[0].temperature, jobs[0].top_p, jobs[0].seed) == (1e-39, 1e-300, INT64_MAX)
    assert jobs[1].temperature == 1 and jobs[1].seed == -(2**63) and jobs[1].max_tokens == 3
    assert jobs[2].prompt == "   "
    assert jobs[3].messages == [{"role": "user", "content": ""}]


async def test_an_empty_document_among_others_is_ranked_not_refused() -> None:
    app = FullApp()
    async with app.client() as client:
        cohere = await send(client, rerank(documents=["", "capital city"]))
        tei_answer = await send(client, tei(texts=["capital", ""]))
    assert cohere.status_code == 200, cohere.text
    assert sorted(r["index"] for r in cohere.json()["results"]) == [0, 1]
    assert tei_answer.status_code == 200 and len(tei_answer.json()) == 2


async def test_integers_where_floats_are_expected_and_bounds_inclusive() -> None:
    app = FullApp()
    async with app.client() as client:
        edges = [
            embed(dimensions=8),
            embed(input=[0, INT32_MAX]),
            rerank(top_n=INT32_MAX, max_tokens_per_doc=INT32_MAX),
            complete(temperature=2, top_p=1, presence_penalty=0, n=1, best_of=1),
        ]
        for path, body in edges:
            response = await client.post(path, json=body)
            assert response.status_code == 200, (path, response.text)
