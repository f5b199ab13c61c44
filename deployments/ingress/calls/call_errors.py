"""What a failed handle call to a model replica answers over HTTP, for every task."""

from __future__ import annotations

from ray.exceptions import RayActorError
from ray.serve.exceptions import (
    BackPressureError,
    DeploymentUnavailableError,
    ReplicaUnavailableError,
)

from deployments.core.priority import Priority
from deployments.errors import NotReady, Overloaded, TributaryError

# Serve's own back-pressure, and a replica that is gone or not yet there.
RAY_CALL_ERRORS = (
    BackPressureError,
    RayActorError,
    DeploymentUnavailableError,
    ReplicaUnavailableError,
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
