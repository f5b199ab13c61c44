"""Routes a generation's stop note to the replica that runs the generation.

A client that leaves a generation makes the ingress send `stop_sequence(stop_key)` to the
model (ingress/calls/generation_call.py). Serve routes each handle call on its own, so with two
or more replicas the note went to any of them: to the wrong one half the time with two,
which answered that it had no such run, and the ingress then cancelled the stream instead
(a cancelled call leaks in gRPC, calls/stream_reads.py) while the sequence ran on to its
`max_tokens`. The generation router (generation_router.py) remembers here, in the calling
process, which replica accepted each `generate` call, by the call's stop key, and sends
that key's note there.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RunningReplica

GENERATE = "generate"
STOP_SEQUENCE = "stop_sequence"
# generate(priority, job, time_left_s, stop_key); stop_sequence(stop_key)
STOP_KEY_ARGUMENT = {GENERATE: 3, STOP_SEQUENCE: 0}
# Runs remembered per process; one that outlives this many newer runs (or whose call never
# completes) is forgotten, and its note goes wherever Serve would send it.
REMEMBERED_RUNS = 65_536


class RunsByStopKey:
    """Which replica runs each live generation, by its stop key; bounded."""

    def __init__(self, limit: int = REMEMBERED_RUNS) -> None:
        self._limit = limit
        self._replicas: OrderedDict[str, ReplicaID] = OrderedDict()
        # Serve's internal request id -> stop key, oldest first
        self._keys: OrderedDict[str, str] = OrderedDict()

    def ran(self, stop_key: str, replica_id: ReplicaID, request_id: str) -> None:
        self._replicas[stop_key] = replica_id
        self._replicas.move_to_end(stop_key)
        self._keys[request_id] = stop_key
        while len(self._replicas) > self._limit:
            self._replicas.popitem(last=False)
        while len(self._keys) > self._limit:  # ids of calls whose completion never came
            self._keys.popitem(last=False)

    def replica_of(self, stop_key: str) -> ReplicaID | None:
        return self._replicas.get(stop_key)

    def ended(self, request_id: str) -> None:
        stop_key = self._keys.pop(request_id, None)
        if stop_key is not None:
            self._replicas.pop(stop_key, None)

    def __len__(self) -> int:
        return len(self._replicas)


# One per process: a generate call and its note may go through different handles (the
# streaming options make a handle of their own), and stop keys are unique (uuid4).
RUNS = RunsByStopKey()


def stop_key_of(request: PendingRequest, method: str) -> str | None:
    """The stop key a call to `method` carries, or None for a call to another method."""
    if request.metadata.call_method != method:
        return None
    index = STOP_KEY_ARGUMENT[method]
    key: Any = request.args[index] if len(request.args) > index else None
    if key is None:
        key = request.kwargs.get("stop_key")
    return key if isinstance(key, str) else None


def replica_for_note(
    candidates: list[RunningReplica], request: PendingRequest | None, runs: RunsByStopKey
) -> RunningReplica | None:
    """The replica that runs the generation a stop note names, if it is still a candidate."""
    key = None if request is None else stop_key_of(request, STOP_SEQUENCE)
    runs_on = None if key is None else runs.replica_of(key)
    if runs_on is None:
        return None
    return next((r for r in candidates if r.replica_id == runs_on), None)
