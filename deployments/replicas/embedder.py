"""The embedding model deployment: items from every concurrent request, batched by class.

The ingress sends a list of jobs of one priority class (one job per HTTP request) in one
call. Each job's inputs become items that go through that class's own `@serve.batch`
queue, so a batch mixes items of many requests, capped by count and by padded tokens, with
the class's own wait. Before its forward pass a batch takes a turn at the priority gate:
the model runs one batch at a time, the most urgent waiting one first, with ageing so the
batch class always moves. Items whose job ran out of time or lost its client are dropped
at that moment, so the model never computes them. The forward pass runs on a dedicated
thread so the replica's event loop keeps accepting and batching while the model works.
That machinery is shared with the reranker (`batched_replica.BatchedReplica`, running the
lifecycle in `batched_jobs`); this class loads the model and plugs in `embed_task.EmbedTask`.
"""

from __future__ import annotations

import logging
from typing import Any

from deployments.backends.runtime_select import apply_runtime, settings_from
from deployments.backends.sentence_embedder import SentenceEmbedder
from deployments.backends.sources import resolve_model_source
from deployments.config import EmbeddingModelConfig
from deployments.core.protocol import EmbedJob, EmbedOutcome
from deployments.replicas.batched_replica import BatchedReplica
from deployments.replicas.device import assigned_device
from deployments.replicas.embed_task import EmbedTask

logger = logging.getLogger("ray.serve")

WARMUP_TEXTS = ["Tributary warms up.", "A longer sentence warms up the padded path too."]


class Embedder(BatchedReplica):
    def __init__(self, model: dict[str, Any]) -> None:
        config = EmbeddingModelConfig.model_validate(model)
        self.config = config
        device = self.device = assigned_device()
        threads = self._init_batching(config.torch_threads, config.batching)
        self._fence_memory(device, config)
        self.backend = SentenceEmbedder(resolve_model_source(config.source), device)
        # The backend (`runtime`), chosen on the model thread: `auto` measures there.
        self.runtime = self._executor.submit(
            apply_runtime, self.backend, device, settings_from(config, threads)
        ).result()
        self._run_passes(self.runtime["passes_in_flight"])
        self.task = EmbedTask(self.backend, config)
        # A real batch before the replica reports ready, so the first client does not
        # pay for lazy initialisation.
        warm = [self.backend.window.wrap(ids)[0] for ids in self.backend.tokenize(WARMUP_TEXTS)]
        self._executor.submit(self.backend.embed, warm).result()
        # Full-window rows: per padded token the costliest shape (attention grows with
        # the row's length), so the ceiling holds for any batch of that many tokens.
        window = self.backend.window
        (ids,) = self.backend.tokenize([WARMUP_TEXTS[1]])
        row = window.wrap(ids * (window.max_body // len(ids) + 1))[0]
        self._budget_memory(config, lambda rows: self.backend.embed([row] * rows), len(row))
        self._limit_memory(config)
        self._mark_warm()
        logger.info(
            "model %s ready on %s (%s), %d threads",
            config.name,
            device,
            self.runtime["runtime"],
            threads,
        )

    def model_config(self) -> dict[str, Any]:
        """What the ingress needs of a version served by an application of its own."""
        return {"task": "embedding", "config": self.config.model_dump(mode="json")}

    def info(self) -> dict[str, Any]:
        return {
            **self.batching_info(),
            "dimension": self.backend.dimension,
            "max_tokens": self.backend.window.max_tokens,
            "pooling": self.backend.pooling,
            "device": self.device,
            "runtime": self.runtime,
        }

    async def embed_jobs(
        self,
        priority: str,
        jobs: list[EmbedJob],
        time_left_s: list[float | None],
        spent_s: list[float] | None = None,
    ) -> list[EmbedOutcome]:
        return await self._run_call(priority, jobs, time_left_s, spent_s)
