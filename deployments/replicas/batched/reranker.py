"""The reranker deployment: query-document pairs from every concurrent request, batched.

The same per-class batching, priority gate and drops as the embedder (the `batcher.Batcher`
it holds); its plug-in `rerank_task.RerankTask` makes query-chunk pair items and scores them
with the backend's `score`: a cross-encoder's logit or a bi-encoder's cosine per pair.
"""

from __future__ import annotations

import logging
from typing import Any

from deployments.backends.encoders.bi_encoder import BiEncoderScorer
from deployments.backends.encoders.cross_encoder import CrossEncoderScorer
from deployments.backends.encoders.pair_scorer import PairScorer
from deployments.backends.encoders.sentence_embedder import SentenceEmbedder
from deployments.backends.runtimes.lane import routed_lane
from deployments.backends.runtimes.select import apply_runtime, settings_from
from deployments.backends.sources import resolve_model_source
from deployments.config import RerankModelConfig
from deployments.core.protocol import JobCall, RerankJob, RerankOutcome, RerankResult
from deployments.replicas.batched.batcher import Batcher
from deployments.replicas.batched.model_threads import ModelThreads
from deployments.replicas.batched.rerank_task import RerankTask
from deployments.replicas.device import assigned_device
from deployments.replicas.device_memory import DeviceMemory
from deployments.replicas.memory import apply_memory_fence

logger = logging.getLogger("ray.serve")

WARMUP = RerankJob("Tributary warms up?", ["It does.", "A longer document warms the padded path."])


def load_scorer(
    config: RerankModelConfig, device: str, threads: int = 1
) -> tuple[PairScorer, dict[str, Any]]:
    """The scorer on the runtime `config.runtime` names (or `auto` picks), and the report
    of that choice. Call it on the model thread: `auto` measures there."""
    source = resolve_model_source(config.source)
    settings = settings_from(config, threads)
    if config.backend == "cross-encoder":
        scorer = CrossEncoderScorer(source, device)
        return scorer, apply_runtime(scorer, device, settings, score_kind="score")
    embedder = SentenceEmbedder(source, device)
    return BiEncoderScorer(embedder), apply_runtime(embedder, device, settings)


def _runnable(scorer: PairScorer) -> object:
    """What holds the forward pass: a bi-encoder's embedder, or the cross-encoder itself."""
    return scorer.embedder if isinstance(scorer, BiEncoderScorer) else scorer


class Reranker:
    def __init__(self, model: dict[str, Any]) -> None:
        config = RerankModelConfig.model_validate(model)
        self.config = config
        device = self.device = assigned_device()
        threads = ModelThreads(config.torch_threads)
        fence = apply_memory_fence(device, config.gpu_memory_fraction)  # before the model
        self.backend, self.runtime = threads.call(
            load_scorer, config, device, threads.torch_threads
        )
        threads.spread(self.runtime["passes_in_flight"])
        lane = routed_lane(getattr(_runnable(self.backend), "forward", None))
        if lane is not None:
            threads.open_lane(lane.threads, lane.enter_lane)
        self.batcher: Batcher[RerankJob, RerankResult] = Batcher(
            config, RerankTask(self.backend, config), threads, DeviceMemory(device), fence
        )
        # A real batch before the replica reports ready.
        query, *docs = self.backend.tokenize([WARMUP.query, *WARMUP.documents])
        threads.call(self.backend.score, [(query, doc) for doc in docs])
        # Pairs that fill the window: the costliest shape per padded token.
        body = docs[-1] * (self.backend.max_tokens // len(docs[-1]) + 1)
        pair = (query, body[: self.backend.doc_room(len(query))])
        self.batcher.finish_warm_up(
            lambda rows: self.backend.score([pair] * rows),
            self.backend.pair_tokens(len(pair[0]), len(pair[1])),
        )
        if self.backend.max_tokens != config.window_tokens:
            # Only the ingress's estimate suffers: this replica counts with the real window.
            logger.warning(
                "reranker %s: window_tokens is %d but the model's window is %d tokens; set "
                "window_tokens: %d so the ingress estimates chunk passes right",
                config.name,
                config.window_tokens,
                self.backend.max_tokens,
                self.backend.max_tokens,
            )
        logger.info(
            "reranker %s (%s) ready on %s (%s), %d threads",
            config.name,
            config.backend,
            device,
            self.runtime["runtime"],
            threads.torch_threads,
        )

    async def __call__(self, call: JobCall[RerankJob]) -> list[RerankOutcome]:
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
        return {"task": "rerank", "config": self.config.model_dump(mode="json")}

    def info(self) -> dict[str, Any]:
        return {
            **self.batcher.info(),
            "backend": self.config.backend,
            "max_tokens": self.backend.max_tokens,
            "device": self.device,
            "runtime": self.runtime,
        }
