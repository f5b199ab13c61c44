"""Turn rerank jobs into query-chunk pair items, and pair scores back into outcomes.

Ray-free, like `embedding_worker`: the deployment passes its `@serve.batch` method of the
call's class as `run_item`. Every document becomes one item per chunk (one for a document
that fits the window), so a request with 200 documents is 200 or more items, batched with
every other request's items of the same class.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from deployments.backends.pair_scorer import PairScorer
from deployments.config import RerankModelConfig
from deployments.core.batch_budget import BatchBudget
from deployments.core.chunking import chunk_spans, combine_scores
from deployments.core.protocol import (
    Rejection,
    RerankJob,
    RerankOutcome,
    RerankResult,
    deadline_rejection,
)
from deployments.core.relevance import to_relevance
from deployments.errors import too_many_passes
from deployments.replicas.embedding_worker import EXPIRED, Dropped, JobState, failed_outcome


@dataclass(eq=False)
class PairItem:
    """One query-chunk pair of one request, as the batcher sees it."""

    query: list[int]
    doc: list[int]
    tokens: int  # padded length this pair costs in a batch
    budget: BatchBudget
    state: JobState


@dataclass
class _Plan:
    items: list[PairItem]
    chunks: list[int]  # per document
    tokens: list[int]  # per document
    truncated: list[int]
    refused: Rejection | None = None  # over max_chunk_passes: nothing is scored


RunPair = Callable[[PairItem], Awaitable[float | Dropped]]


class RerankWorker:
    def __init__(self, backend: PairScorer, config: RerankModelConfig) -> None:
        self.backend = backend
        self.config = config

    async def run_jobs(
        self,
        jobs: list[RerankJob],
        states: list[JobState],
        budget: BatchBudget,
        run_item: RunPair,
    ) -> list[RerankOutcome]:
        now = time.monotonic()
        plans = self._plan(jobs, states, budget)
        expired = [state.drop_reason(now) == EXPIRED for state in states]
        todo = [
            item
            for plan, gone in zip(plans, expired, strict=True)
            if not gone
            for item in plan.items
        ]
        results = await asyncio.gather(*(run_item(item) for item in todo), return_exceptions=True)
        outcomes: list[RerankOutcome] = []
        start = 0
        for plan, gone in zip(plans, expired, strict=True):
            if gone:
                outcomes.append(deadline_rejection())
                continue
            if plan.refused is not None:
                outcomes.append(plan.refused)
                continue
            mine = results[start : start + len(plan.items)]
            start += len(plan.items)
            outcomes.append(self._collect(plan, mine))
        return outcomes

    def _plan(
        self, jobs: list[RerankJob], states: list[JobState], budget: BatchBudget
    ) -> list[_Plan]:
        # One tokenizer call for every query and document of every job.
        texts = [text for job in jobs for text in (job.query, *job.documents)]
        tokenized = iter(self.backend.tokenize(texts))
        plans: list[_Plan] = []
        for job, state in zip(jobs, states, strict=True):
            query = next(tokenized)[: self.backend.max_query_tokens]
            docs = [next(tokenized) for _ in job.documents]
            plans.append(self._plan_job(job, state, budget, query, docs))
        return plans

    def _plan_job(
        self,
        job: RerankJob,
        state: JobState,
        budget: BatchBudget,
        query: list[int],
        docs: list[list[int]],
    ) -> _Plan:
        cap = self.config.max_tokens_per_doc
        if job.max_tokens_per_doc is not None:
            cap = min(cap, job.max_tokens_per_doc)
        room = max(self.backend.doc_room(len(query)), 1)
        plan = _Plan([], [], [], [])
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
            refusal = Rejection(413, error.message, param=error.param, code=error.code)
            return _Plan([], [], [], [], refused=refusal)
        return plan

    def _collect(self, plan: _Plan, results: list[Any]) -> RerankOutcome:
        failed: Rejection | None = failed_outcome(results, "rerank")
        if failed is not None:
            return failed
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
