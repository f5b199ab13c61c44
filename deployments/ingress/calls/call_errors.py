"""What a failed handle call to a model replica answers over HTTP, for every task."""

from __future__ import annotations

from ray.exceptions import (
    LocalRayletDiedError,
    NodeDiedError,
    ObjectLostError,
    OutOfMemoryError,
    RayActorError,
    RaySystemError,
    RpcError,
    WorkerCrashedError,
)
from ray.serve.exceptions import (
    BackPressureError,
    DeploymentUnavailableError,
    ReplicaUnavailableError,
    RequestCancelledError,
)

from deployments.core.priority import Priority
from deployments.errors import NotReady, Overloaded, TributaryError

# Serve's own back-pressure, a replica that is gone or not yet there, and the ways Ray
# tells that the call was lost with a node, a worker or their results: every one is the
# infrastructure's, not the request's, so a retry may well succeed (a 503, never a 500).
# A cancelled request whose clients are still here is one a replica cancelled on its way
# out (shut down past its graceful timeout), so it belongs with them.
RAY_CALL_ERRORS = (
    BackPressureError,
    RayActorError,
    DeploymentUnavailableError,
    ReplicaUnavailableError,
    NodeDiedError,
    WorkerCrashedError,
    ObjectLostError,
    LocalRayletDiedError,
    OutOfMemoryError,
    RpcError,
    RaySystemError,
    RequestCancelledError,
)

# The call died with its replica (not refused by a live one): what a ReplicaWatch hears of.
REPLICA_GONE = (RayActorError, ReplicaUnavailableError)


def ray_call_error(model: str, priority: Priority, exc: BaseException) -> TributaryError:
    """The answer to one of RAY_CALL_ERRORS."""
    if isinstance(exc, BackPressureError):
        return Overloaded(
            f"The queue of model '{model}' is full; retry shortly.",
            retry_after_s=1,
            status=503 if priority is Priority.REALTIME else 429,
            code="queue_full",
        )
    return NotReady(f"Model '{model}' is restarting or unavailable; retry shortly.")
