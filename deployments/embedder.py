"""The embedding model deployment: items from every concurrent request, batched.

The ingress sends a list of jobs (one per HTTP request) in one call. Each job's inputs
become items; every item goes through one `@serve.batch` queue, so a batch mixes items of
many requests, capped by count and by padded tokens. The forward pass runs on a dedicated
thread so the replica's event loop keeps accepting and batching while the model works.
"""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from ray import serve

from deployments.backends.sentence_embedder import SentenceEmbedder
from deployments.backends.sources import resolve_model_source
from deployments.config import BatchSettings, EmbeddingModelConfig
from deployments.core.batch_budget import BatchBudget, budget_size
from deployments.core.jobs import EmbedJob, EmbedOutcome
from deployments.device import assigned_device, torch_dtype
from deployments.embedding_worker import EmbeddingWorker, Item

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
        self.worker = EmbeddingWorker(self.backend, config, BatchBudget(1, 1))
        self.reconfigure(config.batching.model_dump())
        self._batches = 0
        self._items = 0
        # A real batch before the replica reports ready, so the first client does not
        # pay for lazy initialisation.
        warm = [self.backend.window.wrap(ids)[0] for ids in self.backend.tokenize(WARMUP_TEXTS)]
        self._executor.submit(self.backend.embed, warm).result()
        self._warm = True
        logger.info("model %s ready on %s, %d torch threads", config.name, device, threads)

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        settings = BatchSettings.model_validate(user_config)
        self.batching = settings
        self.worker.budget.max_batch_size = settings.max_batch_size
        self.worker.budget.max_batch_tokens = settings.max_batch_tokens
        self._run_batch.set_max_batch_size(settings.max_batch_size)
        self._run_batch.set_batch_wait_timeout_s(settings.batch_wait_timeout_s)

    def check_health(self) -> None:
        if not self._warm:
            raise RuntimeError("model not warmed up")

    def info(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "batching": self.batching.model_dump(),
            "dimension": self.backend.dimension,
            "max_tokens": self.backend.window.max_tokens,
            "batches": self._batches,
            "items": self._items,
            "mean_batch_size": self._items / self._batches if self._batches else 0.0,
        }

    async def embed_jobs(self, jobs: list[EmbedJob]) -> list[EmbedOutcome]:
        return await self.worker.run_jobs(jobs, self._run_batch)

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.01, batch_size_fn=budget_size)
    async def _run_batch(self, items: list[Item]) -> list[np.ndarray]:
        loop = asyncio.get_running_loop()
        vectors = await loop.run_in_executor(
            self._executor, self.backend.embed, [item.ids for item in items]
        )
        self._batches += 1
        self._items += len(items)
        return list(vectors)
