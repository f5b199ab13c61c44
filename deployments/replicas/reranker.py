"""The reranker deployment: query-document pairs from every concurrent request, batched.

The same per-class batching, priority gate and drops as the embedder
(`batched_replica.BatchedReplica`); its plug-in `rerank_task.RerankTask` makes query-chunk
pair items and scores them with the backend's `score`: a cross-encoder's logit or a
bi-encoder's cosine per pair.
"""

from __future__ import annotations

import logging
from typing import Any

from deployments.backends.bi_encoder import BiEncoderScorer
from deployments.backends.cross_encoder import CrossEncoderScorer
from deployments.backends.pair_scorer import PairScorer
from deployments.backends.runtime_select import apply_runtime, settings_from
from deployments.backends.sentence_embedder import SentenceEmbedder
from deployments.backends.sources import resolve_model_source
from deployments.config import RerankModelConfig
from deployments.core.protocol import RerankJob, RerankOutcome
from deployments.replicas.batched_replica import BatchedReplica
from deployments.replicas.device import assigned_device
from deployments.replicas.rerank_task import RerankTask

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


class Reranker(BatchedReplica):
    def __init__(self, model: dict[str, Any]) -> None:
        config = RerankModelConfig.model_validate(model)
        self.config = config
        device = self.device = assigned_device()
        threads = self._init_batching(config.torch_threads, config.batching)
        self._fence_memory(device, config)
        self.backend, self.runtime = self._executor.submit(
            load_scorer, config, device, threads
        ).result()
        self._run_passes(self.runtime["passes_in_flight"])
        self.task = RerankTask(self.backend, config)
        # A real batch before the replica reports ready.
        query, *docs = self.backend.tokenize([WARMUP.query, *WARMUP.documents])
        self._executor.submit(self.backend.score, [(query, doc) for doc in docs]).result()
        # Pairs that fill the window: the costliest shape per padded token.
        body = docs[-1] * (self.backend.max_tokens // len(docs[-1]) + 1)
        pair = (query, body[: self.backend.doc_room(len(query))])
        self._budget_memory(
            config,
            lambda rows: self.backend.score([pair] * rows),
            self.backend.pair_tokens(len(pair[0]), len(pair[1])),
        )
        self._limit_memory(config)
        self._mark_warm()
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
            threads,
        )

    def model_config(self) -> dict[str, Any]:
        """What the ingress needs of a version served by an application of its own."""
        return {"task": "rerank", "config": self.config.model_dump(mode="json")}

    def info(self) -> dict[str, Any]:
        return {
            **self.batching_info(),
            "backend": self.config.backend,
            "max_tokens": self.backend.max_tokens,
            "device": self.device,
            "runtime": self.runtime,
        }

    async def rerank_jobs(
        self,
        priority: str,
        jobs: list[RerankJob],
        time_left_s: list[float | None],
        spent_s: list[float] | None = None,
    ) -> list[RerankOutcome]:
        return await self._run_call(priority, jobs, time_left_s, spent_s)
