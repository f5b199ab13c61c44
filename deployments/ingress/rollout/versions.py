"""Per model name: its versions, where each is served, and the traffic policy over them.

A version is served either by this application (listed in its args) or by an application
of its own (`deployments.app:build_model_app`), named in the ingress's traffic policy. The
latter is reached through Serve once that application answers; until then it takes no
traffic (its weight goes to the others) and a request pinned to it gets a 503.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from deployments.config import ModelConfig
from deployments.config.traffic import ModelTraffic
from deployments.core.metrics.metrics import TributaryMetrics
from deployments.core.protocol import BatchedJob, BatchedOutcome, GenerationHandle
from deployments.core.rollout.rollout_guard import GuardRules, RolloutGuard, Trip
from deployments.core.rollout.traffic import choose_version, first_key
from deployments.errors import ModelNotFound, NotReady, TributaryError
from deployments.ingress.calls.model_client import ModelClient
from deployments.ingress.calls.replica_watch import ReplicaWatch

logger = logging.getLogger("ray.serve")


@dataclass
class Version:
    label: str
    app: str | None  # None: this application's args; else the application serving it
    config: ModelConfig | None = None  # None until an application of its own answers
    client: ModelClient[BatchedJob, BatchedOutcome] | None = None  # embed / rerank
    handle: GenerationHandle | None = None  # generation
    watch: ReplicaWatch | None = None  # generation

    @property
    def ready(self) -> bool:
        return self.config is not None

    @property
    def serving(self) -> ModelConfig:
        """The config this version serves; only a ready version is ever chosen."""
        if self.config is None:
            raise NotReady(f"Version '{self.label}' is not serving yet.")
        return self.config


@dataclass
class ModelVersions:
    name: str
    task: str | None  # embedding, rerank, generation; None until a version says
    versions: dict[str, Version] = field(default_factory=dict)  # args order, then policy's
    policy: ModelTraffic = field(default_factory=ModelTraffic)
    guard: RolloutGuard | None = None
    shadow_in_flight: int = 0

    @property
    def base(self) -> ModelConfig | None:
        """The config requests are validated against: the first version that has one."""
        return next((v.config for v in self.versions.values() if v.ready), None)

    def weights(self) -> list[tuple[str, float]]:
        """Each version's share of new requests now: the policy's, 0 for a version not yet
        reached or stopped by the guard. No weights in the policy: the first version."""
        tripped = self.guard.tripped if self.guard is not None else {}
        shares: list[tuple[str, float]] = []
        for index, version in enumerate(self.versions.values()):
            if self.policy.weights:
                weight = self.policy.weights.get(version.label, 0.0)
            else:
                weight = 1.0 if index == 0 else 0.0
            usable = version.ready and version.label not in tripped
            shares.append((version.label, weight if usable else 0.0))
        if sum(w for _, w in shares) <= 0:
            # Nothing has weight: the first version that can answer serves, so a canary
            # stopped by the guard or an unreachable one never leaves the model unserved.
            ready = [label for label, _ in shares if self.versions[label].ready]
            return (
                [(label, 1.0 if label == ready[0] else 0.0) for label, _ in shares]
                if ready
                else shares
            )
        return shares

    def choose(self, pin: str | None, keys: dict[str, str | None]) -> Version:
        if pin is not None:
            version = self.versions.get(pin)
            if version is None:
                raise ModelNotFound(
                    f"Model '{self.name}' has no version '{pin}'; GET /v1/models lists them.",
                    param="model",
                    code="model_version_not_found",
                )
            if not version.ready:
                raise NotReady(f"Version '{pin}' of model '{self.name}' is not reachable yet.")
            return version
        label = choose_version(self.name, self.weights(), first_key(keys, self.policy.sticky_by))
        version = self.versions[label]
        if not version.ready:
            raise NotReady(f"Model '{self.name}' has no version that can answer yet.")
        return version

    @property
    def primary(self) -> str:
        """The version a canary is judged against: the one with the largest weight."""
        weights = self.policy.weights
        labels = list(self.versions)
        if not weights:
            return labels[0]
        return max(labels, key=lambda label: (weights.get(label, 0.0), -labels.index(label)))

    def apply(self, policy: ModelTraffic) -> None:
        """Takes a new policy; a trip stands unless the guard's `rearm` changed."""
        old = self.policy.guard
        self.policy = policy
        rules = policy.guard
        if rules is None:
            self.guard = None
            return
        tripped = dict(self.guard.tripped) if self.guard is not None else {}
        if old is not None and old.rearm != rules.rearm:
            if tripped:
                logger.warning(
                    "model %s: canary guard re-armed; %s restored", self.name, sorted(tripped)
                )
            tripped = {}
        self.guard = RolloutGuard(
            GuardRules(
                window_s=rules.window_s,
                min_requests=rules.min_requests,
                max_error_rate_increase=rules.max_error_rate_increase,
                max_p99_ratio=rules.max_p99_ratio,
                min_agreement=rules.min_agreement,
            ),
            self.primary,
        )
        self.guard.tripped.update(tripped)

    def record(self, label: str, ok: bool, latency_s: float) -> Trip | None:
        if self.guard is None:
            return None
        return self.guard.record(label, ok, latency_s)

    @contextlib.contextmanager
    def judged(
        self, version: Version, metrics: TributaryMetrics, started: float | None = None
    ) -> Iterator[None]:
        """Tells the canary guard how the version answered: a server-side failure (5xx)
        counts against it, a client's own mistake (4xx) does not."""
        began = time.monotonic() if started is None else started
        try:
            yield
        except TributaryError as exc:
            if exc.status >= 500:
                self._answered(version, False, time.monotonic() - began, metrics)
            raise
        except Exception:
            self._answered(version, False, time.monotonic() - began, metrics)
            raise
        self._answered(version, True, time.monotonic() - began, metrics)

    def _answered(
        self, version: Version, ok: bool, seconds: float, metrics: TributaryMetrics
    ) -> None:
        trip = self.record(version.label, ok, seconds)
        if trip is not None:
            logger.warning("model %s: canary %s stopped: %s", self.name, trip.version, trip.detail)
            metrics.canary_tripped(self.name, trip.version, trip.reason)
            for label, share in self.shares().items():
                metrics.traffic_weight(self.name, label, share)

    def shares(self) -> dict[str, float]:
        """Each version's share of new requests now, summing to 1."""
        weights = dict(self.weights())
        total = sum(weights.values()) or 1.0
        return {label: weight / total for label, weight in weights.items()}

    def describe(self) -> list[dict[str, Any]]:
        """Each version for /v1/models and /v1/stats."""
        weights = dict(self.weights())
        total = sum(weights.values()) or 1.0
        tripped = self.guard.tripped if self.guard is not None else {}
        return [
            {
                "version": version.label,
                "served_by": version.app or "this application",
                "state": "tripped"
                if version.label in tripped
                else ("ready" if version.ready else "unreachable"),
                "share": round(weights.get(version.label, 0.0) / total, 4),
            }
            for version in self.versions.values()
        ]
