"""Turn embedding jobs into model items and items' results back into outcomes.

Ray-free, so it can be tested with a plain coroutine standing in for Serve's batcher: the
deployment passes the `@serve.batch` method of the call's priority class as `run_item`.
Every item points at its job's `JobState`; just before a forward pass the deployment
drops the items whose job ran out of time or whose client went away (`split_live`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from deployments.backends.sentence_embedder import SentenceEmbedder
from deployments.config import EmbeddingModelConfig
from deployments.core.batch_budget import BatchBudget
from deployments.core.protocol import (
    EmbedJob,
    EmbedOutcome,
    EmbedResult,
    Rejection,
    deadline_rejection,
)
from deployments.errors import MODEL_FAILED_MESSAGE

logger = logging.getLogger("ray.serve")

EXPIRED = "expired"
CLIENT_GONE = "client_gone"


@dataclass(eq=False)
class JobState:
    """What every item of a job needs to know about it at the last moment."""

    request_id: str
    deadline: float | None  # time.monotonic() clock of this process
    cancelled: bool = False
    # When the job reached this replica: its items' queue wait is measured from here.
    arrived: float = field(default_factory=time.monotonic)

    def drop_reason(self, now: float) -> str | None:
        # Expiry first: the ingress also cancels a call whose only job ran out of time.
        if self.deadline is not None and now >= self.deadline:
            return EXPIRED
        if self.cancelled:
            return CLIENT_GONE
        return None


@dataclass(frozen=True)
class Dropped:
    """The result of an item that was never computed."""

    reason: str


@dataclass(eq=False)
class Item:
    """One input of one request, as the batcher sees it."""

    ids: list[int]
    budget: BatchBudget
    state: JobState

    @property
    def tokens(self) -> int:
        return len(self.ids)


def split_live(items: Sequence[Item], now: float) -> tuple[list[Item], list[Dropped | None]]:
    """The items still worth computing, and per item its Dropped marker or None."""
    marks = [Dropped(reason) if (reason := item.state.drop_reason(now)) else None for item in items]
    return [item for item, mark in zip(items, marks, strict=True) if mark is None], marks


@dataclass
class _Prepared:
    inputs: list[list[int]]
    truncated: list[int]


RunItem = Callable[[Item], Awaitable[np.ndarray | Dropped]]


class EmbeddingWorker:
    def __init__(self, backend: SentenceEmbedder, config: EmbeddingModelConfig) -> None:
        self.backend = backend
        self.config = config

    async def run_jobs(
        self,
        jobs: list[EmbedJob],
        states: list[JobState],
        budget: BatchBudget,
        run_item: RunItem,
    ) -> list[EmbedOutcome]:
        now = time.monotonic()
        prepared: list[_Prepared | Rejection] = [
            deadline_rejection() if state.drop_reason(now) == EXPIRED else p
            for p, state in zip(self._prepare(jobs), states, strict=True)
        ]
        item_lists: list[list[Item]] = [
            [Item(ids, budget, state) for ids in p.inputs] if isinstance(p, _Prepared) else []
            for p, state in zip(prepared, states, strict=True)
        ]
        results = await asyncio.gather(
            *(run_item(item) for items in item_lists for item in items),
            return_exceptions=True,
        )
        outcomes: list[EmbedOutcome] = []
        start = 0
        for p, items in zip(prepared, item_lists, strict=True):
            if isinstance(p, Rejection):
                outcomes.append(p)
                continue
            mine = results[start : start + len(items)]
            start += len(items)
            outcomes.append(self._collect(p, mine))
        return outcomes

    def _prepare(self, jobs: list[EmbedJob]) -> list[_Prepared | Rejection]:
        # One tokenizer call for every text of every job: the fast tokenizer batches too.
        texts = [text for job in jobs if job.texts is not None for text in job.texts]
        tokenized = iter(self.backend.tokenize(texts))
        prepared: list[_Prepared | Rejection] = []
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

    def _fit(self, bodies: list[list[int]]) -> _Prepared | Rejection:
        window = self.backend.window
        inputs: list[list[int]] = []
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
            inputs.append(ids)
        return _Prepared(inputs, truncated)

    def _collect(self, prepared: _Prepared, results: list[Any]) -> EmbedOutcome:
        failed = failed_outcome(results, "embedding")
        if failed is not None:
            return failed
        return EmbedResult(
            vectors=np.stack(results),
            token_counts=[len(ids) for ids in prepared.inputs],
            truncated=prepared.truncated,
        )


def failed_outcome(results: Sequence[Any], what: str) -> Rejection | None:
    """The answer for a job any of whose items was dropped or failed; None if all ran."""
    dropped = next((r for r in results if isinstance(r, Dropped)), None)
    if dropped is not None:
        if dropped.reason == EXPIRED:
            return deadline_rejection()
        # Nobody is listening; the status only has to be an error.
        return Rejection(499, "The client went away.", code="client_gone")
    failure = next((r for r in results if isinstance(r, BaseException)), None)
    if failure is not None:
        logger.error("%s batch failed: %r", what, failure)
        return Rejection(500, MODEL_FAILED_MESSAGE, code="model_error")
    return None
