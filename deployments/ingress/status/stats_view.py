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
            **device_turns(replica, p.label),
        }
        for p in ALL_PRIORITIES
    }


def device_turns(replica: dict[str, Any], label: str) -> dict[str, Any]:
    """The class's turns at the device the model shares with other models, since the
    replica started (replicas/device_turns.py): None where the arbiter is off."""
    turns = replica.get("device_turns")
    if not turns:
        return {"device_turns": None, "device_wait_ms": None, "device_held_s": None}
    figures = turns.get("by_class", {}).get(label, {})
    count = figures.get("turns", 0)
    return {
        "device_turns": count,
        "device_wait_ms": round(1e3 * figures.get("wait_s", 0.0) / count, 3) if count else None,
        "device_held_s": round(figures.get("held_s", 0.0), 3),
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
            **device_turns(replica, p.label),
        }
        for p in ALL_PRIORITIES
    }
