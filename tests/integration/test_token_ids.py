"""Token-id input (issue 17): embedded only for a model whose config says its clients send ids
in its own vocabulary; refused by name everywhere else, so ids from another tokenizer (OpenAI
clients send tiktoken's) never give a wrong vector with a 200."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator

import httpx
import orjson
import pytest

from deployments.errors import InvalidRequest
from deployments.ingress.api.dialects import OPENAI_COMPLETIONS
from deployments.ingress.tasks.generation import parse_generation_request
from tests.integration.conftest import CONFIG, Harness
from tests.integration.test_embeddings_route import assert_error

TRUSTING = "ids-embedder"  # accept_token_ids: true
DEFAULT = "fake-embedder"  # the field left at its default


@pytest.fixture
def harness() -> Harness:
    config = copy.deepcopy(CONFIG)
    trusting = {**config["embedding_models"][0], "name": TRUSTING, "accept_token_ids": True}
    config["embedding_models"].append(trusting)
    return Harness(config)


@pytest.fixture
async def client(harness: Harness) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=harness.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://ingress") as c:
        yield c


# What LangChain's OpenAIEmbeddings sends by default (check_embedding_ctx_length=True): the
# texts as tiktoken ids, a list of lists, with the openai SDK's base64 encoding.
LANGCHAIN_SHAPE = {"input": [[9906, 1917], [40, 1093, 311, 30]], "encoding_format": "base64"}


@pytest.mark.parametrize("ids", [[1, 2, 3], [[1, 2], [3]], LANGCHAIN_SHAPE["input"]])
async def test_a_model_left_at_the_default_refuses_token_ids_naming_what_to_send(
    client: httpx.AsyncClient, harness: Harness, ids: list
) -> None:
    response = await client.post(
        "/v1/embeddings", json={**LANGCHAIN_SHAPE, "model": DEFAULT, "input": ids}
    )
    error = assert_error(response, 400, "input")
    assert error["code"] == "token_ids_not_accepted"
    assert error["type"] == "invalid_request_error"
    assert "Send the text" in error["message"]
    assert "check_embedding_ctx_length=False" in error["message"]
    assert harness.embedder.calls == []  # nothing reached the model


async def test_the_same_texts_as_text_are_embedded_by_the_default_model(
    client: httpx.AsyncClient,
) -> None:
    body = {"model": DEFAULT, "input": ["Hello world", "I like to eat"]}
    response = await client.post("/v1/embeddings", json=body)
    assert response.status_code == 200 and len(response.json()["data"]) == 2


async def test_a_trusting_model_sends_token_ids_to_the_replica_as_token_ids(
    client: httpx.AsyncClient, harness: Harness
) -> None:
    one = await client.post("/v1/embeddings", json={"model": TRUSTING, "input": [1, 2, 3]})
    many = await client.post("/v1/embeddings", json={"model": TRUSTING, "input": [[1, 2], [3]]})
    assert len(one.json()["data"]) == 1 and len(many.json()["data"]) == 2
    assert harness.embedder.calls[0][0].token_ids == [[1, 2, 3]]
    assert harness.embedder.calls[1][0].token_ids == [[1, 2], [3]]


async def test_a_trusting_model_still_refuses_an_empty_id_list(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post("/v1/embeddings", json={"model": TRUSTING, "input": [[1], []]})
    assert_error(response, 400, "input")


async def test_malformed_ids_are_a_shape_error_not_a_refusal_of_ids(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post("/v1/embeddings", json={"model": DEFAULT, "input": [[1.5]]})
    error = assert_error(response, 400, "input")
    assert error["code"] != "token_ids_not_accepted"


@pytest.mark.parametrize("prompt", [[1, 2, 3], [[1, 2, 3]], [[1], [2]]])
def test_completions_refuse_token_id_prompts_by_name(prompt: list) -> None:
    body = orjson.dumps({"model": "m", "prompt": prompt})
    with pytest.raises(InvalidRequest) as refused:
        parse_generation_request(body, OPENAI_COMPLETIONS)
    assert refused.value.code == "token_ids_not_accepted"
    assert refused.value.param == "prompt" and "as text" in refused.value.message


@pytest.mark.parametrize("prompt", [[], [True], [1.5], ["a", 1]])
def test_other_bad_prompts_stay_shape_errors(prompt: list) -> None:
    body = orjson.dumps({"model": "m", "prompt": prompt})
    with pytest.raises(InvalidRequest) as refused:
        parse_generation_request(body, OPENAI_COMPLETIONS)
    assert refused.value.code != "token_ids_not_accepted" and refused.value.param == "prompt"
