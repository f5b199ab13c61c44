"""`GET /healthz`: is every deployment able to serve?

Ready means every deployment of every application has at least one running replica
(a model replica only runs once it has loaded and warmed up) and none is failing.
A deployment that is scaling up or down, or rolling out an update, with replicas
already running, still serves: with autoscaling on, answering 503 then would make a
load balancer drop a healthy server whenever load changed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger("ray.serve")

SERVING_STATUSES = frozenset({"HEALTHY", "UPSCALING", "DOWNSCALING", "UPDATING"})


def readiness_problem(deployments: Mapping[str, Any]) -> str | None:
    """`deployments`: "app/name" -> an object with `status` and `replica_states`
    (Serve's DeploymentStatusOverview). None when all can serve, else why not."""
    for name, deployment in deployments.items():
        status = str(getattr(deployment.status, "value", deployment.status))
        running = deployment.replica_states.get("RUNNING", 0)
        if status not in SERVING_STATUSES:
            return f"Deployment {name} is {status}."
        if not running:
            return f"Deployment {name} has no running replica yet ({status})."
        if status == "HEALTHY":
            starting = {
                state: count
                for state, count in deployment.replica_states.items()
                if state != "RUNNING" and count
            }
            if starting:
                return f"Deployment {name} has replicas {starting}."
    return None


async def serve_readiness() -> str | None:
    from ray import serve

    try:
        status = await asyncio.to_thread(serve.status)
    except Exception:
        logger.exception("could not read Serve's status")
        return "Serve's status is unavailable."
    return readiness_problem(
        {
            f"{app_name}/{name}": deployment
            for app_name, app in status.applications.items()
            for name, deployment in app.deployments.items()
        }
    )
