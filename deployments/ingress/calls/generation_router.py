"""Serve's request router for every generation deployment (set in app.py).

Three jobs beyond Serve's default choice (the less busy of two random replicas, preferring
the caller's node): a stop note goes to the replica that runs the generation it names
(stop_note_router.py), the standby replicas take no calls while enough others are up
(standby.py), and a replica that left the replica watch's question unanswered is passed
over while another runs (silent_replicas.py).

Each routing task here is matched to its own request (no FIFO mixin): with FIFO matching, a
replica chosen for a note could be handed to an older request in the queue instead.

Serve pickles this module by value (RequestRouterConfig), so in the ingress the routers'
class sees a copy of the names this module holds, not the module itself: a record named
here would be filled in the copy while /v1/stats reads the module's own, never written.
The shared records are reached through their modules, which pickle by reference.
"""

from __future__ import annotations

import random
from typing import Any

from ray.serve.request_router import (
    LocalityMixin,
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from deployments.ingress.calls import silent_replicas, standby, stop_note_router

ENGINE_ALIVE = "engine_alive"  # engine_alive(probe_key): the replica watch's question


class GenerationRouter(LocalityMixin, RequestRouter):
    _serving_replicas: int | None = None  # None: every replica serves

    def initialize_state(self, serving_replicas: int | None = None, **_: Any) -> None:
        self._serving_replicas = serving_replicas

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        silent = silent_replicas.SILENT
        there = stop_note_router.replica_for_note(
            candidate_replicas, pending_request, stop_note_router.RUNS
        )
        # Not to a replica passed over: Serve's router spun on the event loop, without
        # yielding, for as long as a stopped replica's queue length stayed cached (10 s).
        if there is not None and not silent.passed_over(there.replica_id):
            return _only(there, pending_request)
        live = silent.live(candidate_replicas)
        roles = standby.replica_roles(live, self._serving_replicas)
        standby.STANDBY_COUNTS.saw(
            self._deployment_id.name, roles, len(candidate_replicas) - len(live)
        )
        question = _probe_key(pending_request)
        if question is not None and roles.serving:
            # One replica, so that a question left unanswered names the one that hangs.
            asked = random.choice(roles.serving)
            full = not self.select_available_replicas([asked])
            silent.asked(question, asked, candidate_replicas, full)
            return _only(asked, pending_request)
        near = list(self.apply_locality_routing(pending_request=pending_request))
        if len(roles.serving) < len(candidate_replicas):
            serving = {replica.replica_id for replica in roles.serving}
            near = [replica_id for replica_id in near if replica_id in serving] or list(serving)
        if not near:
            return []
        picked = random.sample(near, min(2, len(near)))
        return [[self.curr_replicas[replica_id] for replica_id in picked]]

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any
    ) -> None:
        super().on_request_routed(pending_request, replica_id, result)
        key = stop_note_router.stop_key_of(pending_request, stop_note_router.GENERATE)
        if key is not None:
            stop_note_router.RUNS.ran(key, replica_id, pending_request.metadata.internal_request_id)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        super().on_request_completed(replica_id, internal_request_id)
        stop_note_router.RUNS.ended(internal_request_id)


def _only(replica: RunningReplica, request: PendingRequest | None) -> list[list[RunningReplica]]:
    """`replica` alone. Serve retries a choice it could not place (the replica full, or not
    saying its queue length) at once, with no pause, until the request's routing context
    says to back off; its locality mixin says so after the first try, and so does this:
    a note or a question for a full replica would otherwise spin the caller's loop."""
    if request is not None:
        request.routing_context.should_backoff = True
    return [[replica]]


def _probe_key(request: PendingRequest | None) -> str | None:
    if request is None or request.metadata.call_method != ENGINE_ALIVE:
        return None
    key: Any = request.args[0] if request.args else request.kwargs.get("probe_key")
    return key if isinstance(key, str) else None
