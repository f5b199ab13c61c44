"""A handle call lost to the infrastructure answers 503 with Retry-After, never a 500."""

from __future__ import annotations

import pytest
from ray.exceptions import NodeDiedError, ObjectLostError, RayActorError, WorkerCrashedError
from ray.serve.exceptions import BackPressureError, RequestCancelledError

from deployments.core.priority import Priority
from deployments.errors import NotReady, Overloaded
from deployments.ingress.calls.call_errors import RAY_CALL_ERRORS, ray_call_error


@pytest.mark.parametrize(
    "lost",
    [
        RayActorError(),
        NodeDiedError("node 1 died"),
        WorkerCrashedError(),
        ObjectLostError("00" * 28, "owner", "call site"),
        RequestCancelledError("req-1"),  # a replica shut down past its graceful timeout
    ],
)
def test_a_call_lost_with_its_node_or_worker_is_a_503_to_retry(lost: Exception) -> None:
    assert isinstance(lost, RAY_CALL_ERRORS)
    answer = ray_call_error("minilm", Priority.NORMAL, lost)
    assert isinstance(answer, NotReady)
    assert answer.status == 503 and answer.retry_after_s is not None
    assert "minilm" in answer.message and "Traceback" not in answer.message


def test_serves_back_pressure_is_a_full_queue() -> None:
    normal = ray_call_error(
        "minilm", Priority.NORMAL, BackPressureError(num_queued_requests=9, max_queued_requests=8)
    )
    realtime = ray_call_error(
        "minilm", Priority.REALTIME, BackPressureError(num_queued_requests=9, max_queued_requests=8)
    )
    assert isinstance(normal, Overloaded) and (normal.status, realtime.status) == (429, 503)
