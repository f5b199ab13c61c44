"""The per-class figures of `GET /v1/stats` (what the /status page shows), built from the
ingress's own queues and recent requests and from one model replica's counters."""

from __future__ import annotations

from typing import Any

from deployments.core.priority import ALL_PRIORITIES
from deployments.ingress.calls.observe import RequestObserver


def batching_classes(
    observer: RequestObserver, model: str, ingress: dict[str, Any], replica: dict[str, Any]
) -> dict[str, Any]:
    """An embedding or rerank model: inputs queued at this ingress, the replica's mean
    batch size, and this ingress replica's recent throughput and latency."""
    return {
        p.label: {
            "queued_items": ingress["classes"][p.label]["queued_items"],
            "mean_batch_size": round(
                replica.get("classes", {}).get(p.label, {}).get("mean_batch_size", 0.0), 2
            ),
            **observer.recent(model, p.label),
        }
        for p in ALL_PRIORITIES
    }


def generation_classes(
    observer: RequestObserver, model: str, replica: dict[str, Any]
) -> dict[str, Any]:
    """A generation model queues whole sequences in its replica, not inputs at the
    ingress, and has no batch of its own: sequences join and leave at every step."""
    waiting = replica.get("slots", {}).get("waiting", {})
    return {
        p.label: {
            "queued_items": waiting.get(p.label, 0),
            "mean_batch_size": None,
            **observer.recent(model, p.label),
        }
        for p in ALL_PRIORITIES
    }
