"""Documents into query-chunk pairs and back, with a fake scorer and no Ray."""

from __future__ import annotations

import numpy as np
import pytest

from deployments.config import RerankModelConfig
from deployments.core.batching.batch_budget import BatchBudget
from deployments.core.protocol import Rejection, RerankJob, RerankResult
from deployments.core.relevance import to_relevance
from deployments.replicas.batched.batched_jobs import Dropped, JobState, run_jobs
from deployments.replicas.batched.rerank_task import PairItem, RerankTask


class WordScorer:
    """One token per word; a pair scores the number of query words in the chunk."""

    score_kind = "logit"
    max_tokens = 12
    max_query_tokens = 4

    def doc_room(self, query_tokens: int) -> int:
        return self.max_tokens - 2 - query_tokens

    def pair_tokens(self, query_tokens: int, doc_tokens: int) -> int:
        return query_tokens + doc_tokens + 2

    def __init__(self) -> None:
        self._vocab: dict[str, int] = {}

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        # A vocabulary, not hash(): string hashes change per process and could collide.
        return [[self._vocab.setdefault(w, len(self._vocab)) for w in t.split()] for t in texts]

    def score(self, pairs: list[tuple[list[int], list[int]]]) -> np.ndarray:
        return np.array([len(set(q) & set(d)) for q, d in pairs], dtype=np.float32)


def config(**overrides: object) -> RerankModelConfig:
    return RerankModelConfig.model_validate(
        {"name": "r", "source": "x", "backend": "cross-encoder", "chunk_overlap_tokens": 2}
        | overrides
    )


async def rerank(job: RerankJob, cfg: RerankModelConfig | None = None, drop: str | None = None):
    scorer = WordScorer()
    seen: list[PairItem] = []

    async def run_item(item: PairItem) -> float | Dropped:
        seen.append(item)
        if drop is not None:
            return Dropped(drop)
        return float(scorer.score([(item.query, item.doc)])[0])

    task = RerankTask(scorer, cfg or config())  # type: ignore[arg-type]
    [outcome] = await run_jobs(task, [job], [JobState("r1", None)], BatchBudget(8, 64), run_item)
    return outcome, seen


FILLER = " ".join(f"w{i}" for i in range(40))


async def test_long_document_is_scored_by_its_best_chunk() -> None:
    job = RerankJob("paris france", ["paris is in france", f"{FILLER} paris france {FILLER}"])
    outcome, seen = await rerank(job)
    assert isinstance(outcome, RerankResult)
    assert outcome.chunks[0] == 1 and outcome.chunks[1] > 5
    assert list(outcome.raw) == [2.0, 2.0]  # the relevant passage is found mid-document
    assert np.allclose(outcome.relevance, to_relevance(outcome.raw, "logit"))
    assert all(len(item.query) + len(item.doc) + 2 <= WordScorer.max_tokens for item in seen)
    assert outcome.token_counts == [seen[0].tokens, sum(i.tokens for i in seen[1:])]


async def test_mean_and_first_chunk_only() -> None:
    doc = f"{FILLER} paris france"
    mean, _ = await rerank(RerankJob("paris france", [doc]), config(doc_score="mean"))
    assert 0 < mean.raw[0] < 2
    first, seen = await rerank(RerankJob("paris france", [doc], first_chunk_only=True))
    assert first.raw[0] == 0 and len(seen) == 1 and first.truncated == [0]


async def test_max_tokens_per_doc_caps_and_reports() -> None:
    job = RerankJob("paris", [f"{FILLER} paris", "paris"], max_tokens_per_doc=10)
    outcome, _ = await rerank(job)
    assert list(outcome.raw) == [0.0, 1.0] and outcome.truncated == [0]
    # A request cannot raise the server's cap.
    capped, _ = await rerank(
        RerankJob("paris", [f"{FILLER} paris"], max_tokens_per_doc=10**6),
        config(max_tokens_per_doc=10),
    )
    assert capped.raw[0] == 0


async def test_long_query_is_cut_to_leave_room() -> None:
    outcome, seen = await rerank(RerankJob(FILLER, ["w1 w2"]))
    assert outcome.raw[0] == 2 and all(len(item.query) == 4 for item in seen)


@pytest.mark.parametrize(("reason", "status"), [("expired", 504), ("client_gone", 499)])
async def test_dropped_pairs_reject_the_job(reason: str, status: int) -> None:
    outcome, _ = await rerank(RerankJob("q", ["a", "b"]), drop=reason)
    assert isinstance(outcome, Rejection) and outcome.status == status


async def test_expired_job_sends_nothing() -> None:
    task = RerankTask(WordScorer(), config())  # type: ignore[arg-type]

    async def run_item(item: PairItem) -> float:
        raise AssertionError("nothing should run")

    [outcome] = await run_jobs(
        task, [RerankJob("q", ["a"])], [JobState("r", 0.0)], BatchBudget(8, 64), run_item
    )
    assert isinstance(outcome, Rejection) and outcome.status == 504


async def test_over_max_chunk_passes_is_refused_before_scoring() -> None:
    # 9 tokens of room beside the query, 2 shared: FILLER (40 words) is 6 chunks.
    job = RerankJob("paris", [FILLER, "paris"], documents_param="texts")
    outcome, seen = await rerank(job, config(max_chunk_passes=6))
    assert isinstance(outcome, Rejection) and not seen
    assert outcome.status == 413 and outcome.param == "texts"
    assert outcome.code == "payload_too_large"
    assert "needs 7 chunk passes" in outcome.message and "max_chunk_passes" in outcome.message
    allowed, _ = await rerank(job, config(max_chunk_passes=7))
    assert isinstance(allowed, RerankResult) and sum(allowed.chunks) == 7
    # Truncation scores one chunk a document, so it fits.
    first = RerankJob("paris", [FILLER, "paris"], first_chunk_only=True)
    truncated, seen = await rerank(first, config(max_chunk_passes=2))
    assert isinstance(truncated, RerankResult) and len(seen) == 2


def test_a_jobs_size_is_its_chunk_passes() -> None:
    assert len(RerankJob("q", ["a", "b"])) == 2
    assert len(RerankJob("q", ["a", "b"], chunk_passes=30)) == 30
