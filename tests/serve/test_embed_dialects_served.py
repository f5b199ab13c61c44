"""The embed dialects in the real application, through the official clients unchanged:
Cohere's SDK (`Client.embed`, v1; `ClientV2.embed`, v2) and huggingface_hub's
`InferenceClient.feature_extraction` (TEI's POST /). Their vectors are /v1/embeddings' own,
and every quantised type is sentence-transformers' quantize_embeddings of those floats."""

from __future__ import annotations

import base64
import logging

import cohere
import httpx
import numpy as np
import pytest
from huggingface_hub import InferenceClient
from sentence_transformers.util.quantization import quantize_embeddings

from tests.serve.conftest import (
    ADMIN_KEY,
    AUTH,
    MODEL,
    RERANK_MODEL,
    STRICT_MODEL,
    Server,
    serve_test_config,
)

TEXTS = [
    "Paris is the capital of France.",
    "A cheetah is running behind its prey.",
    "Ray Serve batches requests.",
]
LONG = " ".join(["long"] * 400)
QUANTISED = ["int8", "uint8", "binary", "ubinary"]


def openai_vectors(server: Server, texts: list[str], model: str = MODEL) -> np.ndarray:
    payload = {"model": model, "input": texts}
    response = httpx.post(f"{server.url}/v1/embeddings", json=payload, headers=AUTH, timeout=60)
    assert response.status_code == 200, response.text
    return np.array([d["embedding"] for d in response.json()["data"]], dtype=np.float32)


def assert_same_vectors(ours: object, expected: np.ndarray) -> None:
    vectors = np.asarray(ours, dtype=np.float32)
    assert vectors.shape == expected.shape
    cosines = np.sum(vectors * expected, axis=1) / (
        np.linalg.norm(vectors, axis=1) * np.linalg.norm(expected, axis=1)
    )
    assert np.all(cosines > 0.9999), cosines


@pytest.fixture(autouse=True)
def quiet_calibration_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)  # quantize_embeddings' "buckets based on N embeddings"


def test_cohere_v1_sdk_embeds_floats_and_quantised_types(server: Server) -> None:
    client = cohere.Client(api_key=ADMIN_KEY, base_url=server.url)
    expected = openai_vectors(server, TEXTS)
    floats = client.embed(texts=TEXTS, model=MODEL, input_type="search_document")
    assert floats.response_type == "embeddings_floats"
    assert_same_vectors(floats.embeddings, expected)
    assert floats.meta is not None and floats.meta.billed_units is not None
    assert (floats.meta.billed_units.input_tokens or 0) > len(TEXTS)
    typed = client.embed(
        texts=TEXTS, model=MODEL, input_type="search_query", embedding_types=["float", *QUANTISED]
    )
    assert typed.response_type == "embeddings_by_type"
    by_type = typed.embeddings
    assert_same_vectors(by_type.float_, expected)
    reference = np.asarray(by_type.float_, dtype=np.float32)
    for kind in QUANTISED:
        assert np.array_equal(
            np.asarray(getattr(by_type, kind)), quantize_embeddings(reference, kind)
        )


def test_cohere_v2_sdk_embeds_every_type(server: Server) -> None:
    client = cohere.ClientV2(api_key=ADMIN_KEY, base_url=server.url)
    expected = openai_vectors(server, TEXTS)
    response = client.embed(
        texts=TEXTS,
        model=MODEL,
        input_type="classification",
        embedding_types=["float", "base64", *QUANTISED],
        truncate="END",
    )
    by_type = response.embeddings
    assert_same_vectors(by_type.float_, expected)
    reference = np.asarray(by_type.float_, dtype=np.float32)
    for kind in QUANTISED:
        assert np.array_equal(
            np.asarray(getattr(by_type, kind)), quantize_embeddings(reference, kind)
        )
    assert by_type.base64 is not None
    decoded = np.stack([np.frombuffer(base64.b64decode(b), dtype="<f4") for b in by_type.base64])
    np.testing.assert_allclose(decoded, reference, rtol=1e-6)
    assert response.texts == TEXTS


def test_cohere_truncate_none_refuses_a_long_text_with_a_400(server: Server) -> None:
    client = cohere.ClientV2(api_key=ADMIN_KEY, base_url=server.url)
    with pytest.raises(cohere.BadRequestError) as refused:
        client.embed(texts=[LONG], model=MODEL, input_type="search_query", truncate="NONE")
    assert refused.value.body["error"]["code"] == "context_length_exceeded"
    # And END cuts it even on the model configured not to truncate.
    cut = client.embed(texts=[LONG], model=STRICT_MODEL, input_type="search_query", truncate="END")
    assert cut.embeddings.float_ is not None and len(cut.embeddings.float_) == 1


def test_huggingface_inference_client_gets_the_same_vector(server: Server) -> None:
    client = InferenceClient(base_url=server.url, api_key=ADMIN_KEY)
    expected = openai_vectors(server, TEXTS[:1])
    assert_same_vectors(client.feature_extraction(TEXTS[0]), expected)
    raw = client.feature_extraction(
        TEXTS[0], normalize=False, truncate=True, truncation_direction="left", prompt_name="query"
    )
    assert_same_vectors(raw, expected)  # MiniLM's "query" prompt is empty


def test_tei_embed_info_and_rerank_direction_over_http(server: Server) -> None:
    expected = openai_vectors(server, TEXTS)
    response = httpx.post(f"{server.url}/embed", json={"inputs": TEXTS}, headers=AUTH, timeout=60)
    assert response.status_code == 200, response.text
    assert_same_vectors(response.json(), expected)
    info = httpx.get(f"{server.url}/info", timeout=30).json()
    assert info["model_id"] == MODEL and info["max_input_length"] == 256
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    # The model's own batch knobs (not the defaults), which its replica holds.
    models = serve_test_config()["applications"][0]["args"]["embedding_models"]
    normal = next(m for m in models if m["name"] == MODEL)["batching"]["normal"]
    assert info["max_batch_tokens"] == normal["max_batch_tokens"]
    assert info["max_batch_requests"] == normal["max_batch_size"]
    rerank = {
        "query": "capital of France",
        "texts": TEXTS,
        "model": RERANK_MODEL,
        "truncate": True,
        "truncation_direction": "Right",
    }
    ranked = httpx.post(f"{server.url}/rerank", json=rerank, headers=AUTH, timeout=60)
    assert ranked.status_code == 200, ranked.text
    assert ranked.json()[0]["index"] == 0
