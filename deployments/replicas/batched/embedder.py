"""The embedding model deployment: items from every concurrent request, batched by class.

The ingress sends a list of jobs of one priority class (one job per HTTP request) in one
call. Each job's inputs become items that go through that class's own `@serve.batch`
queue, so a batch mixes items of many requests, capped by count and by padded tokens, with
the class's own wait. Before its forward pass a batch takes a turn at the priority gate:
the model runs one batch at a time, the most urgent waiting one first, with ageing so the
batch class always moves. Items whose job ran out of time or lost its client are dropped
at that moment, so the model never computes them. The forward pass runs on a dedicated
thread so the replica's event loop keeps accepting and batching while the model works.
That machinery is shared with the reranker: a `batcher.Batcher` each holds, running the
lifecycle in `batched_jobs`; this class loads the model and plugs in `embed_task.EmbedTask`.
The ingress reaches it through `core/protocol.py`'s `BatchedHandle`: `__call__` per call.
"""

from __future__ import annotations

import logging
from typing import Any

from deployments.backends.encoders.sentence_embedder import SentenceEmbedder
from deployments.backends.runtimes.lane import routed_lane
from deployments.backends.runtimes.select import apply_runtime, settings_from
from deployments.backends.sources import resolve_model_source
from deployments.config import EmbeddingModelConfig
from deployments.core.protocol import EmbedJob, EmbedOutcome, EmbedResult, JobCall
from deployments.replicas.batched.batcher import Batcher
from deployments.replicas.batched.embed_task import EmbedTask
from deployments.replicas.batched.model_threads import ModelThreads
from deployments.replicas.device import assigned_device
from deployments.replicas.device_memory import DeviceMemory
from deployments.replicas.memory import apply_memory_fence

logger = logging.getLogger("ray.serve")

WARMUP_TEXTS = ["Tributary warms up.", "A longer sentence warms up the padded path too."]


class Embedder:
    def __init__(self, model: dict[str, Any]) -> None:
        config = EmbeddingModelConfig.model_validate(model)
        self.config = config
        device = self.device = assigned_device()
        threads = ModelThreads(config.torch_threads)
        fence = apply_memory_fence(device, config.gpu_memory_fraction)  # before the model
        self.backend = SentenceEmbedder(resolve_model_source(config.source), device)
        # The backend (`runtime`), chosen on the model thread: `auto` measures there.
        self.runtime = threads.call(
            apply_runtime, self.backend, device, settings_from(config, threads.torch_threads)
        )
        threads.spread(self.runtime["passes_in_flight"])
        lane = routed_lane(self.backend.forward)
        if lane is not None:
            threads.open_lane(lane.threads, lane.enter_lane)
        self.batcher: Batcher[EmbedJob, EmbedResult] = Batcher(
            config, EmbedTask(self.backend, config), threads, DeviceMemory(device), fence
        )
        # A real batch before the replica reports ready, so the first client does not
        # pay for lazy initialisation.
        warm = [self.backend.window.wrap(ids)[0] for ids in self.backend.tokenize(WARMUP_TEXTS)]
        threads.call(self.backend.embed, warm)
        # Full-window rows: per padded token the costliest shape (attention grows with
        # the row's length), so the ceiling holds for any batch of that many tokens.
        window = self.backend.window
        (ids,) = self.backend.tokenize([WARMUP_TEXTS[1]])
        row = window.wrap(ids * (window.max_body // len(ids) + 1))[0]
        self.batcher.finish_warm_up(lambda rows: self.backend.embed([row] * rows), len(row))
        logger.info(
            "model %s ready on %s (%s), %d threads",
            config.name,
            device,
            self.runtime["runtime"],
            threads.torch_threads,
        )

    async def __call__(self, call: JobCall[EmbedJob]) -> list[EmbedOutcome]:
        """The one entry of the ingress's calls: `handle.remote(call)`."""
        return await self.batcher.run(call)

    def forget(self, job_ids: list[str]) -> int:
        return self.batcher.forget(job_ids)

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Serve's user_config: the batch limits, changed with no restart."""
        self.batcher.reconfigure(user_config)

    def check_health(self) -> None:
        self.batcher.check_health()

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's hook for custom autoscaling metrics: how busy the passes kept it."""
        return self.batcher.autoscaling_stats()

    def model_config(self) -> dict[str, Any]:
        """What the ingress needs of a version served by an application of its own."""
        return {"task": "embedding", "config": self.config.model_dump(mode="json")}

    def info(self) -> dict[str, Any]:
        return {
            **self.batcher.info(),
            "dimension": self.backend.dimension,
            "max_tokens": self.backend.window.max_tokens,
            "pooling": self.backend.pooling,
            "device": self.device,
            "runtime": self.runtime,
        }
