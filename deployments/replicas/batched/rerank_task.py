"""Rerank as a plug-in of the batched-replica lifecycle (`batched_jobs`).

Every document becomes one query-chunk pair item per chunk (one for a document that fits
the window), so a request with 200 documents is 200 or more items, batched with every other
request's items of the same class. The forward pass scores pairs (a cross-encoder's logit
or a bi-encoder's cosine); a document's chunk scores are combined back into its score.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from deployments.backends.encoders.pair_scorer import PairScorer
from deployments.config import RerankModelConfig
from deployments.core.batching.batch_budget import BatchBudget
from deployments.core.chunking import chunk_spans, combine_scores
from deployments.core.protocol import Rejection, RerankJob, RerankResult
from deployments.core.relevance import to_relevance
from deployments.errors import too_many_passes
from deployments.replicas.batched.batched_jobs import JobState


@dataclass(eq=False)
class PairItem:
    """One query-chunk pair of one request, as the batcher sees it."""

    query: list[int]
    doc: list[int]
    tokens: int  # padded length this pair costs in a batch
    budget: BatchBudget
    state: JobState


@dataclass
class RerankPlan:
    items: list[PairItem]
    chunks: list[int]  # per document
    tokens: list[int]  # per document
    truncated: list[int]


class RerankTask:
    what = "rerank"

    def __init__(self, backend: PairScorer, config: RerankModelConfig) -> None:
        self.backend = backend
        self.config = config

    def plan(
        self, jobs: Sequence[RerankJob], states: Sequence[JobState], budget: BatchBudget
    ) -> list[RerankPlan | Rejection]:
        # One tokenizer call for every query and document of every job.
        texts = [text for job in jobs for text in (job.query, *job.documents)]
        tokenized = iter(self.backend.tokenize(texts))
        plans: list[RerankPlan | Rejection] = []
        for job, state in zip(jobs, states, strict=True):
            query = next(tokenized)[: self.backend.max_query_tokens]
            docs = [next(tokenized) for _ in job.documents]
            plans.append(self._plan_job(job, state, budget, query, docs))
        return plans

    def compute(self, items: list[PairItem]) -> list[float]:
        return [float(s) for s in self.backend.score([(i.query, i.doc) for i in items])]

    def collect(self, plan: RerankPlan, results: list[float]) -> RerankResult:
        raw: list[float] = []
        start = 0
        for chunks in plan.chunks:
            raw.append(combine_scores(results[start : start + chunks], self.config.doc_score))
            start += chunks
        raw_scores = np.asarray(raw, dtype=np.float32)
        return RerankResult(
            raw=raw_scores,
            relevance=to_relevance(raw_scores, self.backend.score_kind),
            token_counts=plan.tokens,
            chunks=plan.chunks,
            truncated=sorted(plan.truncated),
        )

    def _plan_job(
        self,
        job: RerankJob,
        state: JobState,
        budget: BatchBudget,
        query: list[int],
        docs: list[list[int]],
    ) -> RerankPlan | Rejection:
        cap = self.config.max_tokens_per_doc
        if job.max_tokens_per_doc is not None:
            cap = min(cap, job.max_tokens_per_doc)
        room = max(self.backend.doc_room(len(query)), 1)
        plan = RerankPlan([], [], [], [])
        for index, ids in enumerate(docs):
            if len(ids) > cap:
                ids = ids[:cap]
                plan.truncated.append(index)
            spans = chunk_spans(len(ids), room, self.config.chunk_overlap_tokens)
            if job.first_chunk_only:
                if len(spans) > 1 and index not in plan.truncated:
                    plan.truncated.append(index)
                spans = spans[:1]
            tokens = 0
            for begin, end in spans:
                cost = self.backend.pair_tokens(len(query), end - begin)
                tokens += cost
                plan.items.append(PairItem(query, ids[begin:end], cost, budget, state))
            plan.chunks.append(len(spans))
            plan.tokens.append(tokens)
        if len(plan.items) > self.config.max_chunk_passes:
            # The ingress only estimated from text lengths; this is the tokenizer's count.
            error = too_many_passes(
                len(plan.items),
                self.config.name,
                self.config.max_chunk_passes,
                job.documents_param,
                estimated=False,
            )
            return Rejection(413, error.message, param=error.param, code=error.code)
        return plan
