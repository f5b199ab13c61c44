"""Shadow traffic: a share of a model's requests also goes to a candidate version, whose
answer is compared with the primary's and then discarded.

A copy never delays its client: it is sent only once the client's own answer is in hand,
at the batch class (so the candidate's queues shed it first under load), and at most
`max_in_flight` copies per model are out at once; beyond that a copy is dropped and
counted. Agreement goes to the metrics, to /v1/stats and to the canary guard.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from deployments.core.metrics.metrics import TributaryMetrics
from deployments.core.priority import Priority
from deployments.core.protocol import EmbedResult, GenerationJob, Rejection, RerankResult
from deployments.core.rollout.agreement import (
    embedding_agreement,
    exact_match,
    rank_correlation,
    top1_agreement,
)
from deployments.errors import Overloaded
from deployments.ingress.calls.generation_call import GenerationCall
from deployments.ingress.rollout.versions import ModelVersions, Version
from deployments.ingress.tasks.generation import collect

logger = logging.getLogger("ray.serve")

# A shadow copy's deadline: it rides at the batch class and nobody waits for it.
SHADOW_TIMEOUT_S = 60.0

RunCopy = Callable[[Version], Awaitable[Any]]  # sends the copy, returns its outcome
Compare = Callable[[Any, Any], dict[str, float]]  # (primary, shadow) -> agreement by measure


@dataclass
class ShadowTally:
    compared: int = 0
    dropped: int = 0
    failed: int = 0
    sums: dict[str, float] = field(default_factory=dict)
    lowest: dict[str, float] = field(default_factory=dict)

    def add(self, agreements: dict[str, float]) -> None:
        self.compared += 1
        for measure, value in agreements.items():
            self.sums[measure] = self.sums.get(measure, 0.0) + value
            self.lowest[measure] = min(self.lowest.get(measure, value), value)

    def view(self) -> dict[str, Any]:
        means = {m: round(total / self.compared, 6) for m, total in self.sums.items()}
        lowest = {m: round(value, 6) for m, value in self.lowest.items()}
        return {
            "compared": self.compared,
            "dropped": self.dropped,
            "failed": self.failed,
            "mean_agreement": means,
            "lowest_agreement": lowest,
        }


class ShadowCopies:
    def __init__(self, metrics: TributaryMetrics, rng: random.Random | None = None) -> None:
        self.metrics = metrics
        self._rng = rng or random.Random()
        self._tasks: set[asyncio.Task[None]] = set()
        self.tallies: dict[tuple[str, str], ShadowTally] = {}

    def maybe_send(
        self,
        table: ModelVersions,
        chosen: Version,
        primary: Any,
        primary_latency_s: float,
        run: RunCopy,
        compare: Compare,
    ) -> bool:
        """Sends a copy when the policy draws this request; True if one went out."""
        policy = table.policy.shadow
        if policy is None or policy.version == chosen.label:
            return False
        target = table.versions.get(policy.version)
        if target is None or not target.ready or self._rng.random() >= policy.fraction:
            return False
        tally = self.tallies.setdefault((table.name, target.label), ShadowTally())
        if table.shadow_in_flight >= policy.max_in_flight:
            tally.dropped += 1
            self.metrics.shadow_not_compared(table.name, target.label, "dropped")
            return False
        table.shadow_in_flight += 1
        task = asyncio.get_running_loop().create_task(
            self._copy(table, target, primary, primary_latency_s, run, compare, tally)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _copy(
        self,
        table: ModelVersions,
        target: Version,
        primary: Any,
        primary_latency_s: float,
        run: RunCopy,
        compare: Compare,
        tally: ShadowTally,
    ) -> None:
        started = time.monotonic()
        try:
            shadow = await run(target)
            if isinstance(shadow, Rejection):
                raise RuntimeError(f"refused: {shadow.status} {shadow.code}")
        except Exception as exc:
            # Refused under load (the batch class is shed first) or failed: either way
            # nothing to compare, and the client never knew.
            result = "dropped" if isinstance(exc, Overloaded) else "failed"
            if result == "dropped":
                tally.dropped += 1
            else:
                tally.failed += 1
            self.metrics.shadow_not_compared(table.name, target.label, result)
            logger.info("shadow copy to %s@%s %s: %r", table.name, target.label, result, exc)
            return
        finally:
            table.shadow_in_flight -= 1
        latency_ratio = (time.monotonic() - started) / max(primary_latency_s, 1e-6)
        try:
            agreements = compare(primary, shadow)
        except Exception as exc:  # answers of another shape: counted, never raised
            tally.failed += 1
            self.metrics.shadow_not_compared(table.name, target.label, "failed")
            logger.warning(
                "shadow answer of %s@%s not comparable: %r", table.name, target.label, exc
            )
            return
        tally.add(agreements)
        self.metrics.shadow_compared(table.name, target.label, agreements, latency_ratio)
        if table.guard is not None and agreements:
            # The guard judges on the task's first measure (cosine, top-1, exact match).
            trip = table.guard.record_agreement(target.label, next(iter(agreements.values())))
            if trip is not None:
                self.metrics.canary_tripped(table.name, trip.version, trip.reason)
                logger.warning(
                    "model %s: canary %s stopped: %s", table.name, trip.version, trip.detail
                )

    def send_generation(
        self,
        table: ModelVersions,
        version: Version,
        job: GenerationJob,
        text: str,
        latency_s: float,
    ) -> None:
        """A generation copy: compared by exact match when the request was greedy (a
        sampled answer may differ for no fault of the candidate), timed either way."""
        greedy = job.temperature == 0

        async def run(target: Version) -> str:
            assert target.watch is not None
            copy = GenerationCall(
                table.name, target.handle, Priority.BATCH, SHADOW_TIMEOUT_S, target.watch
            )
            first = await copy.start(job)
            return (await collect(copy, first))[0]

        def compare(primary: str, shadow: str) -> dict[str, float]:
            return {"exact_match": exact_match(primary, shadow)} if greedy else {}

        self.maybe_send(table, version, text, latency_s, run, compare)

    def view(self, model: str) -> dict[str, Any]:
        return {
            version: tally.view()
            for (name, version), tally in self.tallies.items()
            if name == model
        }


def compare_embeddings(primary: EmbedResult, shadow: EmbedResult) -> dict[str, float]:
    return {"cosine": embedding_agreement(primary.vectors, shadow.vectors)}


def compare_rerank(primary: RerankResult, shadow: RerankResult) -> dict[str, float]:
    a, b = list(primary.raw), list(shadow.raw)
    return {"top1": top1_agreement(a, b), "rank_correlation": rank_correlation(a, b)}
