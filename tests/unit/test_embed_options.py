"""An embed job's dialect options on the replica: prompts, truncation end, normalisation,
with the real MiniLM and a plain batcher in place of Serve's."""

import numpy as np
import pytest

from deployments.backends.encoders.sentence_embedder import SentenceEmbedder
from deployments.backends.sources import resolve_model_source
from deployments.core.protocol import EmbedJob, EmbedResult, Rejection
from tests.unit.test_embed_task import MODEL, Batcher, worker

LONG = "alpha beta gamma " * 150 + "the very end of a long text"


@pytest.fixture(scope="module")
def backend() -> SentenceEmbedder:
    backend = SentenceEmbedder(resolve_model_source(MODEL.source))
    backend.model.prompts = {"query": "query: ", "document": ""}
    return backend


async def embed(backend: SentenceEmbedder, job: EmbedJob, **config: object) -> EmbedResult:
    (outcome,) = await worker(backend, **config).run_jobs([job], Batcher(backend.embed))
    assert isinstance(outcome, EmbedResult), outcome
    return outcome


async def refused(backend: SentenceEmbedder, job: EmbedJob, **config: object) -> Rejection:
    (outcome,) = await worker(backend, **config).run_jobs([job], Batcher(backend.embed))
    assert isinstance(outcome, Rejection), outcome
    return outcome


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


async def test_the_first_prompt_the_model_has_is_prepended_as_sentence_transformers_does(
    backend: SentenceEmbedder,
) -> None:
    text = "where is the station"
    job = EmbedJob(texts=[text], prompt_names=("search_query", "query"), prompt_optional=True)
    result = await embed(backend, job)
    expected = backend.model.encode([text], prompt_name="query")[0]
    assert cosine(result.vectors[0], expected) > 0.9999
    plain = (await embed(backend, EmbedJob(texts=[text]))).vectors[0]
    assert cosine(result.vectors[0], plain) < 0.9999  # the prompt did change the input
    assert result.token_counts[0] > (await embed(backend, EmbedJob(texts=[text]))).token_counts[0]


async def test_a_missing_prompt_is_ignored_when_optional_and_a_400_otherwise(
    backend: SentenceEmbedder,
) -> None:
    plain = (await embed(backend, EmbedJob(texts=["x y"]))).vectors[0]
    optional = EmbedJob(texts=["x y"], prompt_names=("clustering",), prompt_optional=True)
    assert cosine((await embed(backend, optional)).vectors[0], plain) > 0.99999
    rejection = await refused(backend, EmbedJob(texts=["x y"], prompt_names=("clustering",)))
    assert rejection.status == 400 and rejection.param == "prompt_name"
    assert "query" in rejection.message


async def test_start_truncation_keeps_the_end_of_a_long_text(backend: SentenceEmbedder) -> None:
    body = backend.tokenize([LONG])[0]
    keep = backend.window.max_body
    start = await embed(backend, EmbedJob(texts=[LONG], truncate="start"))
    end = await embed(backend, EmbedJob(texts=[LONG], truncate="end"))
    assert start.truncated == [0] and end.truncated == [0]
    tail = (await embed(backend, EmbedJob(token_ids=[body[-keep:]]))).vectors[0]
    head = (await embed(backend, EmbedJob(token_ids=[body[:keep]]))).vectors[0]
    assert cosine(start.vectors[0], tail) > 0.9999
    assert cosine(end.vectors[0], head) > 0.9999
    assert cosine(start.vectors[0], end.vectors[0]) < 0.999


async def test_the_jobs_truncate_overrides_the_models_setting(backend: SentenceEmbedder) -> None:
    rejection = await refused(backend, EmbedJob(texts=[LONG], truncate="refuse"))
    assert rejection.status == 400 and rejection.code == "context_length_exceeded"
    strict = await embed(backend, EmbedJob(texts=[LONG], truncate="end"), truncate=False)
    assert strict.truncated == [0]
    assert (await refused(backend, EmbedJob(texts=[LONG]), truncate=False)).status == 400


async def test_normalize_false_answers_the_models_own_output(backend: SentenceEmbedder) -> None:
    texts = ["one small text", "and another"]
    raw = await embed(backend, EmbedJob(texts=texts, normalize=False))
    expected = backend.model.encode(texts, normalize_embeddings=False)
    np.testing.assert_allclose(raw.vectors, expected, atol=1e-5)
    unit = await embed(backend, EmbedJob(texts=texts))
    np.testing.assert_allclose(np.linalg.norm(unit.vectors, axis=1), 1.0, rtol=1e-5)
