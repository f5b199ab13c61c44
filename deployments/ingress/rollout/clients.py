"""How the ingress reaches one model version: a coalescing client for a batched task, a
watched streaming handle for generation."""

from __future__ import annotations

from typing import cast

from deployments.config.app import IngressConfig
from deployments.core.metrics.metrics import TributaryMetrics
from deployments.core.priority import Priority
from deployments.core.protocol import (
    BatchedHandle,
    BatchedJob,
    BatchedOutcome,
    GenerationHandle,
    ModelHandle,
)
from deployments.ingress.calls.model_client import ModelClient
from deployments.ingress.calls.replica_watch import ReplicaWatch
from deployments.ingress.rollout.versions import Version


def version_key(name: str, version: str) -> str:
    """How build_app names a version's handle to the ingress."""
    return f"{name}@{version}"


def attach(
    version: Version,
    task: str,
    handle: ModelHandle,
    settings: IngressConfig,
    metrics: TributaryMetrics,
) -> None:
    """Gives `version` what the pipeline calls it through. The task, said by the config or
    by the version's own app, tells the handle's kind."""
    name = version.config.name if version.config is not None else "model"
    if task == "generation":
        generator = cast(GenerationHandle, handle)
        version.handle = generator
        version.watch = replica_watch_for(name, version, generator)
        return
    batching = getattr(version.config, "batching", None)
    version.client = ModelClient(
        name,
        cast(BatchedHandle[BatchedJob, BatchedOutcome], handle),
        settings.admission,
        settings.max_group_items,
        metrics=metrics,
        model_targets_ms=None
        if batching is None
        else {p: batching.of(p.label).target_p99_ms for p in Priority},
        window_tokens=getattr(version.config, "window_tokens", None),
    )


def replica_watch_for(name: str, version: Version, handle: GenerationHandle) -> ReplicaWatch:
    label = name if version.app is None else version_key(name, version.label)
    return ReplicaWatch(label, lambda key: handle.engine_alive.remote(key))
