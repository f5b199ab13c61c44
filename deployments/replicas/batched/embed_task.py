"""Embeddings as a plug-in of the batched-replica lifecycle (`batched_jobs`).

A job's inputs (texts, tokenized here in one call for the whole call's jobs, or token ids)
become one item each, fitted to the model's window; the forward pass embeds a batch of
them; a job's vectors are stacked back in input order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from deployments.backends.encoders.sentence_embedder import SentenceEmbedder
from deployments.config import EmbeddingModelConfig
from deployments.core.batching.batch_budget import BatchBudget
from deployments.core.protocol import EmbedJob, EmbedResult, Rejection
from deployments.replicas.batched.batched_jobs import JobState


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
    normalize: bool = True


class EmbedTask:
    what = "embedding"

    def __init__(self, backend: SentenceEmbedder, config: EmbeddingModelConfig) -> None:
        self.backend = backend
        self.config = config

    def plan(
        self, jobs: Sequence[EmbedJob], states: Sequence[JobState], budget: BatchBudget
    ) -> list[EmbedPlan | Rejection]:
        prompted = [self._prompted(job) for job in jobs]
        # One tokenizer call for every text of every job: the fast tokenizer batches too.
        every = [text for texts in prompted if isinstance(texts, list) for text in texts]
        tokenized = iter(self.backend.tokenize(every))
        plans: list[EmbedPlan | Rejection] = []
        for job, texts, state in zip(jobs, prompted, states, strict=True):
            if isinstance(texts, Rejection):
                plans.append(texts)
                continue
            if texts is not None:
                bodies = [next(tokenized) for _ in texts]
            else:
                bodies = job.token_ids or []
                bad = self._first_bad_token_id(bodies)
                if bad is not None:
                    plans.append(bad)
                    continue
            plans.append(self._fit(job, bodies, budget, state))
        return plans

    def compute(self, items: list[Item]) -> list[np.ndarray]:
        # Raw: a batch mixes jobs, and a job may want the model's own output (collect).
        return list(self.backend.embed([item.ids for item in items], normalize=False))

    def collect(self, plan: EmbedPlan, results: list[np.ndarray]) -> EmbedResult:
        vectors = np.stack(results)
        if plan.normalize:
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors = vectors / np.maximum(norms, 1e-12)
        return EmbedResult(
            vectors=vectors,
            token_counts=[item.tokens for item in plan.items],
            truncated=plan.truncated,
        )

    def _prompted(self, job: EmbedJob) -> list[str] | Rejection | None:
        """The job's texts with its prompt in front, as sentence-transformers' `encode`
        prepends one; None for a job of token ids."""
        if job.texts is None or not job.prompt_names:
            return job.texts
        prompts = self.backend.prompts
        prompt = next((prompts[name] for name in job.prompt_names if name in prompts), None)
        if prompt is None:
            if job.prompt_optional:
                return job.texts
            known = ", ".join(sorted(prompts)) or "none"
            return Rejection(
                400,
                f"Model '{self.config.name}' has no prompt named '{job.prompt_names[0]}'; "
                f"its prompts: {known}.",
                param="prompt_name",
            )
        return [prompt + text for text in job.texts]

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
        self, job: EmbedJob, bodies: list[list[int]], budget: BatchBudget, state: JobState
    ) -> EmbedPlan | Rejection:
        window = self.backend.window
        refuse = job.truncate == "refuse" or (job.truncate is None and not self.config.truncate)
        items: list[Item] = []
        truncated: list[int] = []
        for index, body in enumerate(bodies):
            ids, cut = window.wrap(body, keep_end=job.truncate == "start")
            if cut and refuse:
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
        return EmbedPlan(items, truncated, normalize=job.normalize)
