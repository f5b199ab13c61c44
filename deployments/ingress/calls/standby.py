"""Which replicas of a generation model take calls, and which stand by.

A model with `standby_replicas` runs that many replicas more than it serves with
(config/generation.py). The serving ones are the first `serving` replicas by Serve's
replica id, so every router in every ingress process picks the same ones without talking
to each other; the rest take no calls. When a serving replica dies, Serve drops it from
the candidates, and the next by id (a standby) serves from the next call on, while Serve
starts a replacement, which stands by once it is up (or serves, if its id sorts first).
"""

from __future__ import annotations

from dataclasses import dataclass

from ray.serve.request_router import RunningReplica


@dataclass(frozen=True)
class ReplicaRoles:
    serving: list[RunningReplica]
    standing_by: list[RunningReplica]


def replica_roles(candidates: list[RunningReplica], serving: int | None) -> ReplicaRoles:
    """`serving`: how many replicas take calls; None: all of them."""
    if serving is None or len(candidates) <= serving:
        return ReplicaRoles(list(candidates), [])
    ordered = sorted(candidates, key=lambda replica: replica.replica_id.unique_id)
    return ReplicaRoles(ordered[:serving], ordered[serving:])


class StandbyCounts:
    """What the routers of this process last saw, per deployment: replicas serving,
    standing by, and passed over as silent (silent_replicas.py), for /v1/stats."""

    def __init__(self) -> None:
        self._by_deployment: dict[str, tuple[int, int, int]] = {}

    def saw(self, deployment: str, roles: ReplicaRoles, passed_over: int = 0) -> None:
        self._by_deployment[deployment] = (
            len(roles.serving),
            len(roles.standing_by),
            passed_over,
        )

    def of(self, deployment: str) -> dict[str, int] | None:
        seen = self._by_deployment.get(deployment)
        if seen is None:
            return None
        return {"serving": seen[0], "standing_by": seen[1], "passed_over": seen[2]}


STANDBY_COUNTS = StandbyCounts()
