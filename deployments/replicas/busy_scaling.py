"""The autoscaling policy of the encoder deployments: the busier of two signals.

Serve's default policy sizes a deployment by the calls waiting at it (ongoing requests
over `target_ongoing_requests`). With admission by predicted wait, the ingress keeps that
queue to what the replicas can answer within their targets and refuses the rest, so the
queue never grows enough to ask for a replica. Each encoder replica therefore reports the
share of its time its forward passes took (`record_autoscaling_stats`), and this policy
asks for as many replicas as that work needs at `target_busy_share` each, or as many as
the queue asks for, whichever is more.

Serve pickles this module by value into its controller, which cannot import the project:
it may import only the standard library and Ray.
"""

from __future__ import annotations

from typing import Any

from ray.serve.autoscaling_policy import replica_queue_length_autoscaling_policy
from ray.serve.config import AutoscalingContext

BUSY_METRIC = "tributary_busy_share"


class BusyOrQueuePolicy:
    def __init__(self, target_busy_share: float = 0.7) -> None:
        self.target_busy_share = target_busy_share

    def __call__(self, ctx: AutoscalingContext) -> tuple[float, dict[str, Any]]:
        by_queue, state = replica_queue_length_autoscaling_policy(ctx)
        shares = (ctx.aggregated_metrics or {}).get(BUSY_METRIC, {})
        if not shares or ctx.current_num_replicas == 0:
            return by_queue, state
        # Replicas that have not reported yet (just started) count as busy as the rest.
        mean = sum(shares.values()) / len(shares)
        by_busy = mean * ctx.current_num_replicas / self.target_busy_share
        return max(by_queue, by_busy), state
