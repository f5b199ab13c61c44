"""Cohere's /v1/embed and /v2/embed, TEI's /embed, / and /info, over fake embedders: the
shapes each client reads, the job each builds, the quantised types against
sentence-transformers' own `quantize_embeddings`, and a clear 4xx for bad input."""

import base64
import json

import httpx
import numpy as np
import pytest
from sentence_transformers.util.quantization import quantize_embeddings

from deployments.app import ingress_args
from deployments.config import AppConfig, ModelBatching
from deployments.core.protocol import EmbedJob
from deployments.ingress.api.dialects import TEI_RERANK
from deployments.ingress.tasks.rerank import parse_rerank_request
from tests.integration.conftest import CONFIG, DIM, Harness, fake_vector
from tests.integration.test_embeddings_route import assert_error

MODEL = "fake-embedder"
TEXTS = ["first text", "second one", "and a third"]
QUANTISED = ["int8", "uint8", "binary", "ubinary"]


def floats(texts: list[str]) -> np.ndarray:
    return np.stack([fake_vector(text) for text in texts])


def last_job(harness: Harness) -> EmbedJob:
    return harness.embedder.calls[-1][-1]


async def test_cohere_v1_without_types_answers_a_list_of_floats(
    client: httpx.AsyncClient, harness: Harness
) -> None:
    response = await client.post("/v1/embed", json={"texts": TEXTS, "model": MODEL})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["response_type"] == "embeddings_floats"
    assert body["texts"] == TEXTS and body["id"]
    np.testing.assert_allclose(body["embeddings"], floats(TEXTS), rtol=1e-6)
    assert body["meta"]["api_version"] == {"version": "1"}
    assert body["meta"]["billed_units"]["input_tokens"] == sum(len(t.split()) + 2 for t in TEXTS)
    job = last_job(harness)
    assert job.texts == TEXTS and job.prompt_names == () and job.truncate is None


@pytest.mark.parametrize("path", ["/v1/embed", "/v2/embed"])
async def test_every_quantised_type_equals_sentence_transformers(
    client: httpx.AsyncClient, path: str
) -> None:
    payload = {"texts": TEXTS, "model": MODEL, "embedding_types": ["float", *QUANTISED]}
    response = await client.post(path, json=payload)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["response_type"] == "embeddings_by_type"
    by_type = body["embeddings"]
    assert set(by_type) == {"float", *QUANTISED}
    vectors = np.asarray(by_type["float"], dtype=np.float32)
    np.testing.assert_allclose(vectors, floats(TEXTS), rtol=1e-6)
    for kind in QUANTISED:
        expected = quantize_embeddings(vectors, kind)
        assert np.array_equal(np.asarray(by_type[kind]), expected), kind
    assert np.asarray(by_type["binary"]).shape == (len(TEXTS), DIM // 8)


async def test_cohere_v2_always_answers_by_type_and_has_base64(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post("/v2/embed", json={"texts": TEXTS, "model": MODEL})
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body["embeddings"]) == {"float"}
    assert body["meta"]["api_version"] == {"version": "2"}
    payload = {"texts": TEXTS[:1], "model": MODEL, "embedding_types": ["base64", "float"]}
    by_type = (await client.post("/v2/embed", json=payload)).json()["embeddings"]
    decoded = np.frombuffer(base64.b64decode(by_type["base64"][0]), dtype="<f4")
    np.testing.assert_allclose(decoded, by_type["float"][0], rtol=1e-6)


async def test_cohere_v2_output_dimension_keeps_a_unit_prefix(client: httpx.AsyncClient) -> None:
    payload = {"texts": TEXTS, "model": MODEL, "output_dimension": 4}
    vectors = np.asarray(
        (await client.post("/v2/embed", json=payload)).json()["embeddings"]["float"]
    )
    assert vectors.shape == (len(TEXTS), 4)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    too_wide = {**payload, "output_dimension": DIM + 1}
    assert_error(await client.post("/v2/embed", json=too_wide), 400, "output_dimension")


@pytest.mark.parametrize(
    ("input_type", "names"),
    [
        ("search_query", ("search_query", "query")),
        ("search_document", ("search_document", "document")),
        ("clustering", ("clustering",)),
    ],
)
async def test_cohere_input_type_asks_for_the_models_prompt_if_it_has_one(
    client: httpx.AsyncClient, harness: Harness, input_type: str, names: tuple[str, ...]
) -> None:
    payload = {"texts": TEXTS, "input_type": input_type, "truncate": "START"}
    assert (await client.post("/v2/embed", json=payload)).status_code == 200
    job = last_job(harness)
    assert job.prompt_names == names and job.prompt_optional
    assert job.truncate == "start"


@pytest.mark.parametrize(
    ("path", "payload", "param"),
    [
        ("/v1/embed", {"texts": ["a", "b"], "embedding_types": ["base64"]}, "embedding_types"),
        ("/v2/embed", {"texts": ["one"], "embedding_types": ["int8"]}, "embedding_types"),
        ("/v2/embed", {"texts": ["a"], "embedding_types": ["float64"]}, "embedding_types"),
        ("/v2/embed", {"texts": ["a"], "input_type": "image"}, "input_type"),
        ("/v2/embed", {"texts": ["a"], "truncate": "MIDDLE"}, "truncate"),
        ("/v2/embed", {"texts": []}, "texts"),
        ("/v2/embed", {"texts": ["a", ""]}, "texts"),
        ("/v1/embed", {"texts": ["a"], "images": ["data:image/png;base64,AA=="]}, "images"),
        ("/v1/embed", {"texts": "not a list"}, "texts"),
        ("/embed", {"inputs": []}, "inputs"),
        ("/embed", {"inputs": "a", "truncation_direction": "Middle"}, "truncation_direction"),
        ("/embed", {"inputs": "a", "normalize": "yes"}, "normalize"),
        ("/embed", {"input": "a"}, "inputs"),  # missing comes first
        ("/", {"inputs": "a", "dimensions": DIM + 1}, "dimensions"),
    ],
)
async def test_bad_input_is_a_400_naming_its_field(
    client: httpx.AsyncClient, path: str, payload: dict, param: str
) -> None:
    assert_error(await client.post(path, json=payload), 400, param)


async def test_an_unknown_model_is_a_404_and_too_many_texts_a_413(
    client: httpx.AsyncClient,
) -> None:
    assert_error(await client.post("/v1/embed", json={"texts": ["a"], "model": "x"}), 404, "model")
    assert_error(await client.post("/embed", json={"inputs": ["a"] * 11}), 413, "inputs")


@pytest.mark.parametrize("path", ["/embed", "/"])
async def test_tei_embed_answers_a_list_of_vectors(client: httpx.AsyncClient, path: str) -> None:
    one = await client.post(path, json={"inputs": "hi there"})
    assert one.status_code == 200, one.text
    np.testing.assert_allclose(one.json(), floats(["hi there"]), rtol=1e-6)
    many = await client.post(path, json={"inputs": TEXTS, "dimensions": 4})
    vectors = np.asarray(many.json())
    assert vectors.shape == (len(TEXTS), 4)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize(
    ("fields", "truncate"),
    [
        ({}, "end"),  # the model's setting: truncate true
        ({"truncation_direction": "Left"}, "start"),
        ({"truncate": True, "truncation_direction": "left"}, "start"),
        ({"truncate": True, "truncation_direction": "Right"}, "end"),
        ({"truncate": False}, "refuse"),
    ],
)
async def test_tei_fields_become_the_jobs_options(
    client: httpx.AsyncClient, harness: Harness, fields: dict, truncate: str
) -> None:
    payload = {"inputs": ["a"], "normalize": False, "prompt_name": "query", **fields}
    assert (await client.post("/embed", json=payload)).status_code == 200
    job = last_job(harness)
    assert job.truncate == truncate
    assert job.prompt_names == ("query",) and not job.prompt_optional
    assert job.normalize is False


async def test_tei_info_names_the_model_and_its_limits(client: httpx.AsyncClient) -> None:
    response = await client.get("/info")
    assert response.status_code == 200, response.text
    info = response.json()
    assert info["model_id"] == MODEL
    assert info["max_client_batch_size"] == 10
    assert "embedding" in info["model_type"]
    assert info["model_dtype"] == "float32" and info["auto_truncate"] is True


async def test_tei_info_reports_the_models_own_batching_not_the_defaults() -> None:
    model = {
        **CONFIG["embedding_models"][0],
        "batching": {"normal": {"max_batch_size": 48, "max_batch_tokens": 3000}},
        "deployment": {"max_ongoing_requests": 17},
    }
    config = AppConfig.model_validate({**CONFIG, "embedding_models": [model]})
    # Built as build_app builds it: the ingress's copy of the config has no batching, and
    # the replica holds the knobs it was deployed with.
    harness = Harness(ingress_args(config))
    harness.embedder.batching = config.embedding_models[0].batching.model_dump()
    transport = httpx.ASGITransport(app=harness.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://ingress") as client:
        info = (await client.get("/info")).json()
    defaults = ModelBatching().normal
    assert (defaults.max_batch_tokens, defaults.max_batch_size) != (3000, 48)
    assert info["max_batch_tokens"] == 3000 and info["max_batch_requests"] == 48
    assert info["max_client_batch_size"] == 10 and info["max_concurrent_requests"] == 17


async def test_tei_rerank_takes_its_truncation_direction(client: httpx.AsyncClient) -> None:
    for direction, truncate in (("Right", True), ("right", True), ("Left", False), ("left", None)):
        body = {"query": "q", "texts": ["a"], "truncation_direction": direction}
        query = parse_rerank_request(
            json.dumps({**body, "truncate": truncate}).encode(), TEI_RERANK
        )
        assert query.first_chunk_only is bool(truncate)
    body = {"query": "q", "texts": ["a"], "truncate": True, "truncation_direction": "Left"}
    assert_error(await client.post("/rerank", json=body), 400, "truncation_direction")
