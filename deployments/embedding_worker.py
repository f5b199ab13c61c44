"""Turn embedding jobs into model items and items' results back into outcomes.

Ray-free, so it can be tested with a plain coroutine standing in for Serve's batcher: the
deployment passes its `@serve.batch` method as `run_item`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from deployments.backends.sentence_embedder import SentenceEmbedder
from deployments.config import EmbeddingModelConfig
from deployments.core.batch_budget import BatchBudget
from deployments.core.jobs import EmbedJob, EmbedOutcome, EmbedRejection, EmbedResult
from deployments.errors import MODEL_FAILED_MESSAGE

logger = logging.getLogger("ray.serve")


@dataclass(eq=False)
class Item:
    """One input of one request, as the batcher sees it."""

    ids: list[int]
    budget: BatchBudget

    @property
    def tokens(self) -> int:
        return len(self.ids)


@dataclass
class _Prepared:
    inputs: list[list[int]]
    truncated: list[int]


RunItem = Callable[[Item], Awaitable[np.ndarray]]


class EmbeddingWorker:
    def __init__(
        self, backend: SentenceEmbedder, config: EmbeddingModelConfig, budget: BatchBudget
    ) -> None:
        self.backend = backend
        self.config = config
        self.budget = budget

    async def run_jobs(self, jobs: list[EmbedJob], run_item: RunItem) -> list[EmbedOutcome]:
        prepared = self._prepare(jobs)
        item_lists: list[list[Item]] = [
            [Item(ids, self.budget) for ids in p.inputs] if isinstance(p, _Prepared) else []
            for p in prepared
        ]
        results = await asyncio.gather(
            *(run_item(item) for items in item_lists for item in items),
            return_exceptions=True,
        )
        outcomes: list[EmbedOutcome] = []
        start = 0
        for p, items in zip(prepared, item_lists, strict=True):
            if isinstance(p, EmbedRejection):
                outcomes.append(p)
                continue
            mine = results[start : start + len(items)]
            start += len(items)
            outcomes.append(self._collect(p, mine))
        return outcomes

    def _prepare(self, jobs: list[EmbedJob]) -> list[_Prepared | EmbedRejection]:
        # One tokenizer call for every text of every job: the fast tokenizer batches too.
        texts = [text for job in jobs if job.texts is not None for text in job.texts]
        tokenized = iter(self.backend.tokenize(texts))
        prepared: list[_Prepared | EmbedRejection] = []
        for job in jobs:
            if job.texts is not None:
                bodies = [next(tokenized) for _ in job.texts]
            else:
                bodies = job.token_ids or []
                bad = self._first_bad_token_id(bodies)
                if bad is not None:
                    prepared.append(bad)
                    continue
            prepared.append(self._fit(bodies))
        return prepared

    def _first_bad_token_id(self, bodies: list[list[int]]) -> EmbedRejection | None:
        vocab = self.backend.vocab_size
        for index, ids in enumerate(bodies):
            for token in ids:
                if not 0 <= token < vocab:
                    return EmbedRejection(
                        400,
                        f"Input {index} has token id {token}, outside this model's "
                        f"vocabulary [0, {vocab}).",
                        param="input",
                        code="invalid_token_id",
                    )
        return None

    def _fit(self, bodies: list[list[int]]) -> _Prepared | EmbedRejection:
        window = self.backend.window
        inputs: list[list[int]] = []
        truncated: list[int] = []
        for index, body in enumerate(bodies):
            ids, cut = window.wrap(body)
            if cut and not self.config.truncate:
                return EmbedRejection(
                    400,
                    f"Input {index} has {window.full_length(body)} tokens; model "
                    f"'{self.config.name}' accepts at most {window.max_tokens}.",
                    param="input",
                    code="context_length_exceeded",
                )
            if cut:
                truncated.append(index)
            inputs.append(ids)
        return _Prepared(inputs, truncated)

    def _collect(self, prepared: _Prepared, results: list[Any]) -> EmbedOutcome:
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is not None:
            logger.error("embedding batch failed: %r", failure)
            return EmbedRejection(
                500,
                MODEL_FAILED_MESSAGE,
                code="model_error",
                error_type="server_error",
            )
        return EmbedResult(
            vectors=np.stack(results),
            token_counts=[len(ids) for ids in prepared.inputs],
            truncated=prepared.truncated,
        )
