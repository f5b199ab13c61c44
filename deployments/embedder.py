"""The embedding model deployment: items from every concurrent request, batched by class.

The ingress sends a list of jobs of one priority class (one job per HTTP request) in one
call. Each job's inputs become items that go through that class's own `@serve.batch`
queue, so a batch mixes items of many requests, capped by count and by padded tokens, with
the class's own wait. Before its forward pass a batch takes a turn at the priority gate:
the model runs one batch at a time, the most urgent waiting one first, with ageing so the
batch class always moves. Items whose job ran out of time or lost its client are dropped
at that moment, so the model never computes them. The forward pass runs on a dedicated
thread so the replica's event loop keeps accepting and batching while the model works.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from ray import serve

from deployments.backends.sentence_embedder import SentenceEmbedder
from deployments.backends.sources import resolve_model_source
from deployments.config import EmbeddingModelConfig, ModelBatching
from deployments.core.batch_budget import BatchBudget, budget_size
from deployments.core.jobs import EmbedJob, EmbedOutcome
from deployments.core.priority import ALL_PRIORITIES, Priority
from deployments.core.priority_gate import PriorityGate
from deployments.device import assigned_device, torch_dtype
from deployments.embedding_worker import Dropped, EmbeddingWorker, Item, JobState, split_live

logger = logging.getLogger("ray.serve")

WARMUP_TEXTS = ["Tributary warms up.", "A longer sentence warms up the padded path too."]


class Embedder:
    def __init__(self, model: dict[str, Any]) -> None:
        config = EmbeddingModelConfig.model_validate(model)
        self.config = config
        threads = config.torch_threads or torch.get_num_threads()
        # One worker: the model runs one batch at a time. Torch's thread count is
        # per OS thread, so it is set inside the worker, not here.
        self._executor = ThreadPoolExecutor(
            max_workers=1, initializer=torch.set_num_threads, initargs=(threads,)
        )
        device = assigned_device()
        self.backend = SentenceEmbedder(
            resolve_model_source(config.source), device, torch_dtype(config.dtype, device)
        )
        self.worker = EmbeddingWorker(self.backend, config)
        self._budgets = {p: BatchBudget(1, 1) for p in ALL_PRIORITIES}
        self._runners = {
            Priority.REALTIME: self._batch_realtime,
            Priority.NORMAL: self._batch_normal,
            Priority.BATCH: self._batch_batch,
        }
        self.gate = PriorityGate({})
        self.reconfigure(config.batching.model_dump())
        self._live: dict[str, JobState] = {}
        self._counts = {"batches": 0, "items": 0, "expired_items": 0, "client_gone_items": 0}
        self._class_counts = {p: {"batches": 0, "items": 0} for p in ALL_PRIORITIES}
        self._recent_drops: deque[dict[str, str]] = deque(maxlen=256)
        # A real batch before the replica reports ready, so the first client does not
        # pay for lazy initialisation.
        warm = [self.backend.window.wrap(ids)[0] for ids in self.backend.tokenize(WARMUP_TEXTS)]
        self._executor.submit(self.backend.embed, warm).result()
        self._warm = True
        logger.info("model %s ready on %s, %d torch threads", config.name, device, threads)

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        batching = ModelBatching.model_validate(user_config)
        self.batching = batching
        for priority in ALL_PRIORITIES:
            settings = batching.of(priority.label)  # type: ignore[arg-type]
            budget = self._budgets[priority]
            budget.max_batch_size = settings.max_batch_size
            budget.max_batch_tokens = settings.max_batch_tokens
            self._runners[priority].set_max_batch_size(settings.max_batch_size)
            self._runners[priority].set_batch_wait_timeout_s(settings.batch_wait_timeout_s)
        self.gate.set_aged_after_s(
            {p: batching.of(p.label).aged_after_s for p in ALL_PRIORITIES}  # type: ignore[arg-type]
        )

    def check_health(self) -> None:
        if not self._warm:
            raise RuntimeError("model not warmed up")

    def info(self) -> dict[str, Any]:
        batches, items = self._counts["batches"], self._counts["items"]
        return {
            "pid": os.getpid(),
            "batching": self.batching.model_dump(),
            "dimension": self.backend.dimension,
            "max_tokens": self.backend.window.max_tokens,
            **self._counts,
            "mean_batch_size": items / batches if batches else 0.0,
            "classes": {
                p.label: {
                    **counts,
                    "mean_batch_size": counts["items"] / counts["batches"]
                    if counts["batches"]
                    else 0.0,
                }
                for p, counts in self._class_counts.items()
            },
            "gate": vars(self.gate.stats),
            "jobs_in_progress": len(self._live),
            "recent_drops": list(self._recent_drops),
        }

    async def embed_jobs(
        self, priority: str, jobs: list[EmbedJob], time_left_s: list[float | None]
    ) -> list[EmbedOutcome]:
        klass = Priority.parse(priority)
        now = time.monotonic()
        states = [
            JobState(job.request_id, None if left is None else now + left)
            for job, left in zip(jobs, time_left_s, strict=True)
        ]
        for job, state in zip(jobs, states, strict=True):
            self._live[job.job_id] = state
        try:
            return await self.worker.run_jobs(
                jobs, states, self._budgets[klass], self._runners[klass]
            )
        except asyncio.CancelledError:
            # Serve cancels the call when every client of it went away.
            for state in states:
                state.cancelled = True
            raise
        finally:
            for job in jobs:
                self._live.pop(job.job_id, None)

    def forget(self, job_ids: list[str]) -> int:
        """Jobs whose client went away: their items are dropped before the model runs."""
        found = 0
        for job_id in job_ids:
            state = self._live.get(job_id)
            if state is not None:
                state.cancelled = True
                found += 1
        return found

    async def _forward(self, priority: Priority, items: list[Item]) -> list[Any]:
        async with self.gate.turn(priority):
            live, marks = split_live(items, time.monotonic())
            self._note_drops(marks, items)
            vectors: list[np.ndarray] = []
            if live:
                loop = asyncio.get_running_loop()
                vectors = list(
                    await loop.run_in_executor(
                        self._executor, self.backend.embed, [item.ids for item in live]
                    )
                )
                self._count(priority, len(live))
        computed = iter(vectors)
        return [mark if mark is not None else next(computed) for mark in marks]

    def _count(self, priority: Priority, items: int) -> None:
        self._counts["batches"] += 1
        self._counts["items"] += items
        self._class_counts[priority]["batches"] += 1
        self._class_counts[priority]["items"] += items

    def _note_drops(self, marks: list[Dropped | None], items: list[Item]) -> None:
        noted: set[int] = set()
        for mark, item in zip(marks, items, strict=True):
            if mark is None:
                continue
            self._counts[f"{mark.reason}_items"] += 1
            if id(item.state) not in noted:
                noted.add(id(item.state))
                self._recent_drops.append(
                    {"request_id": item.state.request_id, "reason": mark.reason}
                )

    # One queue per class, each with its own size, wait and token budget (reconfigure
    # sets them); a class's batch size is measured by its items' budget.
    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.002, batch_size_fn=budget_size)
    async def _batch_realtime(self, items: list[Item]) -> list[Any]:
        return await self._forward(Priority.REALTIME, items)

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.01, batch_size_fn=budget_size)
    async def _batch_normal(self, items: list[Item]) -> list[Any]:
        return await self._forward(Priority.NORMAL, items)

    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.05, batch_size_fn=budget_size)
    async def _batch_batch(self, items: list[Item]) -> list[Any]:
        return await self._forward(Priority.BATCH, items)
