"""The official `openai` client against the served app, as an application would use it."""

from __future__ import annotations

import numpy as np
import openai
import pytest

from tests.serve.conftest import ADMIN_KEY, MODEL, Server


@pytest.fixture
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=ADMIN_KEY, max_retries=0)


def test_embeddings_create_with_floats_and_base64(client: openai.OpenAI) -> None:
    texts = ["A man is eating food.", "A man is riding a horse."]
    as_float = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    as_b64 = client.embeddings.create(model=MODEL, input=texts)  # the client's default
    assert [d.index for d in as_float.data] == [0, 1]
    assert len(as_float.data[0].embedding) == 384
    np.testing.assert_allclose(
        as_b64.data[1].embedding, as_float.data[1].embedding, rtol=1e-6, atol=1e-7
    )
    assert as_float.usage.prompt_tokens == as_float.usage.total_tokens > 0
    assert as_float.model == MODEL


def test_models_list(client: openai.OpenAI) -> None:
    assert MODEL in [m.id for m in client.models.list()]


def test_an_unknown_model_raises_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as excinfo:
        client.embeddings.create(model="text-embedding-3-small", input="hi")
    assert excinfo.value.body["code"] == "model_not_found"


def test_a_wrong_key_raises_authentication_error(server: Server) -> None:
    stranger = openai.OpenAI(base_url=f"{server.url}/v1", api_key="trib-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as excinfo:
        stranger.embeddings.create(model=MODEL, input="hi")
    assert excinfo.value.body["code"] == "invalid_api_key"
