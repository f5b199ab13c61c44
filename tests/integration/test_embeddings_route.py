import asyncio
import base64

import httpx
import numpy as np
import pytest

from deployments.core.protocol import Rejection
from tests.integration.conftest import DIM, Harness, fake_vector

MODEL = "fake-embedder"


def assert_error(response: httpx.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    if param is not None:
        assert body["error"]["param"] == param
    return body["error"]


async def test_a_string_input_gets_one_embedding_in_openai_shape(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post("/v1/embeddings", json={"model": MODEL, "input": "hi there"})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list" and body["model"] == MODEL
    (item,) = body["data"]
    assert item["object"] == "embedding" and item["index"] == 0
    np.testing.assert_allclose(item["embedding"], fake_vector("hi there"), rtol=1e-6)
    assert body["usage"] == {"prompt_tokens": 4, "total_tokens": 4, "truncated_inputs": 0}


async def test_a_list_input_keeps_order_and_base64_decodes_to_the_floats(
    client: httpx.AsyncClient,
) -> None:
    texts = ["one", "two", "three"]
    floats = await client.post("/v1/embeddings", json={"model": MODEL, "input": texts})
    b64 = await client.post(
        "/v1/embeddings", json={"model": MODEL, "input": texts, "encoding_format": "base64"}
    )
    assert [d["index"] for d in floats.json()["data"]] == [0, 1, 2]
    for as_float, as_b64 in zip(floats.json()["data"], b64.json()["data"], strict=True):
        decoded = np.frombuffer(base64.b64decode(as_b64["embedding"]), dtype="<f4")
        np.testing.assert_allclose(decoded, as_float["embedding"], rtol=1e-6)


async def test_dimensions_truncates_and_renormalises(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/embeddings", json={"model": MODEL, "input": "abc", "dimensions": 4}
    )
    vector = np.array(response.json()["data"][0]["embedding"])
    assert vector.shape == (4,)
    assert abs(np.linalg.norm(vector) - 1) < 1e-5
    too_many = await client.post(
        "/v1/embeddings", json={"model": MODEL, "input": "abc", "dimensions": DIM + 1}
    )
    assert_error(too_many, 400, "dimensions")


async def test_truncation_is_reported_in_data_and_usage(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/embeddings", json={"model": MODEL, "input": ["short", "LONG text"]}
    )
    body = response.json()
    assert "truncated" not in body["data"][0]
    assert body["data"][1]["truncated"] is True
    assert body["usage"]["truncated_inputs"] == 1


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({"model": MODEL, "input": []}, "input"),
        ({"model": MODEL, "input": ""}, "input"),
        ({"model": MODEL, "input": ["ok", ""]}, "input"),
        ({"model": MODEL, "input": ["ok", 3]}, "input"),
        ({"model": MODEL, "input": [1, "a"]}, "input"),
        ({"model": MODEL, "input": [[1], []]}, "input"),
        ({"model": MODEL, "input": {"text": "a"}}, "input"),
        ({"model": MODEL, "input": [True]}, "input"),
        ({"model": MODEL}, "input"),
        ({"input": "a"}, "model"),
        ({"model": MODEL, "input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"model": MODEL, "input": "a", "dimensions": 0}, "dimensions"),
        ({"model": MODEL, "input": "a", "temperature": 1}, "temperature"),
    ],
)
async def test_bad_inputs_get_400_naming_the_parameter(
    client: httpx.AsyncClient, harness: Harness, payload: dict, param: str
) -> None:
    assert_error(await client.post("/v1/embeddings", json=payload), 400, param)
    assert harness.embedder.calls == []


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b"", b"\xff\xfe"])
async def test_a_body_that_is_not_a_json_object_gets_400(
    client: httpx.AsyncClient, body: bytes
) -> None:
    response = await client.post(
        "/v1/embeddings", content=body, headers={"content-type": "application/json"}
    )
    assert assert_error(response, 400)["type"] == "invalid_request_error"


async def test_an_unknown_model_gets_404(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/embeddings", json={"model": "gpt-9", "input": "a"})
    error = assert_error(response, 404, "model")
    assert error["code"] == "model_not_found" and "gpt-9" in error["message"]


async def test_too_many_inputs_get_413_naming_the_limit(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/embeddings", json={"model": MODEL, "input": ["a"] * 11})
    assert "at most 10" in assert_error(response, 413, "input")["message"]


async def test_an_oversized_body_gets_413_with_or_without_content_length(
    client: httpx.AsyncClient,
) -> None:
    big = b'{"model": "fake-embedder", "input": "' + b"a" * 5000 + b'"}'
    assert_error(await client.post("/v1/embeddings", content=big), 413)

    async def chunks():
        for start in range(0, len(big), 1000):
            yield big[start : start + 1000]

    assert_error(await client.post("/v1/embeddings", content=chunks()), 413)


async def test_a_model_failure_is_a_500_that_leaks_nothing(
    client: httpx.AsyncClient, harness: Harness
) -> None:
    harness.embedder.fail = RuntimeError("segfault in /secret/path")
    error = assert_error(
        await client.post("/v1/embeddings", json={"model": MODEL, "input": "a"}), 500
    )
    assert "secret" not in error["message"] and error["type"] == "server_error"


async def test_a_rejection_from_the_model_keeps_its_status_and_message(
    client: httpx.AsyncClient, harness: Harness
) -> None:
    harness.embedder.reject = Rejection(
        400, "Input 0 has 300 tokens; at most 256.", param="input", code="context_length_exceeded"
    )
    error = assert_error(
        await client.post("/v1/embeddings", json={"model": MODEL, "input": "a"}), 400, "input"
    )
    assert error["code"] == "context_length_exceeded" and "at most 256" in error["message"]


async def test_concurrent_requests_share_calls_and_each_gets_its_own_answer(
    client: httpx.AsyncClient, harness: Harness
) -> None:
    harness.embedder.gate.clear()
    first = asyncio.create_task(
        client.post("/v1/embeddings", json={"model": MODEL, "input": "first"})
    )
    await asyncio.sleep(0.05)
    rest = [
        asyncio.create_task(client.post("/v1/embeddings", json={"model": MODEL, "input": t}))
        for t in [f"text {i}" for i in range(20)]
    ]
    await asyncio.sleep(0.05)
    harness.embedder.gate.set()
    responses = await asyncio.gather(first, *rest)
    assert all(r.status_code == 200 for r in responses)
    for i, response in enumerate(responses[1:]):
        got = response.json()["data"][0]["embedding"]
        np.testing.assert_allclose(got, fake_vector(f"text {i}"), rtol=1e-6)
    assert len(harness.embedder.calls) == 2  # one lone call, then the 20 that waited
    assert len(harness.embedder.calls[1]) == 20


async def test_serves_back_pressure_becomes_429_or_503_with_retry_after(
    client: httpx.AsyncClient, harness: Harness
) -> None:
    from ray.serve.exceptions import BackPressureError

    harness.embedder.fail = BackPressureError(num_queued_requests=256, max_queued_requests=256)
    response = await client.post("/v1/embeddings", json={"model": MODEL, "input": "a"})
    assert assert_error(response, 429)["code"] == "queue_full"
    assert response.headers["retry-after"] == "1"
    realtime = await client.post(
        "/v1/embeddings", json={"model": MODEL, "input": "a"}, headers={"X-Priority": "realtime"}
    )
    assert assert_error(realtime, 503)["code"] == "queue_full"
    assert realtime.headers["retry-after"] == "1"


async def test_a_dead_replica_becomes_503_not_500(
    client: httpx.AsyncClient, harness: Harness
) -> None:
    from ray.exceptions import ActorDiedError

    harness.embedder.fail = ActorDiedError()
    response = await client.post("/v1/embeddings", json={"model": MODEL, "input": "a"})
    assert assert_error(response, 503)["code"] == "not_ready"
    assert "retry-after" in response.headers
