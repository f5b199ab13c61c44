"""Embeddings as a plug-in of the batched-replica lifecycle (`batched_jobs`).

A job's inputs (texts, tokenized here in one call for the whole call's jobs, or token ids)
become one item each, fitted to the model's window; the forward pass embeds a batch of
them; a job's vectors are stacked back in input order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from deployments.backends.sentence_embedder import SentenceEmbedder
from deployments.config import EmbeddingModelConfig
from deployments.core.batch_budget import BatchBudget
from deployments.core.protocol import EmbedJob, EmbedResult, Rejection
from deployments.replicas.batched_jobs import JobState


@dataclass(eq=False)
class Item:
    """One input of one request, as the batcher sees it."""

    ids: list[int]
    budget: BatchBudget
    state: JobState

    @property
    def tokens(self) -> int:
        return len(self.ids)


@dataclass
class EmbedPlan:
    items: list[Item]
    truncated: list[int] = field(default_factory=list)  # indices of inputs that were cut


class EmbedTask:
    what = "embedding"

    def __init__(self, backend: SentenceEmbedder, config: EmbeddingModelConfig) -> None:
        self.backend = backend
        self.config = config

    def plan(
        self, jobs: Sequence[EmbedJob], states: Sequence[JobState], budget: BatchBudget
    ) -> list[EmbedPlan | Rejection]:
        # One tokenizer call for every text of every job: the fast tokenizer batches too.
        texts = [text for job in jobs if job.texts is not None for text in job.texts]
        tokenized = iter(self.backend.tokenize(texts))
        plans: list[EmbedPlan | Rejection] = []
        for job, state in zip(jobs, states, strict=True):
            if job.texts is not None:
                bodies = [next(tokenized) for _ in job.texts]
            else:
                bodies = job.token_ids or []
                bad = self._first_bad_token_id(bodies)
                if bad is not None:
                    plans.append(bad)
                    continue
            plans.append(self._fit(bodies, budget, state))
        return plans

    def compute(self, items: list[Item]) -> list[np.ndarray]:
        return list(self.backend.embed([item.ids for item in items]))

    def collect(self, plan: EmbedPlan, results: list[np.ndarray]) -> EmbedResult:
        return EmbedResult(
            vectors=np.stack(results),
            token_counts=[item.tokens for item in plan.items],
            truncated=plan.truncated,
        )

    def _first_bad_token_id(self, bodies: list[list[int]]) -> Rejection | None:
        vocab = self.backend.vocab_size
        for index, ids in enumerate(bodies):
            for token in ids:
                if not 0 <= token < vocab:
                    return Rejection(
                        400,
                        f"Input {index} has token id {token}, outside this model's "
                        f"vocabulary [0, {vocab}).",
                        param="input",
                        code="invalid_token_id",
                    )
        return None

    def _fit(
        self, bodies: list[list[int]], budget: BatchBudget, state: JobState
    ) -> EmbedPlan | Rejection:
        window = self.backend.window
        items: list[Item] = []
        truncated: list[int] = []
        for index, body in enumerate(bodies):
            ids, cut = window.wrap(body)
            if cut and not self.config.truncate:
                return Rejection(
                    400,
                    f"Input {index} has {window.full_length(body)} tokens; model "
                    f"'{self.config.name}' accepts at most {window.max_tokens}.",
                    param="input",
                    code="context_length_exceeded",
                )
            if cut:
                truncated.append(index)
            items.append(Item(ids, budget, state))
        return EmbedPlan(items, truncated)
